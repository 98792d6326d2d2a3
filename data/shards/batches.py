"""Batches from shards (data=parquet): the order is ours (data/batching/order.py), the bytes are
read ahead. Each batch's rows are gathered from the row groups that hold them; the row groups
are read in the order the batches first need them, by threads that run ahead of the step, and
a row group is let go once no later batch of the epoch needs it. The batches, their
normalisation and augmentation are exactly those of the other kinds, so a resume at any batch,
with any number of workers, continues the same stream.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data.batching.batches import BatchPlan, BatchTransform, batch_bounds
from data.batching.loader import reraised
from data.batching.order import block_order, repeated
from data.batching.splits import shard_bounds
from utils.system.signals import Interrupted, StopGrace

PREFETCH_GROUPS = 4  # row groups each reading thread holds ahead of the step


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
    workers: int  # data.num_workers: reading threads
    pixels: bool  # uint8 images (normalised from [0, 255]), else numbers in their own units
    decodes: bool = False  # encoded images, decoded in Python: read by worker processes
    held: ClassVar[str] = "shards"

    def __len__(self) -> int:
        return sum(self.sizes)

    def batches(self, plan: BatchPlan, transform: BatchTransform, workers: int) -> ShardBatches:
        """This split's batches, read ahead in our order (``workers``: its own, data.num_workers)."""
        return ShardBatches(self, plan, transform)

    @property
    def starts(self) -> torch.Tensor:
        """The global id of each row group's first row, and the count of all rows last."""
        return torch.tensor([0, *self.sizes]).cumsum(0)


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
            order = block_order(list(split.sizes), self.plan.seed, epoch, split.window)
            return repeated(order, self.plan.repeats)  # slots: sample = slot % len(split)
        return torch.arange(self.lo, self.hi)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        plan, order = self.plan, self.order(epoch)
        rank, world = (plan.rank, plan.world_size) if plan.train else (0, 1)
        bounds = [batch_bounds(i, plan.batch_size, rank, world) for i in range(start, len(self))]
        rows = [order[lo : min(hi, len(order))] for lo, hi in bounds]
        if not rows:
            return
        ids = torch.cat(rows) % len(self.split)  # the samples of the slots
        group_of = torch.searchsorted(self.split.starts, ids, right=True) - 1
        held = _Held(self.split.starts)
        wanted = _rows_wanted(ids, group_of, self.split.starts) if self.split.decodes else None
        reading = iter(self._reader(_first_needed(group_of), wanted))
        last_use = _last_use(group_of)
        at = 0
        for batch_ids in rows:
            groups = group_of[at : at + len(batch_ids)]
            while not held.has(groups):
                held.add(*next(reading))
            inputs, targets = held.gather(batch_ids % len(self.split), groups)
            at += len(batch_ids)
            held.drop([g for g in held.groups if last_use[g] <= at])  # no later batch needs it
            images = self.transform.normalize(inputs.to(self.transform.device, non_blocking=True))
            labels = targets.to(self.transform.device, non_blocking=True)
            if plan.train:  # each sample's draws, by (seed, epoch, its index)
                images = self.transform.augment(images, plan.seed, epoch, batch_ids)
            yield images, labels

    def _reader(
        self, groups: list[int], wanted: dict | None
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(group, inputs, targets) of ``groups`` in that order, read ahead by
        ``data.num_workers`` threads, or processes where decoding runs in Python; ``wanted``:
        the rows of each group this process uses, the only ones it decodes."""
        split = self.split
        read = _Reading(split.read, wanted)
        if split.decodes and split.workers > 0:
            ahead: _ReadAhead | _Pulled = _Pulled(_in_processes(split, groups, read))
        else:
            ahead = _ReadAhead(read, groups, max(1, split.workers))
        try:
            for index, group in enumerate(groups):
                yield (group, *ahead.result(index))
        finally:
            ahead.close()


def _waited(get: Callable[[], Any], what: str) -> Any:
    """``get()`` (which times out every 0.1 s) until it answers. What the step waits for: a
    stop signal while it waits (a stalled store) ends the run within two seconds
    (STOP_GRACE_SECONDS); the last checkpoint written stays the one to resume."""
    grace = StopGrace(what)
    while True:
        try:
            return get()
        except (FuturesTimeout, queue.Empty):
            if grace.over():
                raise Interrupted from None


class _ReadAhead:
    """Row groups read ahead of the step by ``workers`` daemon threads, at most
    :data:`PREFETCH_GROUPS` each beyond the one the step waits for. Threads where the reading
    is vectorised (pixels, numbers): pyarrow fetches and decompresses outside Python's lock,
    and a row group read in this process is not copied again to reach the step (measured side
    by side, uint8 shards: threads at 0.80× the cache in memory, worker processes at 0.34×).
    Daemon threads, so a read that a stalled store never answers cannot hold the process at
    its exit."""

    def __init__(self, read: Callable, groups: list[int], workers: int) -> None:
        self.read, self.groups = read, groups
        self.results: list[Future | None] = [Future() for _ in groups]
        self.taken, self.waited, self.closed = 0, 0, False
        self.turn = threading.Condition()
        self.depth = workers * PREFETCH_GROUPS
        for slot in range(min(workers, len(groups))):  # named by slot: each epoch's reader
            # of a slot reuses the files the last one opened (data/shards/storage.py)
            name = f"torchloom-shards-{slot}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            with self.turn:
                while not self.closed and self.taken - self.waited >= self.depth:
                    self.turn.wait()
                if self.closed or self.taken == len(self.groups):
                    return
                index, self.taken = self.taken, self.taken + 1
                reading = self.results[index]
            try:
                reading.set_result(self.read(self.groups[index]))
            except BaseException as error:  # raised where the step waits for it
                reading.set_exception(error)

    def result(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        reading = self.results[index]
        value = _waited(lambda: reading.result(timeout=0.1), f"row group {self.groups[index]}")
        with self.turn:
            self.results[index] = None  # let go: the step holds it now
            self.waited = index + 1
            self.turn.notify_all()
        return value

    def close(self) -> None:
        with self.turn:
            self.closed = True
            self.turn.notify_all()


@dataclass(frozen=True)
class _Reading:
    """Reads row group ``g``; of encoded images, decodes only the rows ``wanted[g]`` this
    process uses (each process of N uses about 1/N of every row group's rows)."""

    read: Callable
    wanted: dict | None

    def __call__(self, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.wanted is None:
            return self.read(group)
        return self.read(group, self.wanted[group])


def _rows_wanted(ids: torch.Tensor, group_of: torch.Tensor, starts: torch.Tensor) -> dict:
    """For each row group, the rows within it (sorted) that ``ids`` take: one sort, not a
    pass over the epoch's rows per row group."""
    within = ids - starts[group_of]
    by_group = torch.argsort(group_of, stable=True)
    groups, counts = torch.unique_consecutive(group_of[by_group], return_counts=True)
    parts = within[by_group].split(counts.tolist())
    return {int(g): torch.unique(part) for g, part in zip(groups.tolist(), parts, strict=True)}


class _RowGroups(Dataset):
    """Row groups ``groups`` read by ``read``, in the order given: what worker processes
    read."""

    def __init__(self, read: Callable, groups: list[int]) -> None:
        self.read, self.groups = read, groups

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.read(self.groups[index])


def _in_processes(split: ShardSplit, groups: list[int], read: Callable) -> Iterator:
    """The row groups, read by DataLoader worker processes: encoded images are decoded one by
    one in Python, which threads cannot run side by side (measured side by side on PNG shards:
    threads at 0.98× the DataLoader over the files, worker processes at 1.79×)."""
    # Its own generator: iterating a DataLoader draws a seed, and the global RNG (dropout's)
    # must draw the same numbers whether an epoch starts fresh or resumes inside.
    loader = DataLoader(
        _RowGroups(read, groups),
        batch_size=None,
        num_workers=split.workers,
        prefetch_factor=PREFETCH_GROUPS,
        generator=torch.Generator(),
    )
    return reraised(loader)


class _Pulled:
    """The items of ``source`` (the worker processes' row groups), pulled by a daemon thread
    so that the step's wait for them heeds a stop signal."""

    def __init__(self, source: Iterator) -> None:
        self.items: queue.Queue = queue.Queue(maxsize=2)
        self.closed = threading.Event()
        self.source = source
        threading.Thread(target=self._pull, name="torchloom-shards", daemon=True).start()

    def _pull(self) -> None:
        try:
            for item in self.source:
                while not self.closed.is_set():
                    try:
                        self.items.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self.closed.is_set():
                    return
        except BaseException as error:  # raised where the step waits for it
            self.items.put((None, error))

    def result(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        item, error = _waited(lambda: self.items.get(timeout=0.1), f"row group {index}")
        if error is not None:
            raise error
        return item

    def close(self) -> None:
        self.closed.set()


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
