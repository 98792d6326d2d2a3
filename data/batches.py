"""Batches for training and evaluation, on the training device.

Two paths, one interface (``len(batches)`` and ``batches.epoch(epoch, start)``):

- In memory (digits, MNIST, CIFAR-10, synthetic): each split is normalised once into one float
  tensor on the training device. An epoch draws a seeded permutation and each batch is a slice
  of it, so there is no per-sample Python work at all.
- Lazy (imagefolder): a ``DataLoader`` decodes files in worker processes and yields uint8
  batches in pinned memory, copied to the device without blocking.

Either way, normalisation and augmentation (random crop with padding, horizontal flip) run as
batched tensor ops on the device. What a batch holds is a pure function of
(seed, epoch, batch index): the permutation is seeded by (seed, epoch) and the augmentation by
(seed, epoch, batch). A run can therefore start at any batch of any epoch without replaying
the batches before it.
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from data.mixing import MixedBatches, Mixing
from data.targets import Targets
from utils.config.arguments import POSITIVE_INT, check_values, one_of
from utils.errors import UserError
from utils.system.seeding import mix_seed
from utils.system.signals import STOP_SIGNALS

log = logging.getLogger("torchloom")
SPATIAL = ("auto", "on", "off")  # data.augment.spatial: crops and flips for which models


@dataclass
class TensorSplit:
    """A whole split in memory: uint8 images [N, C, H, W] (or float inputs [N, ...]) and their
    targets, as data/targets.py describes: int64 class labels [N], or float [N, K]."""

    inputs: torch.Tensor
    labels: torch.Tensor

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
    """A split cached on disk (data/image_cache.py): uint8 images [N, C, H, W] memory-mapped,
    targets (data/targets.py) in memory."""

    images: np.ndarray  # an np.memmap: pages are read as batches need them
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape[1:])


@dataclass(frozen=True)
class Placement:
    """Where batches go: the device, its memory layout, and this process's share (rank of
    world_size processes). One value for every split of a run, in train.py and evaluate.py."""

    device: torch.device
    channels_last: bool = False
    rank: int = 0
    world_size: int = 1


@dataclass(frozen=True)
class BatchPlan:
    """How one split is cut into batches: their size; for training (shuffled by ``seed``,
    augmented, the last partial batch dropped) or evaluation (in order, every sample once);
    and this process's share."""

    batch_size: int
    train: bool
    seed: int
    rank: int = 0
    world_size: int = 1

    def batch_count(self, samples: int) -> int:
        """Batches of ``samples``: for training, whole global batches of every process (the
        last partial one dropped); for evaluation, ``samples`` is this process's share and its
        last batch may be partial."""
        if self.train:
            return samples // (self.batch_size * self.world_size)
        return math.ceil(samples / self.batch_size)


def permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(mix_seed(seed, epoch))
    return torch.randperm(n, generator=generator)


class BatchTransform:
    """Normalisation (uint8 → float) and, for training batches, augmentation: batched tensor
    ops on the batch's device."""

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        channels_last: bool = False,
    ) -> None:
        # Fold the /255 of uint8 pixels into the affine map: x_float = x * scale + shift (float
        # inputs, such as a CSV's features, are in their own units: no /255).
        std_t = torch.tensor(std, dtype=torch.float32, device=device)
        mean_t = torch.tensor(mean, dtype=torch.float32, device=device)
        self.scale = {True: 1.0 / (255.0 * std_t), False: 1.0 / std_t}  # by "is it uint8?"
        self.shift = -mean_t / std_t
        self.device = device
        self.crop_padding = crop_padding
        self.horizontal_flip = horizontal_flip
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (or float inputs) on the device → normalised floats, per channel (per
        feature for inputs of shape (F,)), without a second full-size copy."""
        per_channel = (1, -1) + (1,) * (images.dim() - 2)
        scale = self.scale[images.dtype == torch.uint8].view(per_channel)
        layout = self.memory_format if images.dim() == 4 else torch.contiguous_format
        images = images.to(self.device).to(torch.float32, memory_format=layout, copy=True)
        return images.mul_(scale).add_(self.shift.view(per_channel))

    def augment(self, images: torch.Tensor, seed: int) -> torch.Tensor:
        """Random crops (padded with 0, the dataset mean) and flips, drawn from ``seed``."""
        if self.crop_padding == 0 and not self.horizontal_flip:
            return images
        generator = torch.Generator(device=images.device).manual_seed(seed)
        if self.crop_padding > 0:
            images = random_crop(images, self.crop_padding, generator)
        if self.horizontal_flip:
            flip = torch.rand(len(images), device=images.device, generator=generator) < 0.5
            images = torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)
        return images.contiguous(memory_format=self.memory_format)


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Pad with zeros by ``padding`` and crop back at a random offset per image, as one gather."""
    n, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    rows = (dy[:, None] + torch.arange(h, device=device)).view(n, 1, h, 1)
    cols = (dx[:, None] + torch.arange(w, device=device)).view(n, 1, 1, w)
    batch = torch.arange(n, device=device).view(n, 1, 1, 1)
    channel = torch.arange(c, device=device).view(1, c, 1, 1)
    return padded[batch, channel, rows, cols]


class TensorBatches:
    """Batches sliced from a split held whole on the device.

    With several processes (``world_size``), a training step's global batch is
    ``batch_size × world_size`` rows of the one seeded permutation, and this process takes its
    ``rank``-th slice of it: every sample is seen once per epoch across processes, and the
    global batches are those one process would see with the global batch size. Evaluation
    splits are cut into contiguous shards, one per process, with nothing padded or repeated.
    """

    def __init__(self, split: TensorSplit, plan: BatchPlan, transform: BatchTransform) -> None:
        if not plan.train:
            split = shard(split, plan.rank, plan.world_size)
        # Normalised once, up front: each batch is then a gather, as in a hand-written loop
        # (4 bytes a pixel instead of 1; datasets on this path fit in memory by definition).
        self.inputs = transform.normalize(split.inputs)
        self.labels = split.labels.to(transform.device)
        self.batch_size = plan.batch_size
        self.transform = transform
        self.train = plan.train  # shuffle, augment, drop the last partial batch
        self.seed = plan.seed
        self.rank, self.world_size = plan.rank, plan.world_size
        self.plan = plan

    def __len__(self) -> int:
        return self.plan.batch_count(len(self.labels))

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = None
        if self.train:
            order = permutation(len(self.labels), self.seed, epoch).to(self.transform.device)
        for index in range(start, len(self)):
            lo, hi = batch_bounds(
                index,
                self.batch_size,
                self.rank if self.train else 0,
                self.world_size if self.train else 1,
            )
            if order is None:
                images, labels = self.inputs[lo:hi], self.labels[lo:hi]
            else:
                rows = order[lo:hi]
                images, labels = self.inputs[rows], self.labels[rows]
            if self.train:
                batch_seed = mix_seed(self.seed, epoch, index * self.world_size + self.rank)
                images = self.transform.augment(images, batch_seed)
            yield images, labels


class MappedBatches:
    """Batches read from a split memory-mapped on disk, in exactly the order and with exactly
    the values :class:`TensorBatches` and :class:`LoaderBatches` give: each batch's rows are
    gathered from the file, then normalised and augmented on the device."""

    def __init__(self, split: MappedSplit, plan: BatchPlan, transform: BatchTransform) -> None:
        lo, hi = (
            (0, len(split)) if plan.train else shard_bounds(len(split), plan.rank, plan.world_size)
        )
        self.images, self.labels = split.images[lo:hi], split.labels[lo:hi]
        self.plan, self.transform = plan, transform

    def __len__(self) -> int:
        return self.plan.batch_count(len(self.labels))

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        plan, device = self.plan, self.transform.device
        order = permutation(len(self.labels), plan.seed, epoch) if plan.train else None
        rank, world = (plan.rank, plan.world_size) if plan.train else (0, 1)
        for index in range(start, len(self)):
            lo, hi = batch_bounds(index, plan.batch_size, rank, world)
            rows = (
                order[lo:hi] if order is not None else torch.arange(lo, min(hi, len(self.labels)))
            )
            pixels = torch.from_numpy(self.images[rows.numpy()])  # one gather from the file
            images = self.transform.normalize(pixels.to(device, non_blocking=True))
            labels = self.labels[rows].to(device, non_blocking=True)
            if plan.train:
                batch_seed = mix_seed(plan.seed, epoch, index * plan.world_size + plan.rank)
                images = self.transform.augment(images, batch_seed)
            yield images, labels


def batch_bounds(index: int, batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows of this process's part of global batch ``index``."""
    lo = (index * world_size + rank) * batch_size
    return lo, lo + batch_size


def shard_bounds(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """This process's contiguous share of ``size`` samples (sizes differ by at most one)."""
    return rank * size // world_size, (rank + 1) * size // world_size


def shard(split: TensorSplit, rank: int, world_size: int) -> TensorSplit:
    lo, hi = shard_bounds(len(split), rank, world_size)
    return split if world_size == 1 else TensorSplit(split.inputs[lo:hi], split.labels[lo:hi])


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
        self.plan = plan
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        if self.train:
            return self.plan.batch_count(self.size)
        lo, hi = shard_bounds(self.size, self.rank, self.world_size)
        return self.plan.batch_count(hi - lo)

    def __iter__(self) -> Iterator[list[int]]:
        if self.train:
            order = permutation(self.size, self.seed, self.epoch)
            rank, world_size = self.rank, self.world_size
        else:
            order = torch.arange(*shard_bounds(self.size, self.rank, self.world_size))
            rank, world_size = 0, 1
        for index in range(self.start, len(self)):
            lo, hi = batch_bounds(index, self.batch_size, rank, world_size)
            yield order[lo:hi].tolist()


def _worker_ignores_signals(worker_id: int) -> None:
    # The main process decides what an interrupt means; workers just stop when it exits.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _kill_workers() -> None:
    """At exit, end decoding workers that are still alive. They ignore SIGTERM (above), which
    is what multiprocessing's own exit handler sends before it waits for them: without this, a
    run that ends on an error while a worker still lives would wait for ever."""
    workers = [child for child in multiprocessing.active_children() if child.daemon]
    if workers:  # torch's SIGCHLD handler would report each killed worker as a failure
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for worker in workers:
        worker.kill()
        worker.join(timeout=5)


# Registered after multiprocessing's exit handler, so it runs before it.
atexit.register(_kill_workers)


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
        self.loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=transform.device.type == "cuda",
            persistent_workers=num_workers > 0,
            worker_init_fn=_worker_ignores_signals,
            # Worker seeds come from this generator, not from the global torch RNG.
            generator=torch.Generator().manual_seed(plan.seed),
        )
        self.transform = transform
        self.train = plan.train
        self.seed = plan.seed

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.epoch, self.sampler.start = epoch, start
        device = self.transform.device
        for index, (images, labels) in enumerate(_reraised(self.loader), start):
            images = self.transform.normalize(images.to(device, non_blocking=True))
            labels = labels.to(device, non_blocking=True)
            if self.train:
                sampler = self.sampler
                batch_seed = mix_seed(self.seed, epoch, index * sampler.world_size + sampler.rank)
                images = self.transform.augment(images, batch_seed)
            yield images, labels


def _reraised(loader: DataLoader) -> Iterator:
    """The loader's batches; bad input found by a worker is one line, as with no workers."""
    try:
        yield from loader
    except UserError as error:
        if "DataLoader worker" not in str(error):
            raise
        raise worker_error(error) from None


@dataclass(frozen=True)
class Splits:
    """A dataset's splits: :class:`TensorSplit` (held in memory) or a map-style ``Dataset`` of
    (uint8 image [C, H, W], label) pairs with an ``input_shape`` (read lazily)."""

    train: TensorSplit | MappedSplit | Dataset
    val: TensorSplit | MappedSplit | Dataset
    test: TensorSplit | MappedSplit | Dataset | None = None


@dataclass(frozen=True)
class Batching:
    """The keys every ``conf/data/*.yaml`` shares: batch sizes (per process), normalisation
    (``mean`` and ``std`` per channel, in units of the [0, 1] pixel range, or one value for
    all), augmentation, and decoding workers for data read lazily."""

    batch_size: int
    eval_batch_size: int
    mean: Sequence[float]
    std: Sequence[float]
    augment: Mapping
    num_workers: int = 0

    def __post_init__(self) -> None:
        sizes = {"batch_size": self.batch_size, "eval_batch_size": self.eval_batch_size}
        check_values("data", sizes, dict.fromkeys(sizes, POSITIVE_INT))


class Data:
    """A dataset's splits plus how to batch them; what every ``conf/data/*.yaml`` builds."""

    def __init__(
        self,
        name: str,
        splits: Splits,
        num_classes: int,
        batching: Batching,
        classes: Sequence[str] | Targets | None = None,
    ) -> None:
        """``num_classes``: the width of the model's output (classes, labels or values);
        ``classes``: the class names, or the :class:`Targets` of label sets or values."""
        self.name = name
        self.targets = (
            classes
            if isinstance(classes, Targets)
            else Targets("classes", num_classes, tuple(classes) if classes is not None else None)
        )
        self.classes = self.targets.class_names  # what a checkpoint's inputs record calls them
        self.table: dict | None = None  # a table's column encoding (data/tabular.py)
        self.splits = {"train": splits.train, "val": splits.val, "test": splits.test}
        self.num_classes = self.targets.count
        self.fold_ids = None  # data/folds.py FoldIds: data.split.folds's val samples, named
        self.input_shape = splits.train.input_shape  # (C, H, W)
        channels = self.input_shape[0]
        mean, std = list(batching.mean), list(batching.std)
        mean, std = (
            mean * channels if len(mean) == 1 else mean,
            std * channels if len(std) == 1 else std,
        )
        if len(mean) != channels or len(std) != channels:
            wanted = "one value each" if channels == 1 else f"1 value each, or {channels}"
            raise UserError(
                f"data.mean has {len(mean)} values and data.std {len(std)}, but {name} has "
                f"{channels} channel(s): give {wanted} (data.mean=[...] data.std=[...])"
            )
        self.mean, self.std = mean, std
        self.batch_size = batching.batch_size
        self.eval_batch_size = batching.eval_batch_size
        self.crop_padding = int(batching.augment["crop_padding"])
        self.horizontal_flip = bool(batching.augment["horizontal_flip"])
        # Configs stored before data.augment.spatial existed crop and flip as they asked.
        self.spatial = batching.augment.get("spatial", "on")
        check_values("data.augment", {"spatial": self.spatial}, {"spatial": one_of(*SPATIAL)})
        if self.spatial == "off":
            self.crop_padding, self.horizontal_flip = 0, False
        if (self.crop_padding or self.horizontal_flip) and len(self.input_shape) != 3:
            raise UserError(
                f"data.augment.crop_padding and horizontal_flip crop and flip images, and "
                f"{name}'s inputs are {tuple(self.input_shape)}, not (C, H, W); turn them off"
            )
        self.mixing = Mixing.from_augment(batching.augment)  # MixUp/CutMix; None when off
        if self.mixing and self.mixing.cutmix_alpha > 0 and len(self.input_shape) != 3:
            raise UserError(
                f"data.augment.cutmix_alpha={self.mixing.cutmix_alpha}: CutMix pastes image "
                f"boxes, and {name}'s inputs are {tuple(self.input_shape)}, not (C, H, W); "
                "set it to 0 (MixUp works on any input)"
            )
        self.num_workers = batching.num_workers
        if len(splits.train) < self.batch_size:
            raise UserError(
                f"{name}: the training split has {len(splits.train)} samples, fewer than "
                f"data.batch_size={self.batch_size}; lower data.batch_size"
            )
        for split_name, split in self.splits.items():
            if isinstance(split, TensorSplit):
                self.targets.check(split.labels, f"{name} {split_name} split")

    def fit_augmentation(self, flattens_input: bool) -> None:
        """``data.augment.spatial`` for a model whose first layer flattens each sample (an
        MLP; utils/model/checks.py) or not: ``auto`` turns random crops and flips off for the
        first, which has no translation invariance for them to teach and loses accuracy to
        them, and keeps them for the second; ``on`` keeps them for both, with a warning for
        the first; ``off`` has none (set in ``__init__``)."""
        crops = (
            f"data.augment.crop_padding={self.crop_padding}" if self.crop_padding else "",
            "data.augment.horizontal_flip=true" if self.horizontal_flip else "",
        )
        asked = " and ".join(part for part in crops if part)
        if not asked or not flattens_input:
            return
        if self.spatial == "auto":
            self.crop_padding, self.horizontal_flip = 0, False
            log.info(
                "data.augment.spatial=auto: the model's first layer flattens each image, "
                "so %s are off (random crops and flips only cost such a model accuracy; "
                "data.augment.spatial=on keeps them)",
                asked,
            )
        else:
            log.warning(
                "warning: %s train a model whose first layer flattens each image: it "
                "has no spatial structure for them to help, and they usually cost it "
                "accuracy; set data.augment.spatial=auto (or off), or use model=cnn",
                asked,
            )

    @property
    def in_memory(self) -> bool:
        return isinstance(self.splits["train"], TensorSplit)

    @property
    def on_disk(self) -> bool:
        """The training split is an image cache read from disk (``data.cache=disk``)."""
        return isinstance(self.splits["train"], MappedSplit)

    @property
    def test_split(self) -> str:
        """The split a run is finally tested on: test, or val when the dataset has none."""
        return "test" if self.splits["test"] is not None else "val"

    def follow_record(self, record: Any, source: Any, use: str = "evaluate it") -> None:
        """Normalise as the checkpoint ``source`` recorded (``record``: its checked
        :class:`utils.checkpoint.record.InputRecord`), not with statistics refitted to this data,
        once :meth:`check_encoded_as` passes."""
        self.check_encoded_as(record, source, use)
        if (list(record.mean), list(record.std)) != (list(self.mean), list(self.std)):
            log.info(
                "normalising with the statistics %s recorded, not those of %s as it is now",
                source,
                self.name,
            )
        self.mean, self.std = list(record.mean), list(record.std)

    def check_encoded_as(self, record: Any, source: Any, use: str) -> None:
        """Refuse data whose inputs, classes or table encoding differ from those the checkpoint
        ``source`` recorded: evaluating moved or new files, or distilling from a teacher, then
        feeds the trained model what it was trained on, never a silently re-mapped input."""
        kinds = (
            (record.targets.kind, record.targets.count),
            (self.targets.kind, self.targets.count),
        )
        for what, theirs, ours in (
            ("shape", list(record.input_shape), list(self.input_shape)),
            ("targets (kind, count)", *kinds),
            ("classes", record.classes, self.classes),
            ("table", _encoding(record.table), _encoding(self.table)),
        ):
            if theirs is not None and ours is not None and theirs != ours:
                shown = theirs if what != "table" else "its columns, categories and classes"
                raise UserError(
                    f"{source} was trained on {what} {shown}, and {self.name} holds "
                    f"other ones; {use} on data encoded as it was trained"
                )
        tables = (record.table, self.table)
        if None not in tables and _gap_fills(tables[0]) != _gap_fills(tables[1]):
            raise UserError(
                f"{source} filled a table's gaps with statistics of its own train "
                f"split, and {self.name}'s train split gives others; {use} with the "
                "train file it was trained on (data.split.test_path=... for new "
                "rows; predict.py fills rows' gaps as training did)"
            )

    def train_targets(self) -> torch.Tensor:
        """The train split's targets (for class weights, positive weights and the scale of
        regression targets)."""
        split = self.splits["train"]
        return split.labels if isinstance(split, TensorSplit | MappedSplit) else split.targets

    def sizes(self) -> dict[str, int]:
        return {name: len(split) for name, split in self.splits.items() if split is not None}

    def batches(
        self, split: str, placement: Placement, seed: int, train: bool | None = None
    ) -> TensorBatches | LoaderBatches:
        """Batches of ``split``, placed as ``placement`` says. Training batches (by default
        those of the train split) are shuffled and augmented, and the last partial one is
        dropped; evaluation batches hold every sample once, in order. Training batches are
        mixed when ``data.augment`` asks for MixUp/CutMix (data/mixing.py)."""
        if self.splits[split] is None:
            raise UserError(f"{self.name} has no {split} split; choose another split")
        train = split == "train" if train is None else train
        transform = BatchTransform(
            self.mean,
            self.std,
            placement.device,
            crop_padding=self.crop_padding if train else 0,
            horizontal_flip=self.horizontal_flip and train,
            channels_last=placement.channels_last,
        )
        batch_size = self.batch_size if train else self.eval_batch_size
        plan = BatchPlan(batch_size, train, seed, placement.rank, placement.world_size)
        if isinstance(self.splits[split], TensorSplit):
            batches = TensorBatches(self.splits[split], plan, transform)
        elif isinstance(self.splits[split], MappedSplit):
            batches = MappedBatches(self.splits[split], plan, transform)
        else:
            batches = LoaderBatches(self.splits[split], plan, transform, self.num_workers)
        if train and self.mixing:
            return MixedBatches(batches, self.mixing, self.num_classes, plan)
        return batches

    def batches_for(self, placement: Placement, seed: int) -> RunBatches:
        """A training run's batches for this process: train and val now, the test split's
        (:attr:`test_split`) when training is over."""
        return RunBatches(
            train=self.batches("train", placement, seed),
            val=self.batches("val", placement, seed),
            test=lambda: self.batches(self.test_split, placement, seed, train=False),
            train_in_order=lambda: self.batches("train", placement, seed, train=False),
        )


@dataclass(frozen=True)
class RunBatches:
    """A run's batches: ``train`` and ``val``, and ``test()`` and ``train_in_order()`` built
    once they are needed (so their tensors are not held on the device meanwhile)."""

    train: TensorBatches | LoaderBatches
    val: TensorBatches | LoaderBatches
    test: Callable[[], TensorBatches | LoaderBatches]
    # every train sample once, in order, unaugmented: trainer.swa's BatchNorm statistics
    train_in_order: Callable[[], TensorBatches | LoaderBatches]


def _encoding(table: dict | None) -> dict | None:
    """A table record's encoding (columns, categories, classes), without what was fitted to
    fill its gaps."""
    return None if table is None else {k: v for k, v in table.items() if k != "na"}


def _gap_fills(table: dict) -> tuple[dict, list]:
    """What a table record says its gaps were filled with (none for a record written before
    data.na existed, or with data.na=error)."""
    gaps = table.get("na") or {}
    return gaps.get("fills") or {}, gaps.get("indicators") or []


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
