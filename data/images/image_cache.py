"""Image folders at in-memory speed: each image is decoded once, resized to ``data.image_size``,
as uint8, into one cache file per split; from then on batches are slices, as for MNIST.

``data.cache``:

- ``memory``: the whole split as one uint8 tensor, on the whole-tensor path of MNIST and
  CIFAR-10 (seeded permutation, slicing, augmentation as batched tensor ops on the device);
- ``disk``: the cache file memory-mapped, read in slices of the same seeded order;
- ``auto`` (the default): ``memory`` when the split fits in ``data.cache_max_gb``, else ``disk``;
- ``off``: no cache, the DataLoader path (every epoch decodes every file in worker processes).

The cache file is ``<data.cache_dir>/<split>-<C>x<H>x<W>-<source>-<key>.u8`` (``cache_dir``
defaults to ``<data.root>/.torchloom-cache``; ``manifest-`` before ``<split>`` for
``data=image_csv``; ``pool`` for every split at once under ``cv=K``, whose folds are rows of
it). ``<source>`` names the image folder (or manifest) the cache is of (:func:`source_id`: a
folder moved with its cache keeps it). Its key covers the sorted file list with sizes and
modification times, the labels, ``image_size``, channels and this module's format version, so
a changed, added or removed file builds a new cache (and says so) and the stale one of the
same source is removed. Each start checks every cached image against the hash written with it
(a byte changed on the disk), then decodes a few random images and compares them with the
cache's: a file that differs (damaged, planted, or written by other code) is rebuilt with a
warning. A
cache is built into a temporary file and renamed; a killed build's temporary file is removed
by the next, and a stop signal ends a build within a batch of images. A short or corrupt file
is rebuilt with a warning; an unwritable folder falls back to decoding into memory (or the
DataLoader path) with one warning; a full disk leaves no partial file and says so.

A cached image is exactly what the DataLoader path decodes (:func:`data.images.imagefolder.decode`),
so a cached and an uncached run see bitwise the same batches in the same order.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch.utils.data import Dataset

from data.batching.fingerprint import sample_hashes
from data.batching.loader import decoding_loader, end_workers, reraised
from data.batching.splits import MappedSplit, TensorSplit, pixel_statistics
from utils.errors import UserError
from utils.files import atomic_file, remove_stale_temporary_files
from utils.system.distributed import Unwritable, once_per_machine
from utils.system.memory import memory_budget
from utils.system.signals import Interrupted, stop_requested

log = logging.getLogger("torchloom")

FORMAT_VERSION = 4  # 4: each sample's content hash after the pixels; 3: named by source
MAGIC = b"TLCACHE1"
HEADER_BYTES = 4096  # magic, then the JSON header, padded; the pixels follow
MODES = ("auto", "memory", "disk", "off")
# <split>-<C>x<H>x<W>-<source>-<key>.u8 (pool: every split's images, for cv=K's folds); the
# manifest- prefix for data=image_csv
CACHE_NAME = re.compile(
    r"(manifest-)?(train|val|test|pool)-\d+x\d+x\d+-[0-9a-f]{8}-[0-9a-f]{20}\.u8"
)
VALUES_PER_CHUNK = 2**24  # pixel values a statistics pass holds as float64 at once (128 MiB)
SAMPLES_CHECKED = 8  # images decoded again each start and compared with the cache's pixels
DECODED_AT_ONCE = 64  # images a worker decodes between two looks for a stop signal
HASHED_AT_ONCE = 32 * 2**20  # pixel bytes of decoded batches hashed in one call
# What the memory path holds: the uint8 split and its float32 normalised copy, 5 bytes a pixel.
BYTES_HELD_PER_PIXEL = 5
AUTO_CHOSE = "%s: data.cache=auto chose %s: %.1f MB held is %s the %.1f MB left of its budget"


class ImageCache:
    """How ``load_imagefolder`` holds each split: ``mode`` (one of :data:`MODES`), the memory
    budget in GB (null: :data:`DEFAULT_MEMORY_SHARE` of what is available), the cache folder
    and the decoding processes used to build it. Splits held in memory share the budget."""

    def __init__(
        self, mode: str, max_gb: float | None, folder: Path, workers: int, source: Path
    ) -> None:
        self.mode, self.folder, self.workers = mode, folder, workers
        self.free = memory_budget(max_gb) if mode == "auto" else math.inf
        self.source = source_id(source, folder)

    def hold(self, name: str, files: Dataset, listing: str) -> Dataset | TensorSplit | MappedSplit:
        """Split ``name`` (whose files' listing is ``listing``) as the mode says."""
        if self.mode == "off":
            return files
        needed = len(files) * math.prod(files.input_shape) * BYTES_HELD_PER_PIXEL
        in_memory = self.mode == "memory" or (self.mode == "auto" and needed <= self.free)
        if self.mode == "auto":  # which it chose, and why
            where, fits = ("memory", "within") if in_memory else ("disk", "over")
            log.info(AUTO_CHOSE, name, where, needed / 1e6, fits, self.free / 1e6)
        shape = "x".join(map(str, files.input_shape))
        path = self.folder / f"{name}-{shape}-{self.source}-{cache_key(files, listing)}.u8"
        try:
            once_per_machine(lambda: self._cached(name, files, path))
        except Unwritable as error:
            if not in_memory:
                why = "data.cache=disk" if self.mode == "disk" else "over data.cache_max_gb"
                log.warning(
                    "warning: %s (%s), and the %s split is not held in memory (%s); "
                    "reading it with the DataLoader",
                    error,
                    self.folder,
                    name,
                    why,
                )
                return files
            log.warning(
                "warning: %s (%s); the %s split is decoded into memory without a cache file",
                error,
                self.folder,
                name,
            )
            return decode_all(files, self.workers, name)
        if in_memory:
            self.free -= needed
            return read_whole(path, files)
        return map_file(path, files)

    def _cached(self, name: str, files: Dataset, path: Path) -> None:
        """Make ``path`` the valid cache file of ``files``: built if missing, stale or broken.
        Raises :class:`Unwritable` when it would be built but cannot be."""
        if path.is_file():
            problem = check_file(path, files)
            if problem is None:
                return
            log.warning("warning: cache %s is %s; rebuilding it", path, problem)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not os.access(self.folder, os.W_OK):
                raise PermissionError(errno.EACCES, "not writable")
        except OSError as error:
            raise Unwritable(
                f"data.cache_dir cannot be written: {error.strerror or error}"
            ) from None
        remove_stale_temporary_files(self.folder, ".u8")  # of builds that were killed
        prefix = path.name.rsplit("-", 1)[0]  # <split>-<shape>-<source>: others are kept
        stale = [
            p
            for p in sorted(self.folder.glob(f"{prefix}-*.u8"))
            if p != path and CACHE_NAME.fullmatch(p.name) and not p.is_symlink()
        ]
        if stale:
            log.info(
                "%s: the image folder changed since %s was built; building a new cache",
                name,
                stale[-1].name,
            )
        build_file(path, files, self.workers, name)
        for old in stale:
            old.unlink(missing_ok=True)  # only our own <split>-<shape>-<key>.u8 files

    def statistics(self, split: Any, name: str) -> tuple[list[float], list[float]]:
        """Mean and std of each channel of the ``split`` as held (in [0, 1] pixel units, as
        ``data.mean`` and ``data.std``): one pass over its uint8 pixels, in chunks, summed in
        float64; a split read lazily (``data.cache=off``) is decoded once for it."""
        step = max(1, VALUES_PER_CHUNK // math.prod(split.input_shape))
        if isinstance(split, TensorSplit):
            chunks: Iterator[torch.Tensor] = (
                split.inputs[i : i + step] for i in range(0, len(split), step)
            )
        elif isinstance(split, MappedSplit):
            chunks = (
                torch.from_numpy(np.array(split.images[i : i + step]))
                for i in range(0, len(split), step)
            )
        else:
            chunks = decoded_batches(split, self.workers, name, "for data.mean/std=auto")
        return pixel_statistics(chunks)


def source_id(source: Path, folder: Path) -> str:
    """Which image folder (or manifest) the caches are of, so folders sharing one cache_dir
    keep their own files and never evict each other's: its path from the folder that holds
    the cache folder when it lies there (the default ``<root>/.torchloom-cache``, which moves
    and is copied with the images: the same name then, and the cache is reused), else its
    absolute path."""
    home, where = folder.resolve().parent, source.resolve()
    named = where.relative_to(home).as_posix() if where.is_relative_to(home) else str(where)
    return hashlib.sha256(named.encode()).hexdigest()[:8]


def cache_key(files: Dataset, listing: str) -> str:
    """What the cache depends on: every file (path in its split, size, modification time) and
    label, as ``listing`` (data/batching/fingerprint.py listing_sha256, which provenance records
    too: the files are stat'ed once), the image size, the channels and the format version."""
    settings = {
        "version": FORMAT_VERSION,
        "image_size": list(files.image_size),
        "channels": files.channels,
        "files": listing,
    }
    if getattr(files, "crop_pct", 1.0) != 1.0:  # a centre crop (caches before it keep their key)
        settings["crop_pct"] = files.crop_pct
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]


def _layout(files: Dataset) -> tuple[int, int]:
    """(images offset, file size) of the cache file of ``files``: the header, the pixels, then
    each sample's content hash (int64, data/batching/fingerprint.py)."""
    pixels = len(files) * math.prod(files.input_shape)
    return HEADER_BYTES, HEADER_BYTES + pixels + 8 * len(files)


def _stored_hashes(path: Path, files: Dataset) -> torch.Tensor:
    at = HEADER_BYTES + len(files) * math.prod(files.input_shape)
    return torch.from_numpy(np.fromfile(path, dtype=np.int64, count=len(files), offset=at))


def _header(files: Dataset) -> bytes:
    header = {"version": FORMAT_VERSION, "count": len(files), "shape": list(files.input_shape)}
    encoded = MAGIC + json.dumps(header).encode()
    return encoded + b"\0" * (HEADER_BYTES - len(encoded))


def check_file(path: Path, files: Dataset) -> str | None:
    """Why the cache file at ``path`` cannot be used for ``files``, or None when it can."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
        size = path.stat().st_size
    except OSError as error:
        return f"unreadable ({error.strerror})"
    if head != _header(files):
        return "not a cache of these images (bad header)"
    if size != _layout(files)[1]:
        return f"short or overlong ({size} bytes, {_layout(files)[1]} expected)"
    return differing_sample(path, files)


def differing_sample(path: Path, files: Dataset) -> str | None:
    """A cache file is a derived file, checked as its images are read: every image's pixels
    against the hash written after them when it was built (a byte changed on the disk was
    trained on before), at about 3 GB/s; then, since the key covers the file list, not the
    pixels a file claims for it, the first and last images and :data:`SAMPLES_CHECKED` chosen
    at random (unpredictably, so a planted file cannot be right only where it is checked)
    decoded again and compared with the file's."""
    images_at, _ = _layout(files)
    cached = np.memmap(
        path, dtype=np.uint8, mode="r", offset=images_at, shape=(len(files), *files.input_shape)
    )
    stored = _stored_hashes(path, files)
    differs = (sample_hashes(cached, files.targets) != stored).nonzero()
    if len(differs):
        return (
            f"damaged (its image {int(differs[0])} does not match the hash written with it: "
            "changed on the disk, or planted)"
        )
    chosen = random.SystemRandom().sample(range(len(files)), min(SAMPLES_CHECKED, len(files)))
    ends = {0, len(files) - 1}  # a copy cut short and padded to size is wrong at its end
    for index in sorted(ends | set(chosen)):
        image = files[index][0]
        if not np.array_equal(cached[index], image.numpy()):
            return f"not these images (its image {index} differs from {files.samples[index][0]})"
    return None


CACHE_BUILD = "once into the cache"


def decoded_batches(
    files: Dataset, workers: int, name: str, purpose: str = CACHE_BUILD
) -> Iterator[torch.Tensor]:
    """Every image of ``files`` in order, as uint8 batches decoded by ``workers`` processes,
    with a progress bar on a terminal (log lines every 5 s elsewhere); a file that cannot be
    decoded is one line naming it."""
    # Its own generator: iterating a DataLoader draws a seed, and the global RNG, seeded for
    # the model's initial weights, must not move when a cache is built.
    loader = decoding_loader(
        files, batch_size=DECODED_AT_ONCE, num_workers=workers, generator=torch.Generator()
    )
    batches = iter(loader)
    console = Console(quiet=os.environ.get("RANK", "0") != "0")
    bar = Progress(
        TextColumn(f"caching {name}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task("", total=len(files))
    started = shown = time.perf_counter()
    done = 0
    log.info("%s: decoding %d images %s (%d processes)", name, len(files), purpose, max(workers, 1))
    with bar if console.is_terminal else contextlib.nullcontext():
        for images, _ in reraised(batches):
            if stop_requested():  # the partial file goes with atomic_file; nothing is kept
                end_workers(batches)  # their batches are not read
                building = purpose == CACHE_BUILD
                log.info(
                    "%s received while decoding %s %s (%d/%d images): stopping%s",
                    stop_requested(),
                    name,
                    purpose,
                    done,
                    len(files),
                    "; the next run builds the cache again" if building else "",
                )
                raise Interrupted
            yield images
            done += len(images)
            bar.update(task, completed=done)
            if not console.is_terminal and time.perf_counter() - shown > 5:
                shown = time.perf_counter()
                log.info(
                    "%s: %d/%d images cached (%.0f/s)",
                    name,
                    done,
                    len(files),
                    done / (shown - started),
                )
    log.info("%s: %d images decoded in %.1f s", name, done, time.perf_counter() - started)


def build_file(path: Path, files: Dataset, workers: int, name: str) -> None:
    """Write the cache of ``files`` to ``path`` as checkpoints are written (a temporary file
    renamed into place once complete), so a reader never sees a partial cache."""
    try:
        with atomic_file(path) as f:
            f.write(_header(files))
            hashes, held, start = [], [], 0
            for images in decoded_batches(files, workers, name):
                f.write(images.numpy().tobytes())
                held.append(images)  # hashed some MiB at a time: few calls, bounded memory
                if sum(map(len, held)) * images[0].numel() >= HASHED_AT_ONCE:
                    start = _hash_held(held, files, start, hashes)
            _hash_held(held, files, start, hashes)
            f.write(torch.cat(hashes).numpy().tobytes() if hashes else b"")
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise UserError(
                f"no space left in {path.parent} for the {name} split's image cache; free "
                "space, point data.cache_dir=... elsewhere, or use data.cache=off"
            ) from None
        raise


def _hash_held(held: list, files: Dataset, start: int, hashes: list) -> int:
    """The decoded batches ``held`` (samples ``start`` on) hashed into ``hashes``, then let go."""
    batch = torch.cat(held) if held else files.targets[:0]
    held.clear()
    hashes.append(sample_hashes(batch, files.targets[start : start + len(batch)]))
    return start + len(batch)


def read_whole(path: Path, files: Dataset) -> TensorSplit:
    """The cached split in memory, as the whole-tensor path holds MNIST."""
    images_at, _ = _layout(files)
    count = len(files) * math.prod(files.input_shape)
    pixels = np.fromfile(path, dtype=np.uint8, count=count, offset=images_at)
    images = torch.from_numpy(pixels).view(len(files), *files.input_shape)
    return TensorSplit(images, files.targets, _stored_hashes(path, files))


def map_file(path: Path, files: Dataset) -> MappedSplit:
    """The cached split memory-mapped: pages are read as batches need them."""
    images_at, _ = _layout(files)
    images = np.memmap(
        path, dtype=np.uint8, mode="r", offset=images_at, shape=(len(files), *files.input_shape)
    )
    return MappedSplit(images, files.targets, _stored_hashes(path, files))


def decode_all(files: Dataset, workers: int, name: str) -> TensorSplit:
    """The split decoded into memory without a cache file (its folder cannot be written)."""
    images = torch.cat(list(decoded_batches(files, workers, name)))
    return TensorSplit(images, files.targets)
