"""The builder (``model=tabular``, and ``model=auto``'s for a table's rows): its keys checked,
what ``auto`` chooses for the table's size, and the model put together."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.tabular.ensemble import EnsembleMLP, MemberScale
from models.tabular.numbers import (
    LinearEmbedding,
    PeriodicEmbedding,
    PiecewiseEmbedding,
    RobustScaling,
    TrainingRange,
    bin_edges,
    fitted_grid,
)
from utils.config.arguments import DROPOUT, POSITIVE_INT, POSITIVE_INTS, Rule, checked, one_of
from utils.errors import UserError

EMBEDDINGS = ("none", "linear", "periodic", "piecewise")
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
