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

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from data.arrays.inputs import Values
from data.batching.dataset import Batching, Data, Splits
from data.batching.splits import channel_statistics, pixel_statistics
from data.batching.targets import Targets, reads_targets
from data.images.inputs import Pixels
from data.shards.batches import ShardSplit
from data.shards.cache import shard_cache
from data.shards.columns import DESCRIPTION, encoded_column, input_columns, said
from data.shards.row_groups import (
    Columns,
    RowGroups,
    classes_of,
    footprint,
    footprints,
    label_names,
    row_groups,
    target_column,
    targets_of,
)
from data.shards.storage import (
    SCHEMES,
    Shard,
    arrow,
    files_of,
    filesystem,
    retried,
)
from data.tables.inputs import Rows
from utils.config.trust import plain_data
from utils.errors import UserError

log = logging.getLogger("torchloom")
STATISTICS_SAMPLES = 4096  # training samples data.mean/std=auto reads, in file order
MAX_DESCRIPTION_BYTES = 2**20  # a torchloom.json larger than this was not written by shard.py


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

    def objects(self) -> dict[str, str]:
        """Each object's footprint by name: which objects a changed listing changed."""
        return footprints(list(self.shards))


@reads_targets("label_sets", "values")
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
    classes = _classes(labels["train"], names[0], str(path), kind)
    described = description(path)
    columns = input_columns(schema, names, (image, features, shape), described, classes, train)
    columns = dataclasses.replace(columns, sets=kind == "label_sets")
    remote = any(s.name.startswith(SCHEMES[:-1]) for src in sources.values() for s in src.shards)
    cache, cached = shard_cache(
        options.pop("shard_cache_gb"), options.pop("shard_cache_dir"), remote
    )
    encoded = columns.kind == "image" and encoded_column(schema, columns)
    held = {
        name: _split(source, labels[name], columns, (window, workers, cache, encoded))
        for name, source in sources.items()
    }
    mean, std = _statistics(held["train"], options)
    batching = Batching(mean=mean, std=std, **options)
    targets = Targets(kind, len(classes) if classes else len(names), classes or tuple(names))
    splits = Splits(held["train"], held["val"], held.get("test"))
    table = _table_record(columns, kind) if columns.kind == "features" else None
    inputs = Pixels() if held["train"].pixels else Rows(table=table) if table else Values()
    data = Data(f"parquet {_shown(path)}", splits, targets.count, batching, targets, inputs=inputs)
    data.num_workers = workers  # the readers ahead of the step (the data-wait advice names them)
    data.listings = {name: source.listing() for name, source in sources.items()}
    data.objects = {name: source.objects() for name, source in sources.items()}
    log.info(
        "parquet %s: %s; %d training rows in %d row groups of %d files, shuffled in windows "
        "of %d row groups (data.shuffle_window), read ahead by %d readers; %s",
        _shown(path),
        said(columns),
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
    if kind != "values" and len(names) != 1:
        task = "classification" if kind == "classes" else "multilabel"
        raise UserError(f"data.target={target!r}: task={task} takes one column")
    return names


def _classes(labels: Any, column: str, where: str, kind: str) -> tuple[str, ...] | None:
    """The class names (classification), the label names (label sets), or None (values)."""
    if kind == "classes":
        return classes_of(labels, column, where)
    return label_names(labels, column, where) if kind == "label_sets" else None


def _table_record(columns: Columns, kind: str) -> dict:
    """A table's encoding as the CSV reader records it (data/tables/table.py ``Columns``):
    numbers first, then each text column one-hot in its sorted values; gaps refused. So
    predict.py and the raw-input exports read a CSV of new rows as training read the shards."""
    target = columns.target[0] if len(columns.target) == 1 else list(columns.target)
    return {
        "target": target,
        "numeric": list(columns.numbers),
        "categories": {name: list(values) for name, values in columns.categories},
        "classes": list(columns.classes or columns.target),
        "kind": kind,
        "na": None,
    }


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


def description(path: Any) -> dict:
    """The ``torchloom.json`` shard.py wrote beside the splits, read as untrusted data (a
    small JSON object of plain values), or nothing."""
    return json_beside(path, DESCRIPTION, MAX_DESCRIPTION_BYTES)


def json_beside(path: Any, name: str, limit: int) -> dict:
    """The JSON object ``name`` that shard.py wrote in the shards' folder ``path`` (local or
    on object storage), read as untrusted data: at most ``limit`` bytes of plain values; or
    nothing where there is none."""
    if not isinstance(path, str):
        return {}
    fs, _ = arrow()
    system, inside = filesystem(f"{path.rstrip('/')}/{name}")
    info = retried(lambda: system.get_file_info(inside), path)
    if info.type != fs.FileType.File:
        return {}
    if (info.size or 0) > limit:
        raise UserError(f"{path}/{name} is larger than shard.py writes; was it replaced?")
    raw = retried(lambda: system.open_input_stream(inside).read(), path)
    try:
        described = json.loads(raw)
    except ValueError:
        raise UserError(f"{path}/{name} is not JSON shard.py writes; remove it") from None
    if not isinstance(described, dict) or not plain_data(described, limit):
        raise UserError(f"{path}/{name} is not what shard.py writes; remove it")
    return described


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
