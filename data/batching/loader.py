"""Batches decoded by DataLoader workers, for data that does not fit in memory: the same plan
and transform as in memory, workers that leave stopping to the main process, and bad input found
by a worker as one line.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from data.batching.batches import BatchPlan, BatchTransform, batch_bounds
from data.batching.order import permutation, repeated
from data.batching.splits import shard_bounds
from utils.errors import UserError
from utils.system.signals import STOP_SIGNALS, kill_children_at_exit


class EpochBatchSampler(Sampler[list[int]]):
    """Index batches for one epoch from a given batch on: the DataLoader twin of
    :meth:`TensorBatches.epoch`, sharded across processes the same way (unlike
    ``DistributedSampler``, it can start mid-epoch, which exact resume needs)."""

    def __init__(self, size: int, plan: BatchPlan) -> None:
        self.size, self.batch_size, self.train, self.seed = (
            size,
            plan.batch_size,
            plan.train,
            plan.seed,
        )
        self.rank, self.world_size = plan.rank, plan.world_size
        self.plan, self.repeats = plan, plan.repeats
        self.start, self.order = 0, self._order(0)

    def at(self, epoch: int, start: int) -> None:
        """Batches of ``epoch`` from batch ``start`` on; its order computed once, here."""
        self.start, self.order = start, self._order(epoch)

    def _order(self, epoch: int) -> torch.Tensor:
        """The epoch's slots (data/batching/order.py ``repeated``), or the evaluation shard."""
        if self.train:
            return repeated(permutation(self.size, self.seed, epoch), self.repeats)
        return torch.arange(*shard_bounds(self.size, self.rank, self.world_size))

    def slots(self, index: int) -> torch.Tensor:
        """Batch ``index``'s slots: its samples are ``slots % size``."""
        rank, world = (self.rank, self.world_size) if self.train else (0, 1)
        lo, hi = batch_bounds(index, self.batch_size, rank, world)
        return self.order[lo:hi]

    def __len__(self) -> int:
        if self.train:
            return self.plan.batch_count(self.size)
        lo, hi = shard_bounds(self.size, self.rank, self.world_size)
        return self.plan.batch_count(hi - lo)

    def __iter__(self) -> Iterator[list[int]]:
        for index in range(self.start, len(self)):
            yield (self.slots(index) % self.size).tolist()


def _worker_ignores_signals(worker_id: int) -> None:
    # The main process decides what an interrupt means; workers just stop when it exits.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def decoding_loader(dataset: Dataset, **options: Any) -> DataLoader:
    """A DataLoader whose workers leave stopping to the main process (they ignore SIGINT and
    SIGTERM) and are killed at exit if still alive; ``options``: DataLoader's."""
    if options.get("num_workers", 0) > 0:
        kill_children_at_exit()
    return DataLoader(dataset, worker_init_fn=_worker_ignores_signals, **options)


def worker_error(error: Exception) -> UserError:
    """A :class:`UserError` raised in a DataLoader worker reaches the main process as a new
    exception whose message is the worker's whole traceback: keep its last line's message."""
    last = str(error).strip().splitlines()[-1] if str(error).strip() else ""
    return UserError(last.split(": ", 1)[1] if "Error: " in last else last or str(error))


class LoaderBatches:
    """Batches decoded lazily by DataLoader workers, for data that does not fit in memory."""

    def __init__(
        self, dataset: Dataset, plan: BatchPlan, transform: BatchTransform, num_workers: int
    ) -> None:
        self.sampler = EpochBatchSampler(len(dataset), plan)
        self.loader = decoding_loader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=transform.device.type == "cuda",
            persistent_workers=num_workers > 0,
            # Worker seeds come from this generator, not from the global torch RNG.
            generator=torch.Generator().manual_seed(plan.seed),
        )
        self.transform = transform
        self.train = plan.train
        self.seed = plan.seed

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.at(epoch, start)
        device, sampler = self.transform.device, self.sampler
        for index, (images, labels) in enumerate(reraised(self.loader), start):
            images = self.transform.normalize(images.to(device, non_blocking=True))
            labels = labels.to(device, non_blocking=True)
            if self.train:  # each sample's draws, by (seed, epoch, its slot): the sampler's
                images = self.transform.augment(images, self.seed, epoch, sampler.slots(index))
            yield images, labels


def end_workers(batches: Iterator) -> None:
    """The workers of a DataLoader iterator whose batches no one will read (a stop signal
    came) are ended at once. DataLoader's own shutdown waits 5 s for each busy worker in turn
    and then sends it SIGTERM, which these workers ignore (:func:`_worker_ignores_signals`): a
    stop during an image cache's build ended the run 35 s after the signal, 30 s with three
    workers here. Their pids are taken off DataLoader's watch first, which would take the
    kill for a crash."""
    from torch.utils.data._utils import signal_handling

    if getattr(batches, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(batches))
        batches._worker_pids_set = False
    for worker in getattr(batches, "_workers", ()):
        if worker.is_alive():
            worker.kill()
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def reraised(loader: DataLoader | Iterator) -> Iterator:
    """The loader's batches; bad input found by a worker is one line, as with no workers."""
    try:
        yield from loader
    except UserError as error:
        if "DataLoader worker" not in str(error):
            raise
        raise worker_error(error) from None
