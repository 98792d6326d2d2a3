"""In-memory batches: a seeded permutation an epoch and each batch a slice of it, normalised
and augmented (random crop, flip) as batched tensor ops on the training device.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from data.augmentation.images import Draws, ImageAugment, augmented, resized_crops
from data.batching.order import bucketed, member_orders, permutation, repeated
from data.batching.splits import MappedSplit, TensorSplit, shard, shard_bounds

SPATIAL = ("auto", "on", "off")  # data.augment.spatial: crops and flips for which models
MIN_PARTIAL_BATCH = 2  # a training epoch's last, partial batch is trained on from this size


log = logging.getLogger("torchloom")


@dataclass(frozen=True)
class Placement:
    """Where batches go: the device, its memory layout, this process's share (rank of
    world_size processes), and the model's members that each take training rows of their own
    (``members``: models/tabular/). One value for every split of a run, in train.py and
    evaluate.py."""

    device: torch.device
    channels_last: bool = False
    rank: int = 0
    world_size: int = 1
    members: int = 1


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """How one split is cut into batches: their size; for training (shuffled by ``seed``,
    augmented, the last partial batch kept when it can be trained on and ``keep_partial``) or
    evaluation (in order, every sample once); and this process's share."""

    batch_size: int
    train: bool
    seed: int
    rank: int = 0
    world_size: int = 1
    # False under gradient accumulation: a partial micro-batch would weigh its samples more
    # than a step of whole ones, and accumulation would no longer equal one larger batch.
    keep_partial: bool = True
    repeats: int = 1  # data.augment.repeats: copies of each sample in a row (training only)
    # An ensemble's members that each train on rows of their own (model.share_batches=false;
    # training only, data held whole): a batch's inputs [B, members, ...], its targets too.
    members: int = 1

    def batch_count(self, samples: int) -> int:
        """Batches of ``samples``: for training, the global batches of every process, the last
        one partial when it holds at least :data:`MIN_PARTIAL_BATCH` samples (one sample
        breaks BatchNorm), there is one process (under torchrun it is dropped, so that every
        process takes a step with samples of its own) and ``keep_partial``; for evaluation,
        ``samples`` is this process's share and its last batch may be partial."""
        if self.train:
            whole, rest = divmod(samples, self.batch_size * self.world_size)
            kept = self.keep_partial and self.world_size == 1 and rest >= MIN_PARTIAL_BATCH
            return whole + int(kept)
        return math.ceil(samples / self.batch_size)


class BatchTransform:
    """Normalisation (uint8 → float) and, for training batches, augmentation: batched tensor
    ops on the batch's device. Each kind of input makes its own (data/batching/inputs.py)."""

    pad_id: int | None = None  # token ids: the id that pads (data/text/inputs.py TokenIds)

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device,
        augment: ImageAugment | None = None,
        channels_last: bool = False,
        view: tuple[Sequence[int], float] | None = None,
    ) -> None:
        # Fold the /255 of uint8 pixels into the affine map: x_float = x * scale + shift (float
        # inputs, such as a CSV's features, are in their own units: no /255).
        std_t = torch.tensor(std, dtype=torch.float32, device=device)
        mean_t = torch.tensor(mean, dtype=torch.float32, device=device)
        self.scale = {True: 1.0 / (255.0 * std_t), False: 1.0 / std_t}  # by "is it uint8?"
        self.shift = -mean_t / std_t
        self.device = device
        self.augment_with = augment or ImageAugment()  # training batches' (data.augment)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.mean, self.std = mean_t, std_t  # what the image augmentation un-normalises by
        # Images: what the model takes ([H, W]) and evaluation's centre share; a split held
        # larger (data.cache_size) is cut to it by the resized crops, or evaluated by its centre.
        self.size, self.crop_pct = (tuple(view[0]), view[1]) if view else (None, 1.0)
        self.evaluating = augment is None

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (or float inputs) on the device → normalised floats, per channel (per
        feature for inputs of shape (F,)), without a second full-size copy."""
        per_channel = (1, -1) + (1,) * (images.dim() - 2)
        scale = self.scale[images.dtype == torch.uint8].view(per_channel)
        layout = self.memory_format if images.dim() == 4 else torch.contiguous_format
        images = images.to(self.device).to(torch.float32, memory_format=layout, copy=True)
        images = images.mul_(scale).add_(self.shift.view(per_channel))
        return self.fitted(images) if self.evaluating else images

    def fitted(self, images: torch.Tensor) -> torch.Tensor:
        """Images held larger than the model takes, seen as evaluation sees them: the centre
        ``crop_pct`` of the image resized to ``size`` (bilinear); others as they are."""
        if self.size is None or images.dim() != 4 or tuple(images.shape[-2:]) == self.size:
            return images
        height, width = images.shape[-2:]
        h, w = round(height * self.crop_pct), round(width * self.crop_pct)
        box = torch.tensor([(height - h) // 2, (width - w) // 2, h, w], device=images.device)
        out = resized_crops(images, box.expand(len(images), 4), self.size)
        return out.contiguous(memory_format=self.memory_format)

    def changes(self, shape: Sequence[int]) -> bool:
        """Whether :meth:`augment` changes a training batch of inputs of ``shape`` [N, ...]:
        something augments, or images held at another size are cut to the model's."""
        augment = self.augment_with
        if augment.crop_padding or augment.horizontal_flip or augment.on:
            return True
        return not (self.size is None or len(shape) != 4 or tuple(shape[-2:]) == self.size)

    def augment(
        self, images: torch.Tensor, seed: int, epoch: int, ids: torch.Tensor
    ) -> torch.Tensor:
        """Random crops (padded with 0, the dataset mean) and flips, then the ImageNet-style
        operations (data/augmentation/images.py), each sample's drawn by (``seed``, ``epoch``, its
        index in ``ids``); nothing is drawn when nothing augments."""
        augment = self.augment_with
        if augment.crop_padding == 0 and not augment.horizontal_flip and not augment.on:
            return self.fitted(images)
        draws = Draws.of(seed, epoch, ids.to(images.device))
        if augment.crop_padding > 0:
            images = random_crop(images, augment.crop_padding, draws)
        flip = draws.uniform(3) < 0.5 if augment.horizontal_flip else None
        if flip is not None and not augment.random_resized_crop:  # else the crop mirrors them
            images = torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)
        if augment.on:
            statistics = (self.mean, self.std)
            images = augmented(images, augment, statistics, draws, self.size, flip)
        return self.fitted(images).contiguous(memory_format=self.memory_format)


def random_crop(images: torch.Tensor, padding: int, draws: Draws) -> torch.Tensor:
    """Pad with zeros by ``padding`` and crop back at a random offset per image, as one gather."""
    n, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding))
    offsets = (draws.uniform(1, 2) * (2 * padding + 1)).long().clamp(max=2 * padding)
    dy, dx = offsets[:, 0], offsets[:, 1]
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

    def __init__(
        self,
        split: TensorSplit,
        plan: BatchPlan,
        transform: BatchTransform,
    ) -> None:
        if not plan.train:
            split = shard(split, plan.rank, plan.world_size)
        # Normalised once, up front: each batch is then a gather, as in a hand-written loop
        # (4 bytes a pixel instead of 1; datasets on this path fit in memory by definition).
        # Token ids (the transform's ``pad_id``: data=text) are indices, never normalised; each batch is
        # cut to its longest text, and training batches are drawn by length (order.bucketed).
        self.inputs = transform.normalize(split.inputs)
        pad_id = transform.pad_id
        self.lengths = None if pad_id is None else token_lengths(split.inputs, pad_id)
        self.labels = split.labels.to(transform.device)
        self.batch_size = plan.batch_size
        self.transform = transform
        self.train = plan.train  # shuffle and augment
        self.seed = plan.seed
        self.rank, self.world_size = plan.rank, plan.world_size
        self.plan = plan

    def __len__(self) -> int:
        return self.plan.batch_count(len(self.labels))

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.train and self.plan.members > 1:
            yield from self.member_epoch(epoch, start)
            return
        order, host_order = None, None
        if self.train:
            host_order = permutation(len(self.labels), self.seed, epoch)
            if self.lengths is not None:  # texts: batches of similar lengths
                global_batch = self.batch_size * self.world_size
                host_order = bucketed(host_order, self.lengths, global_batch, self.seed, epoch)
            host_order = repeated(host_order, self.plan.repeats)
            order = host_order.to(self.transform.device)
        # The step waits on this loop: what is the same for every batch is decided once. A
        # slot past the split's end is a sample's copy (data.augment.repeats): slot % n.
        inputs, targets, n, size = self.inputs, self.labels, len(self.labels), self.batch_size
        copies = self.plan.repeats > 1
        rank, world = (self.rank, self.world_size) if self.train else (0, 1)
        augments = self.train and self.transform.changes(inputs.shape)
        for lo in batch_starts(start, len(self), size, rank, world):
            hi = lo + size
            if order is None:
                images, labels = inputs[lo:hi], targets[lo:hi]
            else:
                rows = order[lo:hi]  # slots: a sample's copies differ in their draws
                samples = rows % n if copies else rows
                images, labels = inputs[samples], targets[samples]
            if self.lengths is not None:  # cut to the longest text, read on the host: no sync
                held = host_order[lo:hi] % n if order is not None else slice(lo, hi)
                images = images[:, : max(1, int(self.lengths[held].max()))]
            elif augments:  # each sample's draws, by (seed, epoch, its index)
                images = self.transform.augment(images, self.seed, epoch, rows)
            yield images, labels

    def member_epoch(self, epoch: int, start: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Training batches of k members that each draw their own rows (TabM's independent
        batches): row i of member m from member m's order of the epoch (order.member_orders),
        this process taking its rows of each member's global batch; inputs [B, k, F], targets
        [B, k, ...]. Only a table's model has members: nothing to augment."""
        n = len(self.labels)
        orders = member_orders(n, self.seed, epoch, self.plan.members)
        orders = torch.stack([repeated(order, self.plan.repeats) for order in orders])
        orders = orders.to(self.transform.device)
        for index in range(start, len(self)):
            lo, hi = batch_bounds(index, self.batch_size, self.rank, self.world_size)
            rows = orders[:, lo:hi].T % n  # [B, k]: a slot's sample (data.augment.repeats)
            yield self.inputs[rows], self.labels[rows]


def token_lengths(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Each row's length up to its last token that is not ``pad_id`` (texts are padded on the
    right), on the host."""
    held = ids.cpu() != pad_id
    last = held.flip(1).int().argmax(1)
    return torch.where(held.any(1), ids.shape[1] - last, 0)


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
        order = repeated(order, plan.repeats) if order is not None else None
        rank, world = (plan.rank, plan.world_size) if plan.train else (0, 1)
        for index in range(start, len(self)):
            lo, hi = batch_bounds(index, plan.batch_size, rank, world)
            rows = (
                order[lo:hi] if order is not None else torch.arange(lo, min(hi, len(self.labels)))
            )
            samples = rows % len(self.labels)  # a slot's sample (data.augment.repeats)
            pixels = torch.from_numpy(self.images[samples.numpy()])  # one gather from the file
            images = self.transform.normalize(pixels.to(device, non_blocking=True))
            labels = self.labels[samples].to(device, non_blocking=True)
            if plan.train:  # each sample's draws, by (seed, epoch, its index)
                images = self.transform.augment(images, plan.seed, epoch, rows)
            yield images, labels


def member_rows(members: int, train: bool, split: object, name: str) -> int:
    """How many members draw rows of their own from the batches of ``split`` (named ``name``):
    a model's ``members`` for training on a split held whole (:class:`TensorSplit`); otherwise
    1 (evaluation; a split read in batches, such as shards, read window by window for the one
    order: said in one line)."""
    held = split.held == "memory"
    if train and members > 1 and not held:
        log.info(
            "model.share_batches=false: the %s split is read in batches, not held whole, so "
            "the %d members share each batch",
            name,
            members,
        )
    return members if train and held else 1


def batch_bounds(index: int, batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows of this process's part of global batch ``index``."""
    lo = (index * world_size + rank) * batch_size
    return lo, lo + batch_size


def batch_starts(first: int, stop: int, batch_size: int, rank: int, world_size: int) -> range:
    """The first row of this process's part of each global batch from ``first`` to ``stop``
    (:func:`batch_bounds`'s ``lo``), as one range: no call per batch."""
    lo, _ = batch_bounds(first, batch_size, rank, world_size)
    return range(lo, stop * batch_size * world_size, batch_size * world_size)


# data.batch_size=auto: a tenth of the training set as a power of two, within these bounds.
# Small sets learn far better from many small batches (170 series: batch 16 reaches 0.95 test
# accuracy where batch 64 stops at 0.87-0.89, even with three times the steps).
AUTO_BATCH = (16, 64)


def fitted_batch_size(asked: int | str, samples: int, name: str) -> int:
    """``data.batch_size`` for a training split of ``samples``: ``auto`` chooses from its size
    (:data:`AUTO_BATCH`); a number larger than the split is fitted to it with one line."""
    if asked == "auto":
        low, high = AUTO_BATCH
        power = 2 ** (max(samples // 10, 1).bit_length() - 1)
        return min(max(low, min(high, power)), samples)
    if samples < asked:  # fitted, not refused: a small set is common
        log.info(
            "%s: data.batch_size=%d is more than the %d training samples: each batch is all of "
            "them",
            name,
            asked,
            samples,
        )
        return samples
    return asked
