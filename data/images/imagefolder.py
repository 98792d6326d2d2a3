"""Images in class folders: decoded once into a cache and batched by slicing (data.cache,
data/images/image_cache.py), or read lazily through a DataLoader (data.cache=off).

<root>/train/<class>/*.png|jpg|...
<root>/val/<class>/...
<root>/test/<class>/...      (optional; val is used for the final test when absent)

python train.py data=imagefolder data.root=/data/flowers data.image_size=[64,64]
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from PIL import Image
from torch.utils.data import Dataset

from data.batching.batches import BatchPlan, BatchTransform
from data.batching.dataset import Batching, Data, Splits, can
from data.batching.fingerprint import listing_sha256
from data.batching.folds import FoldIds, FoldPlan
from data.batching.loader import LoaderBatches
from data.batching.splits import rows_of
from data.batching.targets import Targets
from data.images.image_cache import MODES, ImageCache
from data.images.inputs import Pixels
from data.images.pixels import decoded, is_crop_pct
from utils.config.arguments import (
    POSITIVE_OR_NULL,
    Rule,
    check_values,
    one_of,
    pair_of_positive_ints,
)
from utils.errors import UserError

log = logging.getLogger("torchloom")

EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}


def find_classes(split_dir: Path) -> list[str]:
    if not split_dir.is_dir():
        raise UserError(
            f"image folder split not found: {split_dir} (expected {split_dir}/<class>/<images>)"
        )
    # A hidden folder (.ipynb_checkpoints/, a copy of the images beside them) is no class.
    classes = sorted(
        entry.name
        for entry in os.scandir(split_dir)
        if entry.is_dir() and not entry.name.startswith(".")
    )
    if not classes:
        raise UserError(f"no class folders in {split_dir} (expected {split_dir}/<class>/<images>)")
    return classes


class ImageList(Dataset):
    """(uint8 image [C, H, W], target) pairs of the files in ``samples``, decoded on access;
    ``root`` is what their cache key names them relative to (data/images/image_cache.py). A sample's
    label is a class index, or a tuple of floats (a 0/1 label-set row, or values): ``targets``
    holds them all as one tensor (data/batching/targets.py)."""

    held: ClassVar[str] = "files"

    def __init__(
        self,
        samples: list[tuple[str, Any]],
        root: Path,
        image_size: Sequence[int],
        channels: int,
        crop_pct: float = 1.0,
    ) -> None:
        self.samples, self.root = samples, root
        self.image_size = list(image_size)
        self.channels = channels
        self.crop_pct = crop_pct  # below 1: the centre of a larger resize (data.crop_pct)
        labels = [label for _, label in samples]
        rows = bool(labels) and isinstance(labels[0], tuple)
        self.targets = torch.tensor(labels, dtype=torch.float32 if rows else torch.long)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.channels, *self.image_size)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = decode(self.samples[index][0], self.image_size, self.channels, self.crop_pct)
        return image, self.targets[index]

    def batches(self, plan: BatchPlan, transform: BatchTransform, workers: int) -> LoaderBatches:
        """This split's batches, decoded by ``workers`` DataLoader processes (data.num_workers)."""
        return LoaderBatches(self, plan, transform, workers)

    @property
    def geometry(self) -> tuple[tuple[int, ...], float]:
        """How an image becomes pixels: the size decoded to and the centre share kept."""
        return tuple(self.image_size), self.crop_pct


def folder_samples(split_dir: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(file, label) of the images of ``split_dir/<class>/``, labelled by their folder's place
    in ``classes``."""
    unknown = sorted(set(find_classes(split_dir)) - set(classes))
    if unknown:
        raise UserError(f"{split_dir} has class folders not in train/: {unknown}")
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        folder = split_dir / name
        if not folder.is_dir():
            continue  # a class may be absent from val/test
        files = sorted(  # hidden files (macOS's ._name.png) are not images
            entry.path
            for entry in os.scandir(folder)
            if entry.is_file()
            and Path(entry.name).suffix.lower() in EXTENSIONS
            and not entry.name.startswith(".")
        )
        if not files:
            raise UserError(f"empty class folder: {folder} has no {'/'.join(EXTENSIONS)} files")
        samples += [(path, label) for path in files]
    return samples


# PIL modes that hold one grey channel (with or without alpha, at any depth).
GREY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"}


def is_grey(path: str) -> bool:
    """Whether the image at ``path`` has one channel, read from its header (no pixels are
    decoded): a grey mode, or a palette of greys only. An unreadable file counts as colour;
    decoding it names it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
        with image:  # a bomb: decode() refuses
            if image.mode == "P":
                palette = image.getpalette() or []
                return all(
                    palette[i] == palette[i + 1] == palette[i + 2]
                    for i in range(0, len(palette) - 2, 3)
                )
            return image.mode in GREY_MODES
    except Exception:  # a hostile or broken file: decode() refuses it by name later
        return False


def choose_channels(channels: int | str, train: list[tuple[str, Any]], name: str) -> int:
    """``data.channels``, with ``auto`` chosen from the train split's images: 1 when every one
    is grey, else 3 (RGB; a grey image then repeats its channel), said in the log."""
    if channels != "auto":
        return int(channels)
    colour = next((i for i, (path, _) in enumerate(train) if not is_grey(path)), None)
    if colour is None:  # every file was read: a grey folder
        log.info("%s: data.channels=auto chose 1 (every training image is grey)", name)
        return 1
    if colour > 0:  # the scan stops at the first colour image: an RGB folder costs one read
        log.info(
            "%s: data.channels=auto chose 3 (RGB): some training images are grey and "
            "some colour (%s), so the grey ones are read as RGB",
            name,
            train[colour][0],
        )
    else:
        log.info("%s: data.channels=auto chose 3 (RGB images)", name)
    return 3


def decode(
    path: str, image_size: Sequence[int], channels: int, crop_pct: float = 1.0
) -> torch.Tensor:
    """One image file as uint8 [C, H, W], resized to ``image_size`` (data/images/pixels.py)."""
    return decoded(path, image_size, channels, path, crop_pct)


def check_image_keys(image_size: Any, channels: Any, cache: Any, cache_max_gb: Any) -> None:
    """The keys every image dataset shares (data=imagefolder, data=image_csv), in one line each."""
    check_values(
        "data",
        {
            "image_size": image_size,
            "channels": channels,
            "cache": cache,
            "cache_max_gb": cache_max_gb,
        },
        {
            "image_size": pair_of_positive_ints(),
            "channels": one_of(1, 3, "auto"),
            "cache": one_of(*MODES),
            "cache_max_gb": POSITIVE_OR_NULL,
        },
    )


def geometries(image_size: Any, batching: dict) -> dict[str, tuple[list[int], float]]:
    """Each split's (size decoded to, centre share kept), from ``data.cache_size`` and
    ``data.crop_pct`` (popped from ``batching``; configs stored before them get null and 1):
    evaluation splits are ``image_size``'s centre ``crop_pct`` (timm's resize and centre crop);
    the train split is the same view, or, under ``data.augment.random_resized_crop``, the whole
    image at ``cache_size`` for the crops to cut from, at ``image_size`` or larger."""
    cache_size = batching.pop("cache_size", None)
    crop_pct = batching.pop("crop_pct", 1.0)
    check_values(
        "data",
        {"cache_size": cache_size, "crop_pct": crop_pct},
        {
            "cache_size": Rule(
                lambda v: v is None or pair_of_positive_ints().test(v),
                "[height, width] of at most 4,096 x 4,096 pixels, or null",
            ),
            "crop_pct": Rule(is_crop_pct, "between 0.1 and 1"),
        },
    )
    resized_crops = bool((batching.get("augment") or {}).get("random_resized_crop"))
    if cache_size is not None:
        if not resized_crops:
            raise UserError(
                f"data.cache_size={list(cache_size)} stores images larger than data.image_size "
                "for random resized crops to cut from; set data.augment.random_resized_crop=true, "
                "or data.cache_size=null"
            )
        if cache_size[0] < image_size[0] or cache_size[1] < image_size[1]:
            raise UserError(
                f"data.cache_size={list(cache_size)} must be at least data.image_size="
                f"{list(image_size)} in each side (crops are cut from it)"
            )
    evaluated = (list(image_size), float(crop_pct))
    trained = (list(cache_size or image_size), 1.0) if resized_crops else evaluated
    if cache_size is not None or crop_pct != 1:
        outer = "x".join(str(math.floor(side / crop_pct)) for side in image_size)
        log.info(
            "images: the train split at %s%s; evaluation sees the centre %s of a %s resize",
            "x".join(map(str, trained[0])),
            " (random resized crops cut from it)" if resized_crops else "",
            crop_pct,
            outer,
        )
    return {"train": trained, "val": evaluated, "test": evaluated}


@can("folds")
def load_imagefolder(
    root: str,
    image_size: Sequence[int],
    channels: int | str,
    cache: str = "auto",
    cache_max_gb: float | None = None,
    cache_dir: str | None = None,
    split: Mapping[str, Any] | None = None,
    **batching,
) -> Data:
    """``channels``: 1, 3 or ``auto`` (:func:`choose_channels`); ``mean`` and ``std`` in
    ``batching`` may be ``auto``, the train split's own (:func:`held_data`). ``cache``: how the
    decoded images are held (data/images/image_cache.py): ``auto``, ``memory``,
    ``disk`` or ``off``; ``cache_max_gb``: the memory ``auto`` may use (null: half of what is
    available); ``cache_dir``: where cache files go (null: ``<root>/.torchloom-cache``).
    ``batching`` holds the keys of :class:`data.batching.dataset.Batching`; ``num_workers``, the
    decoding processes, is null for one per core, at most 8. ``split``: the fold keys
    (data/batching/folds.py): with ``folds``, train/ and val/ (when there is one) are pooled and val is a
    fold of them; the test is test/, or without one the ``split.test`` share held out first.
    Configs stored before the cache or folds existed get their defaults."""
    check_image_keys(image_size, channels, cache, cache_max_gb)
    geometry = geometries(image_size, batching)
    base = Path(root)
    if not base.is_dir():
        raise UserError(
            f"image folder root not found: {base} (set data.root=<folder with train/ and val/>)"
        )
    classes = find_classes(base / "train")
    plan = FoldPlan.of(split, True, (split or {}).get("seed", 0))
    samples = {
        name: folder_samples(base / name, classes)
        for name in ("train", "val", "test")
        if name == "train" or (base / name).is_dir() or (name == "val" and plan.folds is None)
    }
    if plan.folds is not None:  # val: a fold of train/ and val/
        samples, fold_files = _fold_samples(samples, plan, (split or {}).get("test", 0.15))
    channels = choose_channels(channels, samples["train"], f"imagefolder {base}")
    files = {
        name: ImageList(rows, base / name, *geometry[name][:1], channels, geometry[name][1])
        for name, rows in samples.items()
    }
    folder = Path(cache_dir) if cache_dir else base / ".torchloom-cache"
    cache_settings = {
        "mode": cache,
        "max_gb": cache_max_gb,
        "folder": folder,
        "prefix": "",
        "source": base,
    }
    folds = plan.folds is not None
    data = held_data(f"imagefolder {base}", files, classes, cache_settings, batching, folds)
    if plan.folds is not None:  # cv=K's oof.csv names each val image by its file under root
        data.fold_ids = FoldIds(plan.fold, [os.path.relpath(f, base) for f in fold_files])
    return data


def _fold_samples(
    samples: dict[str, list], plan: FoldPlan, test_share: float
) -> tuple[dict[str, list], list[str]]:
    """train/ and val/ pooled and cut into fold ``plan.fold`` (val) and the rest (train); the
    test folder's images, or the ``test_share`` held out of the pool first. Returns the
    samples by split and the val images' files."""
    pool = samples["train"] + samples.get("val", [])
    given_test = "test" in samples
    sizes = {} if given_test else {"test": max(1, round(test_share * len(pool)))}
    parts = plan.parts(len(pool), sizes, [label for _, label in pool])
    cut = {name: [pool[i] for i in part.tolist()] for name, part in parts.items()}
    cut["test"] = samples["test"] if given_test else cut["test"]
    return cut, [file for file, _ in cut["val"]]


def pooled(
    files: dict[str, ImageList], geometry: tuple[Sequence[int], float]
) -> tuple[ImageList, dict[str, torch.Tensor]]:
    """Every image of the splits ``files``, decoded as ``geometry`` says (ImageList.geometry),
    in one order that does not depend on how they are split (by file, then label), and each
    split's rows in it. Each fold of ``cv=K`` cuts the same images differently, so one cache of
    them all serves every fold: the folder is decoded once (once per view: training's and
    evaluation's differ under ``data.cache_size``), not once a fold (and a fold's cache never
    evicts another's)."""
    every = sorted({(path, label) for images in files.values() for path, label in images.samples})
    row = {sample: at for at, sample in enumerate(every)}
    lists = list(files.values())
    root = Path(os.path.commonpath([str(images.root) for images in lists]))
    pool = ImageList(every, root, geometry[0], lists[0].channels, geometry[1])
    parts = {
        name: torch.tensor([row[sample] for sample in images.samples], dtype=torch.long)
        for name, images in files.items()
    }
    return pool, parts


def held_data(
    name: str,
    files: dict,
    classes: list[str] | Targets,
    cache: dict,
    batching: dict,
    folds: bool = False,
) -> Data:
    """Image ``files`` by split (train, val, optional test), held as ``cache`` says (data.cache
    as ``mode``, ``max_gb``, the cache ``folder``, a ``prefix`` for its file names and the
    ``source`` the images are listed by, an image folder or a manifest): decoded
    once into a cache, or read lazily. ``mean`` or ``std`` ``auto`` in ``batching`` is the train
    split's own, computed from the pixels it holds. ``classes``: the class names, or the :class:`Targets`
    of label sets or values. ``num_workers`` null is one per core, at most 8. ``folds``: the
    splits are one fold's cut of the same images (``cv=K``), cached together (:func:`pooled`)."""
    if batching.get("num_workers") is None:
        batching["num_workers"] = min(8, os.cpu_count() or 1)
    held = ImageCache(
        cache["mode"], cache["max_gb"], cache["folder"], batching["num_workers"], cache["source"]
    )
    listings = {
        name: listing_sha256(images.samples, str(images.root)) for name, images in files.items()
    }
    if folds and cache["mode"] != "off":  # cv=K: one cache for every fold (:func:`pooled`)
        splits = {}
        for geometry in {images.geometry for images in files.values()}:  # a cache per view
            pool, rows = pooled(files, geometry)
            whole = held.hold(
                cache["prefix"] + "pool", pool, listing_sha256(pool.samples, str(pool.root))
            )
            splits |= {
                split: rows_of(whole, part)
                for split, part in rows.items()
                if files[split].geometry == geometry
            }
    else:
        splits = {
            name: held.hold(cache["prefix"] + name, images, listings[name])
            for name, images in files.items()
        }
    splits = Splits(splits["train"], splits["val"], splits.get("test"))
    if "auto" in (batching["mean"], batching["std"]):  # the train split's own, per channel
        mean, std = held.statistics(splits.train, cache["prefix"] + "train")
        batching["mean"] = mean if batching["mean"] == "auto" else batching["mean"]
        batching["std"] = std if batching["std"] == "auto" else batching["std"]
        shown = [[round(v, 4) for v in batching[key]] for key in ("mean", "std")]
        log.info(
            "%s: data.mean/std=auto: mean %s, std %s (of the %d training images)",
            name,
            *shown,
            len(splits.train),
        )
    count = classes.count if isinstance(classes, Targets) else len(classes)
    image_size, crop_pct = files["val"].geometry  # evaluation's view (data.crop_pct)
    data = Data(
        name, splits, count, Batching(**batching), classes, inputs=Pixels(crop_pct=crop_pct)
    )
    data.listings = listings
    data.evaluated_at(image_size)
    return data
