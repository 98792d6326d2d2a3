"""Batches from shards (data=parquet): the order is ours (data/batching/order.py), the bytes are
read ahead. Each batch's rows are gathered from the row groups that hold them; the row groups
are read in the order the batches first need them, by DataLoader workers that run ahead of the
step, and a row group is let go once no later batch of the epoch needs it. The batches, their
normalisation and augmentation are exactly those of the other kinds, so a resume at any batch,
with any number of workers, continues the same stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data.batching.batches import BatchPlan, BatchTransform, batch_bounds
from data.batching.loader import reraised
from data.batching.order import block_order
from data.batching.splits import shard_bounds
from utils.system.seeding import mix_seed

PREFETCH_GROUPS = 4  # row groups each worker reads ahead of the step


@dataclass(frozen=True)
class ShardSplit:
    """A split held in shards: the rows of each row group (file order), what reads and decodes
    one row group (``read(g)`` → inputs [rows, ...], targets [rows, ...]: a picklable object,
    so workers can call it), every sample's target (read once, column by column) and the
    shape of one input."""

    sizes: tuple[int, ...]
    read: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    targets: torch.Tensor
    input_shape: tuple[int, ...]
    window: int  # data.shuffle_window: row groups shuffled together
    workers: int  # data.num_workers: reading processes
    pixels: bool  # uint8 images (normalised from [0, 255]), else numbers in their own units

    def __len__(self) -> int:
        return sum(self.sizes)

    @property
    def starts(self) -> torch.Tensor:
        """The global id of each row group's first row, and the count of all rows last."""
        return torch.tensor([0, *self.sizes]).cumsum(0)


class _RowGroups(Dataset):
    """Row groups ``groups`` of ``split``, in the order given: what the workers read."""

    def __init__(self, split: ShardSplit, groups: list[int]) -> None:
        self.read, self.groups = split.read, groups

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.read(self.groups[index])


class ShardBatches:
    """Batches of a :class:`ShardSplit`: for training, the global batches of the epoch's
    block order, this process taking its rows of each; for evaluation, this process's share
    of the rows in file order."""

    def __init__(self, split: ShardSplit, plan: BatchPlan, transform: BatchTransform) -> None:
        self.split, self.plan, self.transform = split, plan, transform
        if plan.train:
            self.lo, self.hi = 0, len(split)
        else:
            self.lo, self.hi = shard_bounds(len(split), plan.rank, plan.world_size)

    def __len__(self) -> int:
        return self.plan.batch_count(self.hi - self.lo)

    def order(self, epoch: int) -> torch.Tensor:
        split = self.split
        if self.plan.train:
            return block_order(list(split.sizes), self.plan.seed, epoch, split.window)
        return torch.arange(self.lo, self.hi)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        plan, order = self.plan, self.order(epoch)
        rank, world = (plan.rank, plan.world_size) if plan.train else (0, 1)
        bounds = [batch_bounds(i, plan.batch_size, rank, world) for i in range(start, len(self))]
        rows = [order[lo : min(hi, len(order))] for lo, hi in bounds]
        if not rows:
            return
        ids = torch.cat(rows)
        group_of = torch.searchsorted(self.split.starts, ids, right=True) - 1
        held = _Held(self.split.starts)
        reading = iter(self._reader(_first_needed(group_of)))
        last_use = _last_use(group_of)
        at = 0
        for index, batch_ids in enumerate(rows, start):
            groups = group_of[at : at + len(batch_ids)]
            while not held.has(groups):
                held.add(*next(reading))
            inputs, targets = held.gather(batch_ids, groups)
            at += len(batch_ids)
            held.drop([g for g in held.groups if last_use[g] <= at])  # no later batch needs it
            images = self.transform.normalize(inputs.to(self.transform.device, non_blocking=True))
            labels = targets.to(self.transform.device, non_blocking=True)
            if plan.train:
                batch_seed = mix_seed(plan.seed, epoch, index * plan.world_size + plan.rank)
                images = self.transform.augment(images, batch_seed)
            yield images, labels

    def _reader(self, groups: list[int]) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(group, inputs, targets) of ``groups`` in that order, read ahead by the workers."""
        workers = self.split.workers
        # Its own generator: iterating a DataLoader draws a seed, and the global RNG (dropout's)
        # must draw the same numbers whether an epoch starts fresh or resumes inside.
        loader = DataLoader(
            _RowGroups(self.split, groups),
            batch_size=None,
            num_workers=workers,
            prefetch_factor=PREFETCH_GROUPS if workers else None,
            generator=torch.Generator(),
        )
        for group, (inputs, targets) in zip(groups, reraised(loader), strict=True):
            yield group, inputs, targets


class _Held:
    """The row groups read and still needed, concatenated once each time the set changes, so
    a batch is one gather: ``pool[offset[group] + row within the group]``."""

    def __init__(self, starts: torch.Tensor) -> None:
        self.starts, self.parts = starts, {}
        self.present = torch.zeros(len(starts) - 1, dtype=torch.bool)
        self.offset = torch.full((len(starts) - 1,), -1, dtype=torch.long)
        self.pool: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def groups(self) -> list[int]:
        return list(self.parts)

    def has(self, groups: torch.Tensor) -> bool:
        return bool(self.present[groups].all())

    def add(self, group: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.parts[group], self.pool = (inputs, targets), None
        self.present[group] = True

    def drop(self, groups: list[int]) -> None:
        for group in groups:
            del self.parts[group]
            self.present[group], self.pool = False, None

    def gather(self, ids: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self._pooled()
        rows = self.offset[groups] + (ids - self.starts[groups])
        return inputs[rows], targets[rows]

    def _pooled(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pool is None:
            self.offset.fill_(-1)
            at = 0
            for group, (inputs, _) in self.parts.items():
                self.offset[group] = at
                at += len(inputs)
            parts = list(self.parts.values())
            if parts:
                self.pool = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            else:
                self.pool = (torch.empty(0), torch.empty(0))
        return self.pool


def _first_needed(group_of: torch.Tensor) -> list[int]:
    """The row groups in the order the batches first need them."""
    values = group_of.numpy()
    _, first = np.unique(values, return_index=True)
    return [int(values[i]) for i in sorted(first)]


def _last_use(group_of: torch.Tensor) -> dict[int, int]:
    """For each row group, one past the last position (in this epoch's rows) that needs it."""
    values = group_of.numpy()
    reverse = values[::-1]
    groups, last = np.unique(reverse, return_index=True)
    return {int(g): len(values) - int(i) for g, i in zip(groups, last, strict=True)}
