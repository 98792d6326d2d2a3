"""Apache Parquet shards, on local disk or object storage, read a row group at a time in an
order torchloom owns (``data=parquet``; the ``shards`` extra).

    python train.py data=parquet data.path=shards/                  # shards/train/, val/, test/
    python train.py data=parquet data.path=s3://bucket/set/ data.target=label
    python train.py data=parquet data.path='shards/part-*.parquet'  # val and test held out
    python shard.py data=imagefolder data.root=flowers out=s3://bucket/flowers   # write them

Row groups fetched from an object store are kept on local disk (``shard_cache_gb``: ``auto``
up to 20 GB; ``shard_cache_dir``: null for ~/.cache/torchloom/shards), least recently used out.

``path``: a folder holding ``train/`` (and ``val/``, ``test/``) folders of ``.parquet`` files;
or a folder, glob or list of files for the training split, with val and test given by
``split.val_path``/``split.test_path`` or held out of it as whole row groups (``split.val``,
``split.test`` shares of the rows, by ``split.seed``). The columns: ``target`` (class names or
integers; number columns for task=regression); ``image`` (encoded images, ``{bytes, path}``
structs as Hugging Face stores them, or uint8 pixels; ``auto``: the one such column); else an
array column (a fixed-size list) or ``features`` (number columns; null: every other one). A
``torchloom.json`` beside the splits (shard.py writes one) gives the columns and the shape.
``mean``/``std`` ``auto`` come from a bounded first pass (the first
:data:`STATISTICS_SAMPLES` training samples in file order), said at start-up.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from data.batching.dataset import Batching, Data, Splits
from data.batching.shards import ShardSplit
from data.batching.splits import channel_statistics, pixel_statistics
from data.batching.targets import Targets, reads_targets
from data.readers.parquet import (
    Columns,
    RowGroups,
    classes_of,
    footprint,
    row_groups,
    target_column,
    targets_of,
)
from data.readers.pixels import decoded
from data.readers.shard_cache import shard_cache
from data.readers.storage import (
    SCHEMES,
    Shard,
    arrow,
    files_of,
    filesystem,
    read_row_group,
    retried,
)
from utils.config.trust import plain_data
from utils.errors import UserError

log = logging.getLogger("torchloom")
STATISTICS_SAMPLES = 4096  # training samples data.mean/std=auto reads, in file order
MAX_DESCRIPTION_BYTES = 2**20  # a torchloom.json larger than this was not written by shard.py
DESCRIPTION = "torchloom.json"


@dataclass(frozen=True)
class Source:
    """A split's row groups: its shards, and which (shard, row group) it holds, with rows."""

    shards: tuple[Shard, ...]
    groups: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, shards: list[Shard]) -> tuple[Source, Any]:
        groups, sizes, schema = row_groups(shards)
        return cls(tuple(shards), tuple(groups), tuple(sizes)), schema

    def listing(self) -> str:
        """What the split is, by its objects' names, sizes, versions and footers, and the row
        groups it takes of them (data/batching/fingerprint.py listings)."""
        described = [footprint(list(self.shards)), [list(g) for g in self.groups]]
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()


@reads_targets("values")
def load_parquet(
    path: str | Sequence[str],
    target: str | Sequence[str],
    image: str | None,
    features: Sequence[str] | None,
    shape: Any,
    split: Mapping[str, Any],
    **options: Any,
) -> Data:
    """conf/data/parquet.yaml. ``shape``: an image's [C, H, W] (or an array's shape), ``auto``
    from torchloom.json or the first image. ``options``: ``shuffle_window``, ``num_workers``
    and the keys of :class:`Batching`; ``targets``, the kind the task learns (train.py)."""
    kind = options.pop("targets", "classes")
    window, workers = options.pop("shuffle_window"), options.pop("num_workers")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise UserError(f"data.shuffle_window={window!r} must be a whole number, 1 or more")
    workers = min(8, os.cpu_count() or 1) if workers is None else workers
    sources, schema = _sources(path, split)
    names, train = _target_names(target, kind, schema, path), sources["train"]
    # Each split's target columns, read once: the classes come from the train split's.
    labels = {
        name: target_column(list(source.shards), list(source.groups), names)
        for name, source in sources.items()
    }
    classes = classes_of(labels["train"], names[0], str(path)) if kind == "classes" else None
    described = _description(path)
    columns = _columns(schema, names, (image, features, shape), described, classes, train)
    remote = any(s.name.startswith(SCHEMES[:-1]) for src in sources.values() for s in src.shards)
    cache, cached = shard_cache(
        options.pop("shard_cache_gb"), options.pop("shard_cache_dir"), remote
    )
    encoded = columns.kind == "image" and _encoded_column(schema, columns)
    held = {
        name: _split(source, labels[name], columns, (window, workers, cache, encoded))
        for name, source in sources.items()
    }
    mean, std = _statistics(held["train"], options)
    batching = Batching(mean=mean, std=std, **options)
    targets = Targets(kind, len(classes) if classes else len(names), classes or tuple(names))
    splits = Splits(held["train"], held["val"], held.get("test"))
    data = Data(f"parquet {_shown(path)}", splits, targets.count, batching, targets)
    data.listings = {name: source.listing() for name, source in sources.items()}
    log.info(
        "parquet %s: %s; %d training rows in %d row groups of %d files, shuffled in windows "
        "of %d row groups (data.shuffle_window), read ahead by %d readers; %s",
        _shown(path),
        _said(columns),
        sum(train.sizes),
        len(train.groups),
        len(train.shards),
        window,
        workers,
        cached,
    )
    return data


def _target_names(target: Any, kind: str, schema: Any, path: Any) -> list[str]:
    """``data.target``'s columns, each one of the shards'; one for classification."""
    names = [target] if isinstance(target, str) else list(target)
    missing = [name for name in names if name not in schema.names]
    if missing:
        there = ", ".join(schema.names)
        raise UserError(f"data.target: {missing[0]!r} is not a column of {path} ({there})")
    if kind == "classes" and len(names) != 1:
        raise UserError(f"data.target={target!r}: task=classification takes one column")
    return names


def _shown(path: Any) -> str:
    return str(path) if isinstance(path, str) else f"[{len(path)} paths]"


def _sources(path: Any, split: Mapping[str, Any]) -> tuple[dict[str, Source], Any]:
    """Each split's row groups: the ``train/``, ``val/``, ``test/`` folders of ``path``; or
    ``path`` as the train split, with the val and test files ``split`` names, or held out."""
    folder = path.rstrip("/") if isinstance(path, str) else None
    laid_out = folder is not None and _exists(f"{folder}/train")
    given = {
        name: (f"{folder}/{name}" if laid_out else split[f"{name}_path"])
        for name in ("train", "val", "test")
        if (laid_out and (name == "train" or _exists(f"{folder}/{name}")))
        or (not laid_out and name != "train" and split[f"{name}_path"])
    }
    if not laid_out:
        given["train"] = path
    sources, schema = {}, None
    for name, where in given.items():
        key = "data.path" if name == "train" else f"data.split.{name}_path"
        sources[name], found = Source.of(files_of(where, key))
        schema = schema or found
    cut = [name for name in ("val", "test") if name not in sources]
    if laid_out and "val" in sources:
        cut = []  # a laid-out set without test/ tests on val, as an image folder does
    if cut:
        sources.update(_held_out(sources["train"], cut, split))
    return sources, schema


def _exists(url: str) -> bool:
    fs, _ = arrow()
    system, inside = filesystem(url)
    return retried(lambda: system.get_file_info(inside), url).type == fs.FileType.Directory


def _held_out(train: Source, cut: list[str], split: Mapping[str, Any]) -> dict[str, Source]:
    """The ``cut`` splits (val, test) held out of ``train`` as whole row groups, chosen by a
    permutation of ``split.seed`` until each holds its share of the rows; then the rest."""
    order = torch.randperm(
        len(train.groups), generator=torch.Generator().manual_seed(split["seed"])
    )
    total, taken, parts = sum(train.sizes), 0, {}
    for name in cut:
        wanted, chosen = split[name] * total, []
        while taken < len(order) - 1 and sum(train.sizes[g] for g in chosen) < wanted:
            chosen.append(int(order[taken]))
            taken += 1
        parts[name] = sorted(chosen)
    rest = sorted(int(g) for g in order[taken:])
    if not rest or any(not chosen for chosen in parts.values()):
        raise UserError(
            f"data.path holds {len(train.groups)} row groups: too few to hold out "
            f"{' and '.join(cut)} as whole row groups; write smaller row groups (shard.py "
            "rows_per_group=...), or give data.split.val_path and test_path"
        )
    parts["train"] = rest
    return {
        name: Source(
            train.shards, tuple(train.groups[g] for g in kept), tuple(train.sizes[g] for g in kept)
        )
        for name, kept in parts.items()
    }


def _description(path: Any) -> dict:
    """The ``torchloom.json`` shard.py wrote beside the splits, read as untrusted data (a
    small JSON object of plain values), or nothing."""
    if not isinstance(path, str):
        return {}
    fs, _ = arrow()
    system, inside = filesystem(f"{path.rstrip('/')}/{DESCRIPTION}")
    info = retried(lambda: system.get_file_info(inside), path)
    if info.type != fs.FileType.File:
        return {}
    if (info.size or 0) > MAX_DESCRIPTION_BYTES:
        raise UserError(f"{path}/{DESCRIPTION} is larger than shard.py writes; was it replaced?")
    raw = retried(lambda: system.open_input_stream(inside).read(), path)
    try:
        described = json.loads(raw)
    except ValueError:
        raise UserError(f"{path}/{DESCRIPTION} is not JSON shard.py writes; remove it") from None
    if not isinstance(described, dict) or not plain_data(described, MAX_DESCRIPTION_BYTES):
        raise UserError(f"{path}/{DESCRIPTION} is not what shard.py writes; remove it")
    return described


def _columns(
    schema: Any, target: list[str], asked: tuple, described: dict, classes: Any, train: Source
) -> Columns:
    """Which columns are the input, and its shape: the image column (``data.image``, or the
    one binary, ``{bytes, path}`` or uint8-list column), else an array column, else the number
    columns (``data.features``, or every one but the target)."""
    import pyarrow as pa

    image, features, shape = asked
    others = [n for n in schema.names if n not in target]
    image = described.get("image") if image == "auto" and "image" in described else image

    def is_image(field: Any) -> bool:
        kind = field.type
        bytes_struct = pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0
        uint8_list = pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind)
        uint8_list = uint8_list and pa.types.is_uint8(kind.value_type)
        binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
        return binary or pa.types.is_fixed_size_binary(kind) or bytes_struct or uint8_list

    if image == "auto":
        found = [n for n in others if is_image(schema.field(n))]
        image = found[0] if len(found) == 1 else None
    shape = described.get("shape") if shape == "auto" and "shape" in described else shape
    classes = tuple(classes) if classes else None
    if image:
        if image not in schema.names:
            raise UserError(f"data.image={image!r} is not a column ({', '.join(schema.names)})")
        shape = _image_shape(train, image, shape)
        return Columns("image", (image,), shape, tuple(target), classes)
    arrays = [n for n in others if pa.types.is_fixed_size_list(schema.field(n).type)]
    if features is None and len(arrays) == 1:
        width = schema.field(arrays[0]).type.list_size
        shape = tuple(shape) if shape != "auto" else (width,)
        return Columns("array", (arrays[0],), shape, tuple(target), classes)
    chosen = list(features) if features is not None else others
    unknown = [n for n in chosen if n not in schema.names]
    if unknown:
        raise UserError(
            f"data.features: {unknown[0]!r} is not a column ({', '.join(schema.names)})"
        )
    return Columns("features", tuple(chosen), (len(chosen),), tuple(target), classes)


def _image_shape(train: Source, column: str, shape: Any) -> tuple[int, int, int]:
    """[C, H, W]: ``data.shape`` (or torchloom.json's), else the first image's size and mode."""
    if shape != "auto":
        if len(shape) != 3 or not all(isinstance(v, int) and v > 0 for v in shape):
            raise UserError(f"data.shape={list(shape)} must be [channels, height, width]")
        return tuple(shape)
    from PIL import Image

    first = train.shards[train.groups[0][0]]
    table = read_row_group(first, train.groups[0][1], [column])
    value = table.column(column)[0].as_py()
    value = value.get("bytes") if isinstance(value, dict) else value
    raw = table.schema.field(column).type
    import pyarrow as pa

    if not isinstance(value, bytes | bytearray) or (
        pa.types.is_fixed_size_binary(raw) and not _encoded(value)
    ):
        raise UserError(
            f"{first.name}: column {column!r} holds pixels without their shape; pass "
            "data.shape=[channels,height,width]"
        )
    image = Image.open(io.BytesIO(value))
    channels = 1 if image.mode in ("1", "L", "LA", "I", "I;16", "F") else 3
    width, height = image.size
    decoded(io.BytesIO(value), (height, width), channels, f"{first.name} row 0")  # it decodes
    return channels, height, width


def _encoded_column(schema: Any, columns: Columns) -> bool:
    """Whether the image column holds encoded files (decoded one by one), not C·H·W pixels."""
    import pyarrow as pa

    kind = schema.field(columns.inputs[0]).type
    pixels = int(torch.tensor(columns.shape).prod())
    if pa.types.is_fixed_size_binary(kind):
        return kind.byte_width != pixels
    return not (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind))


def _encoded(value: bytes) -> bool:
    """Whether ``value`` starts as an image file does (PIL can tell its format)."""
    from PIL import Image, UnidentifiedImageError

    try:
        Image.open(io.BytesIO(value))
    except (UnidentifiedImageError, OSError, ValueError):
        return False
    return True


def _split(source: Source, labels: Any, columns: Columns, reading: tuple) -> ShardSplit:
    """The split of ``source`` with its target columns ``labels`` (read already), read in
    windows of ``reading`` = (data.shuffle_window, data.num_workers, the row groups' cache,
    whether its images are encoded)."""
    window, workers, cache, encoded = reading
    read = RowGroups(source.shards, source.groups, source.sizes, columns, cache)
    targets = targets_of(labels, columns, source.shards[0].name)
    image, decodes = columns.kind == "image", columns.kind == "image" and encoded
    return ShardSplit(source.sizes, read, targets, columns.shape, window, workers, image, decodes)


def _statistics(train: ShardSplit, options: dict) -> tuple[list[float], list[float]]:
    """``data.mean``/``data.std``; ``auto``: of the first :data:`STATISTICS_SAMPLES` training
    samples in file order (a bounded first pass), said at start-up."""
    mean, std = options.pop("mean"), options.pop("std")
    if "auto" not in (mean, std):
        return mean, std
    chunks, seen = [], 0
    for group in range(len(train.sizes)):
        inputs, _ = train.read(group)
        chunks.append(inputs)
        seen += len(inputs)
        if seen >= STATISTICS_SAMPLES:
            break
    held = torch.cat(chunks)[:STATISTICS_SAMPLES]
    fitted = pixel_statistics(iter([held])) if train.pixels else channel_statistics(held)
    log.info(
        "data.mean/std=auto: of the first %d training samples in file order: mean %s, std %s",
        len(held),
        [round(v, 4) for v in fitted[0]],
        [round(v, 4) for v in fitted[1]],
    )
    return (fitted[0] if mean == "auto" else mean), (fitted[1] if std == "auto" else std)


def _said(columns: Columns) -> str:
    what = {"image": "images", "array": "arrays", "features": "number columns"}[columns.kind]
    inputs = ", ".join(columns.inputs[:8]) + ("..." if len(columns.inputs) > 8 else "")
    target = f"{len(columns.classes)} classes" if columns.classes else "values"
    return f"{what} {inputs} {list(columns.shape)} -> {', '.join(columns.target)} ({target})"
