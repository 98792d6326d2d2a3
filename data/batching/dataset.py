"""What every dataset builder returns (:class:`Data`: the splits, their targets, how they are
batched), and a run's batches of it.

Four paths give batches through one interface (``len(batches)``, ``batches.epoch(epoch,
start)``): held in memory and sliced, memory-mapped, decoded by DataLoader workers, or read
ahead from shards. Normalisation and augmentation run as batched tensor ops on the device, and
a batch is a pure function of (seed, epoch, batch index), each sample's draws of (seed, epoch,
its index): a run can start at any batch of any epoch without replaying the ones before it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from data.augmentation.images import ImageAugment
from data.augmentation.mixing import MixedBatches, Mixing
from data.batching.batches import (
    SPATIAL,
    BatchPlan,
    MappedBatches,
    Placement,
    TensorBatches,
    fitted_batch_size,
    member_rows,
)
from data.batching.fingerprint import decoded_hashes, membership, sample_hashes
from data.batching.inputs import HINTS, Inputs
from data.batching.loader import LoaderBatches
from data.batching.splits import MappedSplit, TensorSplit, joined
from data.batching.targets import Targets
from utils.config.arguments import POSITIVE_INT, check_values, one_of
from utils.errors import UserError

log = logging.getLogger("torchloom")


# What a data builder may declare it can do, besides reading its splits (:func:`can`):
# ``folds``: its val split is held out of its samples, so cv=K folds train ∪ val
# (utils/run/cross_validation.py); ``refits``: refit=auto trains it again on train ∪ val once
# the run has chosen its epochs (utils/run/refit.py).
CAPABILITIES = ("folds", "refits")


def can(*capabilities: str):
    """Declare, next to a data builder, what it can do (:data:`CAPABILITIES`)."""
    unknown = set(capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {CAPABILITIES}")

    def declare(builder):
        builder.capabilities = frozenset(capabilities)
        return builder

    return declare


def capabilities_of(builder: Any) -> frozenset[str]:
    """What the data builder declared it can do (nothing, if it declared nothing)."""
    return getattr(builder, "capabilities", frozenset())


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

    batch_size: int | str  # or auto (fitted_batch_size)
    eval_batch_size: int
    mean: Sequence[float]
    std: Sequence[float]
    augment: Mapping
    num_workers: int = 0

    def __post_init__(self) -> None:
        sizes = {"batch_size": self.batch_size, "eval_batch_size": self.eval_batch_size}
        if self.batch_size == "auto":
            del sizes["batch_size"]
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
        *,
        inputs: Inputs,
    ) -> None:
        """``num_classes``: the width of the model's output (classes, labels or values);
        ``classes``: the class names, or the :class:`Targets` of label sets or values;
        ``inputs``: the kind of input the splits hold (data/batching/inputs.py), which answers
        every question that depends on it."""
        self.name = name
        self.inputs = inputs
        self.targets = (
            classes
            if isinstance(classes, Targets)
            else Targets("classes", num_classes, tuple(classes) if classes is not None else None)
        )
        self.classes = self.targets.class_names  # what a checkpoint's inputs record calls them
        # Image files by split: the sha256 of their listing (data/batching/fingerprint.py
        # listing_sha256), what a split read lazily is compared by on resume.
        self.listings: dict[str, str] = {}
        # Shards by split: each object's footprint by name, so a change names its objects.
        self.objects: dict[str, dict[str, str]] = {}
        self.splits = {"train": splits.train, "val": splits.val, "test": splits.test}
        self.num_classes = self.targets.count
        self.fold_ids = None  # data/batching/folds.py FoldIds: data.split.folds's val samples
        self.input_shape = splits.train.input_shape  # (C, H, W)
        self.mean, self.std = _per_channel(batching, self.input_shape[0], name)
        self.batch_size = fitted_batch_size(batching.batch_size, len(splits.train), name)
        self.eval_batch_size = batching.eval_batch_size
        self._set_augmentation(batching.augment, name)
        self.num_workers = batching.num_workers
        for split_name, split in self.splits.items():
            if isinstance(split, TensorSplit):
                self.targets.check(split.labels, f"{name} {split_name} split")

    def _set_augmentation(self, augment: Mapping, name: str) -> None:
        """``data.augment``: crops and flips (images only; ``spatial``), MixUp and CutMix
        (CutMix on images only), checked against the inputs' shape."""
        self.crop_padding = int(augment["crop_padding"])
        self.horizontal_flip = bool(augment["horizontal_flip"])
        # Configs stored before data.augment.spatial existed crop and flip as they asked.
        self.spatial = augment.get("spatial", "on")
        check_values("data.augment", {"spatial": self.spatial}, {"spatial": one_of(*SPATIAL)})
        if self.spatial == "off":
            self.crop_padding, self.horizontal_flip = 0, False
        if (self.crop_padding or self.horizontal_flip) and len(self.input_shape) != 3:
            raise UserError(
                f"data.augment.crop_padding and horizontal_flip crop and flip images, and "
                f"{name}'s inputs are {tuple(self.input_shape)}, not (C, H, W); turn them off"
            )
        self.images = ImageAugment.from_augment(augment, self.input_shape, name)  # crops, colours
        self.mixing = Mixing.from_augment(augment)  # MixUp/CutMix; None when off
        if self.mixing and self.mixing.cutmix_alpha > 0 and len(self.input_shape) != 3:
            raise UserError(
                f"data.augment.cutmix_alpha={self.mixing.cutmix_alpha}: CutMix pastes image "
                f"boxes, and {name}'s inputs are {tuple(self.input_shape)}, not (C, H, W); "
                "set it to 0 (MixUp works on any input)"
            )

    def evaluated_at(self, image_size: Sequence[int]) -> None:
        """Images: what the model takes is ``image_size`` (evaluation's view: data.crop_pct,
        data/images/inputs.py); the train split may be held larger (data.cache_size), for
        random resized crops to cut ``image_size`` from."""
        self.input_shape = (self.input_shape[0], *image_size)

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

    def model_hints(self) -> dict[str, Any]:
        """What this data hands a model's builder besides its shapes (data/batching/inputs.py
        HINTS; None where the kind of input has none)."""
        hints = self.inputs.model_hints(self.input_shape, self.splits["train"], self.mean, self.std)
        return {**dict.fromkeys(HINTS), **hints}

    @property
    def in_memory(self) -> bool:
        return isinstance(self.splits["train"], TensorSplit)

    @property
    def on_disk(self) -> bool:
        """The training split is an image cache read from disk (``data.cache=disk``)."""
        return isinstance(self.splits["train"], MappedSplit)

    @property
    def from_shards(self) -> bool:
        """The training split is read from Parquet shards a row group at a time."""
        return self.splits["train"].held == "shards"

    @property
    def test_split(self) -> str:
        """The split a run is finally tested on: test, or val when the dataset has none."""
        return "test" if self.splits["test"] is not None else "val"

    def follow_record(
        self, record: Any, source: Any, use: str = "evaluate it", fills: bool = True
    ) -> None:
        """Normalise as the checkpoint ``source`` recorded (``record``: its checked
        :class:`utils.checkpoint.record.InputRecord`), not with statistics refitted to this data,
        once :meth:`check_encoded_as` passes (its gap fills compared unless not ``fills``)."""
        self.check_encoded_as(record, source, use, fills)
        if (list(record.mean), list(record.std)) != (list(self.mean), list(self.std)):
            log.info(
                "normalising with the statistics %s recorded, not those of %s as it is now",
                source,
                self.name,
            )
        self.mean, self.std = list(record.mean), list(record.std)
        self.inputs = self.inputs.following(record.inputs)

    def check_encoded_as(self, record: Any, source: Any, use: str, fills: bool = True) -> None:
        """Refuse data whose inputs, classes or encoding (a table's, and its gap ``fills``)
        differ from those the checkpoint ``source`` recorded: evaluating moved or new files, or
        distilling from a teacher, then feeds the trained model what it was trained on, never a
        silently re-mapped input."""
        kinds = (
            (record.targets.kind, record.targets.count),
            (self.targets.kind, self.targets.count),
        )
        for what, theirs, ours in (
            ("shape", list(record.input_shape), list(self.input_shape)),
            ("targets (kind, count)", *kinds),
            ("classes", record.classes, self.classes),
        ):
            if theirs is not None and ours is not None and theirs != ours:
                raise UserError(
                    f"{source} was trained on {what} {theirs}, and {self.name} holds "
                    f"other ones; {use} on data encoded as it was trained"
                )
        self.inputs.check_encoded_as(record.inputs, source, self.name, use, fills)

    def train_targets(self) -> torch.Tensor:
        """The train split's targets (class weights, positive weights, a regression's scale)."""
        split = self.splits["train"]
        return split.labels if isinstance(split, TensorSplit | MappedSplit) else split.targets

    def fingerprint(self, decode: bool = False) -> dict[str, Any]:
        """What this data is, by content (data/batching/fingerprint.py): ``splits`` (each split's
        membership sha256 and count), ``sources`` (the content's sha256), ``samples`` (per-sample
        hashes, in checkpoints only), ``listings`` (image files' names, sizes, times). A split
        read lazily (no image cache) is recorded by its listing alone, unless ``decode``."""
        samples = {
            n: self.split_hashes(n, decode) for n, split in self.splits.items() if split is not None
        }
        lazy = [name for name, hashes in samples.items() if hashes is None]
        samples = {name: hashes for name, hashes in samples.items() if hashes is not None}
        splits = {n: {"sha256": membership(h), "count": len(h)} for n, h in samples.items()}
        content = hashlib.sha256(" ".join(s["sha256"] for s in splits.values()).encode())
        source = {"content_sha256": content.hexdigest(), "samples": sum(map(len, samples.values()))}
        if lazy:
            source = {"unavailable": f"the {', '.join(lazy)} split is read lazily ({self.lazily})"}
        record = {"sources": {self.name: source}, "splits": splits, "samples": samples}
        objects = {"objects": dict(self.objects)} if self.objects else {}
        return {**record, "listings": dict(self.listings), **objects}

    @property
    def lazily(self) -> str:
        """How a split read lazily is read, in the keys of this kind of data."""
        return "from shards, a row group at a time" if self.from_shards else "data.cache=off"

    def split_hashes(self, name: str, decode: bool = False) -> torch.Tensor | None:
        """Each sample's content hash in split ``name``: stored with its image cache, or
        computed from the tensors held; a split read lazily is decoded for it only when
        ``decode`` (evaluate.py reads every image anyway), else None."""
        split = self.splits.get(name)
        if getattr(split, "hashes", None) is not None:  # stored with a cache, or a stream's
            return split.hashes
        if isinstance(split, TensorSplit | MappedSplit):
            inputs = split.inputs if isinstance(split, TensorSplit) else split.images
            return sample_hashes(inputs, split.labels)
        lazy = split is not None and decode and split.held == "files"  # by listing
        return decoded_hashes(split) if lazy else None

    def join_val(self) -> None:
        """A refit's ``trainer.train_on_val``: val trained on too; batch size, scale, model as fitted."""
        self.inputs = self.inputs.fixed(self.splits["train"])
        self.splits["train"] = joined(self.splits, "trainer.train_on_val")

    def sizes(self) -> dict[str, int]:
        return {name: len(split) for name, split in self.splits.items() if split is not None}

    def batches(
        self,
        split: str,
        placement: Placement,
        seed: int,
        train: bool | None = None,
        keep_partial: bool = True,
    ) -> TensorBatches | LoaderBatches:
        """Batches of ``split``, as ``placement`` says: for training (the train split's by default)
        shuffled, augmented, mixed if ``data.augment`` asks (MixUp/CutMix), the last partial
        batch kept unless of one sample or several processes; for evaluation, each sample once."""
        if self.splits[split] is None:
            raise UserError(f"{self.name} has no {split} split; choose another split")
        train = split == "train" if train is None else train
        crops = {"crop_padding": self.crop_padding, "horizontal_flip": self.horizontal_flip}
        augment = dataclasses.replace(self.images, **crops) if train else None  # data.augment
        transform = self.inputs.transform(
            self.mean,
            self.std,
            placement.device,
            shape=self.input_shape,
            augment=augment,
            channels_last=placement.channels_last,
        )
        batch_size = self.batch_size if train else self.eval_batch_size
        repeats = self.images.repeats if train else 1  # data.augment.repeats
        own = member_rows(placement.members, train, self.splits[split], split)  # share_batches
        rank, world = placement.rank, placement.world_size
        plan = BatchPlan(
            batch_size=batch_size,
            train=train,
            seed=seed,
            rank=rank,
            world_size=world,
            keep_partial=keep_partial,
            repeats=repeats,
            members=own,
        )
        if isinstance(self.splits[split], TensorSplit):
            batches = TensorBatches(self.splits[split], plan, transform)
        elif isinstance(self.splits[split], MappedSplit):
            batches = MappedBatches(self.splits[split], plan, transform)
        else:  # a split that reads itself: shards read ahead, image files decoded by workers
            batches = self.splits[split].batches(plan, transform, self.num_workers)
        if train and self.mixing:
            return MixedBatches(batches, self.mixing, self.num_classes, plan)
        return batches

    def batches_for(self, placement: Placement, seed: int, accumulate: int = 1) -> RunBatches:
        """A training run's batches for this process: train and val now, the test split's
        (:attr:`test_split`) when training is over. Under gradient ``accumulate``-ion, the
        train split's last partial batch is dropped (data/batching/batches.py BatchPlan)."""
        return RunBatches(
            train=self.batches("train", placement, seed, keep_partial=accumulate == 1),
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


def _per_channel(batching: Batching, channels: int, name: str) -> tuple[list, list]:
    """``data.mean`` and ``data.std``, one value each or one per channel: one per channel."""
    mean, std = list(batching.mean), list(batching.std)
    mean = mean * channels if len(mean) == 1 else mean
    std = std * channels if len(std) == 1 else std
    if len(mean) != channels or len(std) != channels:
        wanted = "one value each" if channels == 1 else f"1 value each, or {channels}"
        raise UserError(
            f"data.mean has {len(mean)} values and data.std {len(std)}, but {name} has "
            f"{channels} channel(s): give {wanted} (data.mean=[...] data.std=[...])"
        )
    return mean, std
