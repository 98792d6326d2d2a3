"""The samples of one split, in memory (:class:`TensorSplit`) or read lazily
(:class:`MappedSplit`); a split held out of another, shards for torchrun's processes, and the
channel statistics normalisation uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from utils.errors import UserError


@dataclass
class TensorSplit:
    """A whole split in memory: uint8 images [N, C, H, W] (or float inputs [N, ...]) and their
    targets, as data/batching/targets.py describes: int64 class labels [N], or float [N, K]."""

    inputs: torch.Tensor
    labels: torch.Tensor
    hashes: torch.Tensor | None = None  # per-sample content hashes, when stored with a cache
    held: ClassVar[str] = "memory"  # how a split is held: memory, disk, files or shards

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.labels):  # the extra images would be dropped unseen
            raise UserError(
                f"the data holds {len(self.inputs)} inputs and {len(self.labels)} "
                "labels; its files disagree (truncated or mixed?): give one label "
                "per input"
            )

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.inputs.shape[1:])


@dataclass(frozen=True)
class MappedSplit:
    """A split cached on disk (data/images/image_cache.py): uint8 images [N, C, H, W] memory-mapped,
    targets (data/batching/targets.py) in memory."""

    images: np.ndarray  # an np.memmap: pages are read as batches need them
    labels: torch.Tensor
    hashes: torch.Tensor | None = None  # per-sample content hashes, stored with the cache
    held: ClassVar[str] = "disk"

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape[1:])


class MappedRows:
    """Rows ``rows`` of a memory-mapped array, indexed as that array is: a slice gives the rows
    it covers, an index array gathers them from the file (a fold's split of a folder's cache)."""

    def __init__(self, array: np.ndarray, rows: np.ndarray) -> None:
        self.array, self.rows = array, rows

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows), *self.array.shape[1:])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return MappedRows(self.array, self.rows[key])
        return self.array[self.rows[key]]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.array[self.rows], dtype=dtype)


def rows_of(split: TensorSplit | MappedSplit, rows: torch.Tensor) -> TensorSplit | MappedSplit:
    """The samples ``rows`` of a held ``split``, held the same way (in memory, or read from
    the same file)."""
    hashes = None if split.hashes is None else split.hashes[rows]
    if isinstance(split, TensorSplit):
        return TensorSplit(split.inputs[rows], split.labels[rows], hashes)
    return MappedSplit(MappedRows(split.images, rows.numpy()), split.labels[rows], hashes)


def joined(splits: Mapping[str, Any], why: str) -> TensorSplit:
    """The samples of the ``splits`` train then val, in memory (``why``: the key that asked)."""
    first, second = splits["train"], splits["val"]
    held = isinstance(first, TensorSplit) and isinstance(second, TensorSplit)
    if not held or first.input_shape != second.input_shape:
        raise UserError(
            f"{why}: the train and val splits cannot be joined (they must be held in memory "
            "with one input shape: a table, arrays or a cached image set); leave it out"
        )
    both = first.hashes is not None and second.hashes is not None
    hashes = torch.cat([first.hashes, second.hashes]) if both else None
    inputs = torch.cat([first.inputs, second.inputs])
    return TensorSplit(inputs, torch.cat([first.labels, second.labels]), hashes)


def shard_bounds(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """This process's contiguous share of ``size`` samples (sizes differ by at most one)."""
    return rank * size // world_size, (rank + 1) * size // world_size


def shard(split: TensorSplit, rank: int, world_size: int) -> TensorSplit:
    lo, hi = shard_bounds(len(split), rank, world_size)
    return split if world_size == 1 else TensorSplit(split.inputs[lo:hi], split.labels[lo:hi])


def holdout(split: TensorSplit, sizes: Sequence[int], seed: int) -> list[TensorSplit]:
    """Cut ``split`` into parts of the given sizes (the remainder goes first) by a seeded
    permutation, so the parts are the same on every run and every machine."""
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))
    rest = len(split) - sum(sizes)
    if rest <= 0 or min(sizes) <= 0:
        raise UserError(f"cannot hold out {list(sizes)} samples from a split of {len(split)}")
    parts, lo = [], 0
    for size in [rest, *sizes]:
        rows = order[lo : lo + size]
        parts.append(TensorSplit(split.inputs[rows], split.labels[rows]))
        lo += size
    return parts


def fill_splits(
    samples: TensorSplit, given: Mapping[str, TensorSplit], split: Mapping[str, Any]
) -> tuple[TensorSplit, TensorSplit, TensorSplit]:
    """(train, val, test): the ``given`` val and test splits (separate files), and those not
    given held out of ``samples`` as the shares ``split["val"]``, ``split["test"]`` by the
    seeded :func:`holdout` (``split["seed"]``)."""
    missing = [name for name in ("val", "test") if name not in given]
    sizes = [max(1, round(split[name] * len(samples))) for name in missing]
    train, *parts = holdout(samples, sizes, split["seed"]) if missing else (samples,)
    splits = {**given, **dict(zip(missing, parts, strict=True))}
    return train, splits["val"], splits["test"]


def channel_statistics(inputs: torch.Tensor) -> tuple[list[float], list[float]]:
    """Mean and std of each channel (dim 1; each feature of [N, F]), in the units
    normalisation uses: [0, 1] pixel units for uint8 images, the values' own otherwise."""
    values = inputs.float() / 255 if inputs.dtype == torch.uint8 else inputs.float()
    values = values.transpose(0, 1).reshape(values.shape[1], -1)
    std = values.std(dim=1).nan_to_num(1.0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return values.mean(dim=1).tolist(), std.tolist()


def pixel_statistics(chunks: Iterator[torch.Tensor]) -> tuple[list[float], list[float]]:
    """Per-channel mean and (unbiased) std of uint8 image batches [n, C, H, W], / 255."""
    total = squares = None
    count = 0
    for chunk in chunks:
        values = chunk.to(torch.float64).transpose(0, 1).reshape(chunk.shape[1], -1) / 255
        total = values.sum(dim=1) if total is None else total + values.sum(dim=1)
        squares = (values * values).sum(dim=1) + (0 if squares is None else squares)
        count += values.shape[1]
    mean = total / count
    variance = (squares - count * mean * mean).clamp_min(0) / max(count - 1, 1)
    std = variance.sqrt()
    std = torch.where(std > 0, std, torch.ones_like(std))  # one colour everywhere: keep scale 1
    return mean.tolist(), std.tolist()


def feature_quantiles(inputs: torch.Tensor, mean: Sequence[float], std: Sequence[float]):
    """[F, 65] each feature's quantiles at 0, 1/64, ..., 1 (linear between ranks) of a table's
    rows ``inputs`` [N, F], in normalised units ((x − mean) / std): what models/tabular/
    fits its scaling and bins to."""
    values = (inputs.float() - torch.tensor(mean)) / torch.tensor(std)
    ordered = values.sort(dim=0).values
    at = torch.linspace(0, 1, 65) * (len(ordered) - 1)
    low = at.floor().long().clamp(max=max(len(ordered) - 2, 0))
    high = (low + 1).clamp(max=len(ordered) - 1)
    frac = (at - low).view(-1, 1)
    return (ordered[low] * (1 - frac) + ordered[high] * frac).T.contiguous()
