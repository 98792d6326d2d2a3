"""How a table's numbers enter the MLP: robustly scaled and smoothly clipped (or clamped to
the training range), then embedded (linear, periodic or piecewise-linear), each fitted to the
training quantiles the data supplies."""

from __future__ import annotations

import math

import torch
from torch import nn

QUANTILE_LEVELS = 65  # the quantiles the data supplies: 0, 1/64, ..., 1
CLIP = 3.0  # smooth clipping's scale: x / sqrt(1 + (x / CLIP)²)
# Smooth clipping first bounds x here: past it the result is ±CLIP to float32's precision, and
# beyond about 5e19 (x / CLIP)² overflows to inf, which would map the value to 0, the median.
CLIP_BOUND = 1e6
STEP = 1e-3  # a piecewise bin narrower than this (in scaled units) is a step


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
