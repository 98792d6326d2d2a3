"""A table's model built from the tabular deep-learning evidence of 2022-2025 (``model=tabular``;
``model=auto`` picks it for a table's rows):

- **numbers robustly scaled and smoothly clipped** (RealMLP; Holzmüller et al., "Better by
  default", NeurIPS 2024): each feature centred on its training median and divided by its
  interquartile range / 1.349 (a standard deviation, for a normal), then
  ``x / sqrt(1 + (x / 3)²)``, so that an outlier cannot dominate a layer; or
  (``robust_scaling=false``) as the data standardised them. ``auto`` (and ``embedding=auto``):
  under 1,000 training rows, where the two overfit, the standardised inputs clamped to the
  training range and no embedding; from there, robust and periodic (:func:`fitted_inputs`);
- **an embedding of each number** (Gorishniy et al., "On embeddings for numerical features",
  NeurIPS 2022): ``piecewise`` (the piecewise-linear encoding over ``bins`` bins between the
  training quantiles, then a linear layer and ReLU per feature), ``periodic`` (cos and sin
  of learned frequencies, then a shared linear layer and ReLU: "PLR lite"; the frequencies
  start from N(0, 0.01) under 8,000 training rows and from N(0, 3) from there), ``linear``
  (a linear layer and ReLU per feature) or ``none``; a table's 0/1 columns (its categories
  one-hot, its gap flags: the ``indicator_features`` after the numbers) are embedded too, or
  enter the MLP as they are, as the papers feed a category (``embed_indicators``: true,
  false, or auto: as they are once there are more than 64, where embedding them would make
  the input several times as wide and the run as much slower);
- **k members sharing one MLP** (TabM-mini; Gorishniy et al., ICLR 2025): each member scales
  the MLP's input by its own vector (random signs at the start) and has its own output layer;
  the k run as one batched forward. In training the model returns the members' outputs
  ``[N, k, outputs]`` and each member's loss counts (utils/tasks); in evaluation, their mean.
  The members share each training batch ``[N, F]`` (``share_batches: true``), or each trains
  on batches of its own (``false``, TabM's ``share_training_batches=False``): the data draws
  one order per member (data/batching/order.py) and a training batch holds ``[N, k, F]``
  rows, member m's in column m. Not the default: each member's rows are embedded apart (8
  members train 9.6 times slower than one on the benchmark's table of 64 numbers, 3.5 times
  when they share), for figures within a seed's move on most tables (docs/real-data.md).

Its preprocessing is fitted on the training split: the data supplies each feature's training
quantiles (``feature_quantiles``, in the model's input units), from which the median, the
interquartile range and the bins' edges are buffers of the model — a checkpoint and every
export carry them. Without them (a model rebuilt from a checkpoint) the buffers are
placeholders that the stored weights then fill.

    python train.py data=csv data.path=houses.csv data.target=price task=regression \\
        model=tabular model.embedding=periodic model.ensemble=8
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
from torch import nn

from utils.config.arguments import DROPOUT, POSITIVE_INT, POSITIVE_INTS, Rule, checked, one_of
from utils.errors import UserError

log = logging.getLogger("torchloom")
EMBEDDINGS = ("none", "linear", "periodic", "piecewise")
QUANTILE_LEVELS = 65  # the quantiles the data supplies: 0, 1/64, ..., 1
CLIP = 3.0  # smooth clipping's scale: x / sqrt(1 + (x / CLIP)²)
# Smooth clipping first bounds x here: past it the result is ±CLIP to float32's precision, and
# beyond about 5e19 (x / CLIP)² overflows to inf, which would map the value to 0, the median.
CLIP_BOUND = 1e6
STEP = 1e-3  # a piecewise bin narrower than this (in scaled units) is a step
# frequency_scale=auto: the periodic frequencies start near 0 (an almost linear embedding) on
# a table of fewer training rows than this, and spread wide from it (docs/real-data.md).
LARGE_TABLE_ROWS = 8_000
SMALL_TABLE_ROWS = 1_000  # embedding, robust_scaling=auto: under it none, and clamped inputs
SMALL_TABLE_SCALE, LARGE_TABLE_SCALE = 0.01, 3.0
# What model=auto builds for a table (conf/model/tabular.yaml holds the same, as keys).
TABLE_DEFAULTS = {
    "embedding": "auto",
    "d_embedding": 16,
    "bins": 16,
    "frequencies": 48,
    "frequency_scale": "auto",
    "ensemble": 8,
    "hidden_sizes": (512,),
    "dropout": 0.2,
    "robust_scaling": "auto",
}
# embed_indicators=auto: a table's 0/1 columns are embedded up to this many, and from one more
# enter the MLP as they are (hotel rates' 399: 7x faster at level MAE; docs/real-data.md).
PLAIN_INDICATORS_FROM = 65
# What the two builders take when a stored config does not say: a checkpoint written before the
# key existed embedded every column, and rebuilds so (conf/model/*.yaml: auto).
EMBED_INDICATORS_BEFORE = True
SHARE_BATCHES_BEFORE = True  # and its members shared each training batch (the default still)


@checked(
    "model",
    embedding=one_of("auto", *EMBEDDINGS),
    d_embedding=POSITIVE_INT,
    bins=Rule(lambda v: isinstance(v, int) and 2 <= v <= 64, "a whole number from 2 to 64"),
    frequencies=POSITIVE_INT,
    frequency_scale=Rule(
        lambda v: v == "auto" or (isinstance(v, int | float) and 0 < v <= 100),
        "auto or in (0, 100]",
    ),
    ensemble=POSITIVE_INT,
    hidden_sizes=POSITIVE_INTS,
    dropout=DROPOUT,
    robust_scaling=one_of(True, False, "auto"),
    embed_indicators=one_of(True, False, "auto"),
    share_batches=one_of(True, False),
)
def tabular(
    input_shape: Sequence[int],
    num_classes: int,
    embedding: str,
    d_embedding: int,
    bins: int,
    frequencies: int,
    frequency_scale: float | str,
    ensemble: int,
    hidden_sizes: Sequence[int],
    dropout: float,
    robust_scaling: bool | str = True,
    feature_quantiles: torch.Tensor | None = None,
    train_rows: int | None = None,
    embed_indicators: bool | str = EMBED_INDICATORS_BEFORE,
    indicator_features: int | None = None,
    share_batches: bool = SHARE_BATCHES_BEFORE,
) -> nn.Module:
    if len(input_shape) != 1:
        raise UserError(
            f"model=tabular takes a table's rows [F], and the data gives samples of shape "
            f"{list(input_shape)}; use model=auto"
        )
    features = input_shape[0]
    grid = fitted_grid(features, feature_quantiles)
    embedding, scaling = fitted_inputs(embedding, robust_scaling, train_rows)
    scalings = {"robust": RobustScaling, "range": TrainingRange}
    preprocess = scalings[scaling](grid) if scaling in scalings else nn.Identity()
    frequency_scale = fitted_frequency_scale(frequency_scale, train_rows)
    plain = 0 if embedding == "none" else plain_indicators(embed_indicators, indicator_features)
    numbers = features - plain  # the first ``numbers`` features are embedded
    embed = {
        "none": lambda: nn.Identity(),
        "linear": lambda: LinearEmbedding(numbers, d_embedding),
        "periodic": lambda: PeriodicEmbedding(numbers, frequencies, frequency_scale, d_embedding),
        "piecewise": lambda: PiecewiseEmbedding(
            bin_edges(grid, bins, preprocess)[:numbers], d_embedding
        ),
    }[embedding]()
    embedded = features if embedding == "none" else numbers * d_embedding + plain
    layers: list[nn.Module] = []
    width = embedded
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)]
        width = hidden
    members = MemberScale(ensemble, embedded, own_rows=not share_batches)
    model = EnsembleMLP(preprocess, embed, members, nn.Sequential(*layers), num_classes, plain)
    model.train_rows = train_rows  # said at start-up
    return model


def fitted_inputs(
    embedding: str, robust_scaling: bool | str, train_rows: int | None
) -> tuple[str, str]:
    """The embedding and the scaling (``robust``, ``range`` or ``none``) for a table of
    ``train_rows`` rows; ``auto``: as the module says (a table's rows not known, as for data
    read in shards or a checkpoint recorded before its rows were, count as large). Measured
    on the real tables of docs/real-data.md."""
    small = train_rows is not None and train_rows < SMALL_TABLE_ROWS
    if embedding == "auto":
        embedding = "none" if small else "periodic"
    if robust_scaling == "auto":
        return embedding, "range" if small else "robust"
    return embedding, "robust" if robust_scaling else "none"


def fitted_frequency_scale(scale: float | str, train_rows: int | None) -> float:
    """``frequency_scale=auto``: the periodic frequencies' starting spread for a table of
    ``train_rows`` rows. Measured on 13 real tables (docs/real-data.md): wide starts (N(0, 1))
    overfit tables of hundreds of rows (breast cancer −3 points, diabetes +14% MAE against
    N(0, 0.01)), are level at 6,000 rows and fit finer detail from 9,000 (hotel prices −14%
    MAE, diamonds −13%). From there N(0, 3) rather than N(0, 1): UCI adult +0.5 points on
    each of three seeds, hotel prices, CPS 1988 and diamonds within 1% either way. A model
    rebuilt from a checkpoint (no rows) takes its frequencies from the weights."""
    if scale != "auto":
        return float(scale)
    large = train_rows is not None and train_rows >= LARGE_TABLE_ROWS
    return LARGE_TABLE_SCALE if large else SMALL_TABLE_SCALE


def plain_indicators(embed: bool | str, indicators: int | None) -> int:
    """How many of the table's 0/1 columns (the last ``indicators`` features) enter the MLP as
    they are: none when ``embed`` is true, all when false; ``auto``: all from
    :data:`PLAIN_INDICATORS_FROM` of them. A rebuild counts them from the checkpoint's column
    record as training did, so both build the same shapes."""
    indicators = indicators or 0
    if embed == "auto":
        return indicators if indicators >= PLAIN_INDICATORS_FROM else 0
    return 0 if embed else indicators


def fitted_grid(features: int, quantiles: torch.Tensor | None) -> torch.Tensor:
    """[F, QUANTILE_LEVELS] each feature's training quantiles; without them, those of a
    standard normal (the inputs are standardised), clipped to ±3: placeholders."""
    if quantiles is not None:
        return quantiles.detach().to(torch.float32).cpu().clone()
    levels = torch.linspace(0, 1, QUANTILE_LEVELS).clamp(0.00135, 0.99865)
    normal = torch.special.ndtri(levels)
    return normal.expand(features, QUANTILE_LEVELS).clone()


def level(grid: torch.Tensor, share: torch.Tensor) -> torch.Tensor:
    """[F, S] the quantiles at ``share`` (values in [0, 1]), linear between the grid's."""
    at = share * (grid.shape[1] - 1)
    low = at.floor().long().clamp(max=grid.shape[1] - 2)
    frac = (at - low).to(grid.dtype)
    return grid[:, low] * (1 - frac) + grid[:, low + 1] * frac


class RobustScaling(nn.Module):
    """(x − median) / (IQR / 1.349), then smoothly clipped (RealMLP). A feature whose
    interquartile range is 0 (a 0/1 column, mostly one value) is scaled by its range / 2."""

    said = "robust scaling, "  # at start-up

    def __init__(self, grid: torch.Tensor) -> None:
        super().__init__()
        q = level(grid, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))
        iqr = (q[:, 3] - q[:, 1]) / 1.349
        spread = torch.where(iqr > 1e-6, iqr, (q[:, 4] - q[:, 0]) / 2)
        self.register_buffer("center", q[:, 2].clone())
        self.register_buffer("scale", torch.where(spread > 1e-6, spread, torch.ones_like(spread)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return smooth_clip((x - self.center) / self.scale)

    def map(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` [F, S] in input units, as :meth:`forward` maps them (bins' edges)."""
        return smooth_clip((values - self.center[:, None]) / self.scale[:, None])


class TrainingRange(nn.Module):
    """The inputs as they are, clamped to the training split's range of each feature."""

    said = "inputs clamped to the training range, "

    def __init__(self, grid: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("low", grid[:, 0].clone())
        self.register_buffer("high", grid[:, -1].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(x, self.high), self.low)

    def map(self, values: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(values, self.high[:, None]), self.low[:, None])


def smooth_clip(x: torch.Tensor) -> torch.Tensor:
    x = x.clamp(-CLIP_BOUND, CLIP_BOUND)  # a value far out clips to ±3, not to the median
    return x / torch.sqrt(1 + (x / CLIP) ** 2)


def bin_edges(grid: torch.Tensor, bins: int, preprocess: nn.Module) -> torch.Tensor:
    """[F, bins + 1] the edges of equal-frequency bins of each feature's training values, in
    the units the embedding sees (after the scaling)."""
    edges = level(grid, torch.linspace(0, 1, bins + 1))
    if isinstance(preprocess, RobustScaling | TrainingRange):
        edges = preprocess.map(edges)
    return edges


class LinearEmbedding(nn.Module):
    """Each feature through its own linear map to ``d`` values and a ReLU: [N, F·d]."""

    def __init__(self, features: int, d: int) -> None:
        super().__init__()
        bound = 1.0  # a scalar input: fan-in 1
        self.weight = nn.Parameter(torch.empty(features, d).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(features, d).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x[..., None] * self.weight + self.bias).flatten(-2)


class PeriodicEmbedding(nn.Module):
    """PLR (lite): cos and sin of 2π·c·x for ``frequencies`` learned c per feature (drawn
    from N(0, ``scale``)), then one linear layer shared by the features and a ReLU."""

    def __init__(self, features: int, frequencies: int, scale: float, d: int) -> None:
        super().__init__()
        self.scale = scale  # said at start-up
        self.frequencies = nn.Parameter(torch.randn(features, frequencies) * scale)
        self.linear = nn.Linear(2 * frequencies, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        angle = 2 * math.pi * self.frequencies * x[..., None]
        periodic = torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)
        return torch.relu(self.linear(periodic)).flatten(-2)


class PiecewiseEmbedding(nn.Module):
    """The piecewise-linear encoding of each feature over its bins (1 for a bin below the
    value, the value's place in its own bin, 0 above; the first and last bins open-ended),
    then a linear layer per feature and a ReLU: [N, F·d]."""

    def __init__(self, edges: torch.Tensor, d: int) -> None:
        super().__init__()
        features, bins = edges.shape[0], edges.shape[1] - 1
        left, width = edges[:, :-1], edges[:, 1:] - edges[:, :-1]
        # A bin of (almost) no width (ties: a value many rows share) is a step just above its
        # value, so a value on it reads 0 whatever its last bit (an export's arithmetic).
        narrow = width < STEP
        self.register_buffer("left", torch.where(narrow, left + STEP, left).clone())
        self.register_buffer("width", torch.where(narrow, STEP, width).clone())
        bound = bins**-0.5
        self.weight = nn.Parameter(torch.empty(features, bins, d).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(features, d).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ratio = (x[..., None] - self.left) / self.width  # [N, F, bins]
        bins = ratio.shape[-1]
        if bins > 1:
            ratio = torch.cat(
                [
                    ratio[..., :1].clamp(max=1),
                    ratio[..., 1:-1].clamp(0, 1),
                    ratio[..., -1:].clamp(min=0),
                ],
                dim=-1,
            )
        encoded = torch.einsum("...fb,fbd->...fd", ratio, self.weight) + self.bias
        return torch.relu(encoded).flatten(-2)


class MemberScale(nn.Module):
    """The k members' scaling of the MLP's input, [N, D] (or each member's own rows,
    [N, k, D]) → [N, k, D] (random signs at the start, TabM's; one member: ones, a plain
    MLP). ``own_rows``: in training each member takes rows of its own (share_batches=false)."""

    def __init__(self, members: int, width: int, own_rows: bool = False) -> None:
        super().__init__()
        self.own_rows = own_rows and members > 1
        signs = torch.randint(0, 2, (members, width)) * 2.0 - 1
        self.weight = nn.Parameter(signs if members > 1 else torch.ones(1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x if x.dim() == 3 else x[:, None, :]) * self.weight


class EnsembleMLP(nn.Module):
    """``preprocess`` → ``embed`` (of all features but the last ``plain``, which join its output
    as they are) → the k ``members``' copies of the input through one shared ``backbone`` MLP
    (Linear, ReLU, Dropout) at once → k output layers. It takes rows [N, F], or in training
    each member's own rows [N, k, F] (``batch_members``: k then, 1 when they share batches)."""

    def __init__(
        self,
        preprocess: nn.Module,
        embed: nn.Module,
        members: MemberScale,
        backbone: nn.Sequential,
        outputs: int,
        plain: int = 0,
    ) -> None:
        super().__init__()
        self.preprocess, self.embed, self.plain = preprocess, embed, plain
        self.member_scale, self.backbone = members, backbone
        self.members, width = members.weight.shape
        self.batch_members = self.members if members.own_rows else 1  # what the batches draw
        for layer in backbone:  # the last hidden layer's width, or the input's without one
            width = layer.out_features if isinstance(layer, nn.Linear) else width
        bound = width**-0.5
        shape = (self.members, width, outputs)
        self.head_weight = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.head_bias = nn.Parameter(torch.empty(self.members, outputs).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(x)
        if self.plain:  # the 0/1 columns after the numbers, as they are
            numbers = x.shape[-1] - self.plain
            x = torch.cat([self.embed(x[..., :numbers]), x[..., numbers:]], dim=-1)
        else:
            x = self.embed(x)
        x = self.member_scale(x)  # [N, k, D]: the members' copies, or their own rows
        x = self.backbone(x)  # the k copies through the one MLP
        out = torch.einsum("nkd,kdo->nko", x, self.head_weight) + self.head_bias
        return out if self.training else out.mean(dim=1)

    def describe(self) -> str:
        """One line: its parts (said at start-up by model=auto)."""
        widths = "-".join(str(m.out_features) for m in self.backbone if isinstance(m, nn.Linear))
        embedding = type(self.embed).__name__.removesuffix("Embedding").lower()
        embedding = "no" if embedding == "identity" else embedding
        scaling = getattr(self.preprocess, "said", "")
        start = ""
        if isinstance(self.embed, PeriodicEmbedding):
            start = f", frequencies from N(0, {self.embed.scale:g})"
        plain = f", {self.plain} 0/1 columns as they are" if self.plain else ""
        own = ", each on batches of its own" if self.batch_members > 1 else ""
        rows = getattr(self, "train_rows", None)
        fitted = f"; fitted to {rows:,} training rows" if rows is not None else ""
        return (
            f"{scaling}{embedding} embeddings{plain}, {self.members} members sharing a "
            f"{widths or 'linear'} MLP{own}{start}{fitted}"
        )
