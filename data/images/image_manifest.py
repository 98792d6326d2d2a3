"""Images listed in a CSV manifest of ``path,label`` rows (``data=image_csv``), decoded and
cached exactly as an image folder's are (data/images/imagefolder.py, data/images/image_cache.py).

    python train.py data=image_csv data.root=photos data.manifest=labels.csv
    python train.py data=image_csv data.root=photos data.manifest=train.csv \\
        data.split.val_path=val.csv data.split.test_path=test.csv

The manifest's first row names its columns, ``path`` and ``label``. Paths are relative to
``data.root`` and must stay inside it: a path that leads out (``../``, an absolute path, a link
outside) is refused naming its line, as is a missing file. Labels are class names or integers;
each distinct value of the train manifest is a class (sorted; integers in numeric order), and
the names are kept. For ``task=multilabel`` a label is a set ``cat;dog`` (empty: no label), and
for ``task=regression`` a number, or numbers ``1.5;-2``. Splits: separate manifests, or fractions of ``data.manifest`` held out by
the seeded ``split.seed``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from data.batching.dataset import Data, can
from data.batching.folds import FoldIds, FoldPlan, group_values
from data.batching.targets import Targets, reads_targets
from data.images.imagefolder import (
    ImageList,
    check_image_keys,
    choose_channels,
    geometries,
    held_data,
)
from data.tables.table import read_table
from data.tables.target_columns import TargetColumns, stratifies
from utils.errors import UserError


def read_manifest(path: Path, root: Path) -> list[tuple[str, str, int]]:
    """(file, label, line) of each row; every file exists inside ``root``."""
    header, rows = read_table(path)
    if "path" not in header or "label" not in header:
        raise UserError(
            f"{path}: the first row must name the columns path and label (it is {','.join(header)})"
        )
    at_path, at_label = header.index("path"), header.index("label")
    inside = root.resolve()
    entries = []
    for line, row in enumerate(rows, start=2):
        relative = row[at_path].strip()
        file = (root / relative).resolve()
        if Path(relative).is_absolute() or not file.is_relative_to(inside):
            raise UserError(
                f"{path} line {line}: {relative!r} is outside data.root={root}; "
                "list paths relative to it"
            )
        if not file.is_file():
            raise UserError(f"{path} line {line}: no image at {root / relative}")
        entries.append((str(file), row[at_label].strip(), line))
    return entries


def manifest_targets(
    entries: dict[str, list],
    kind: str,
    manifest: str,
    split: Mapping[str, Any],
    pool: Sequence[str] = ("train",),
) -> tuple[dict[str, list], Targets]:
    """Each split's (file, target) samples from its manifest rows, and the targets, read as
    every file's target column is (data/tables/target_columns.py): a class index, a 0/1
    tuple over the labels (``a;b``) or a tuple of values (``1.5`` or ``1.5;-2``). Classes and
    labels are those of the ``pool`` splits' rows (the train rows; with folds, train and val,
    so every fold has the same classes)."""
    header = ["label"]
    pooled = [entry for name in pool for entry in entries[name]]
    lines = [line for _, _, line in pooled]
    rows = [[label] for _, label, _ in pooled]
    columns = TargetColumns.fitted(header, rows, "label", kind, Path(manifest), lines)
    samples, read = {}, {}
    for name, rows in entries.items():
        path = Path(split.get(f"{name}_path") or manifest)
        lines = [line for _, _, line in rows]
        read[name] = columns.read(header, [[label] for _, label, _ in rows], path, lines)
        targets = [t if isinstance(t, int) else tuple(t) for t in read[name].tolist()]
        samples[name] = [(file, t) for (file, _, _), t in zip(rows, targets, strict=True)]
    widths = {columns.targets(part).count for part in read.values()}
    if len(widths) > 1:
        raise UserError(
            f"{manifest}: the splits' rows hold {sorted(widths)} values; give every row the "
            "same number"
        )
    return samples, columns.targets(read["train"])


@can("folds")
@reads_targets("label_sets", "values")
def load_image_csv(
    root: str,
    manifest: str,
    split: Mapping[str, Any],
    image_size: Sequence[int],
    channels: int | str,
    **options,
) -> Data:
    """conf/data/image_csv.yaml. ``options``: the cache keys (``cache``, ``cache_max_gb``,
    ``cache_dir``), those of :class:`data.batching.dataset.Batching`, and ``targets``, the kind of
    target the task learns (data/batching/targets.py; train.py passes it)."""
    kind = options.pop("targets", "classes")
    check_image_keys(image_size, channels, options["cache"], options["cache_max_gb"])
    geometry = geometries(image_size, options)
    base = Path(root)
    if not base.is_dir():
        raise UserError(
            f"data.root={root} is not a folder (the manifest's paths are relative to it)"
        )
    entries = {"train": read_manifest(Path(manifest), base)}
    for name in ("val", "test"):
        if split[f"{name}_path"]:
            entries[name] = read_manifest(Path(split[f"{name}_path"]), base)
    cut = [name for name in ("val", "test") if name not in entries]
    plan = FoldPlan.of(
        split, stratifies(kind), split["seed"], groups_allowed=True
    )  # data/batching/folds.py
    if plan.folds is not None or plan.group is not None:
        entries, fold_ids = _fold_entries(entries, split, plan, Path(manifest))
        cut = []
    if cut:  # held out of the train manifest by a seeded shuffle of its rows
        entries = _held_out(entries, cut, split, manifest)
    pool = ("train", "val") if plan.folds is not None else ("train",)  # every fold's classes
    samples, targets = manifest_targets(entries, kind, manifest, split, pool)
    channels = choose_channels(channels, samples["train"], f"image_csv {Path(manifest).name}")
    files = {
        name: ImageList(rows, base, geometry[name][0], channels, geometry[name][1])
        for name, rows in samples.items()
    }
    cache = _cache(options, base, manifest)
    folds = plan.folds is not None
    data = held_data(f"image_csv {Path(manifest).name}", files, targets, cache, options, folds)
    if plan.folds is not None:  # cv=K's oof.csv names each val image by its manifest path
        data.fold_ids = FoldIds(plan.fold, [os.path.relpath(file, base) for file in fold_ids])
    return data


def _held_out(
    entries: dict[str, list], cut: list[str], split: Mapping[str, Any], manifest: str
) -> dict[str, list]:
    """``entries`` with the ``cut`` splits (val, test) held out of the train manifest's rows
    by a seeded shuffle, at the shares ``split`` gives."""
    rows = entries["train"][:]
    random.Random(split["seed"]).shuffle(rows)
    sizes = [max(1, round(split[name] * len(rows))) for name in cut]
    if sum(sizes) >= len(rows):
        raise UserError(
            f"{manifest} has {len(rows)} rows: too few to hold out {' and '.join(cut)} ({sizes})"
        )
    entries = dict(entries)
    for name, size in zip(cut, sizes, strict=True):
        entries[name], rows = sorted(rows[:size], key=lambda e: e[2]), rows[size:]
    entries["train"] = sorted(rows, key=lambda e: e[2])
    return entries


def _cache(options: dict, base: Path, manifest: str) -> dict:
    """The image cache's settings (``data.cache``, ``cache_max_gb``, ``cache_dir``), taken out
    of ``options``: by default beside the images, named after the manifest."""
    cache_dir = options.pop("cache_dir")
    return {
        "mode": options.pop("cache"),
        "max_gb": options.pop("cache_max_gb"),
        "folder": Path(cache_dir) if cache_dir else base / ".torchloom-cache",
        "prefix": "manifest-",
        "source": Path(manifest),
    }


def _fold_entries(
    entries: dict[str, list], split: Mapping[str, Any], plan: FoldPlan, manifest: Path
) -> tuple[dict[str, list], list[str]]:
    """The manifest's rows cut by ``plan``: a test manifest as given, or the test share of
    whole groups held out first; val a fold of the rest (or its share, without folds).
    Returns the entries and the val rows' files."""
    if plan.folds is not None and "val" in entries:
        raise UserError(
            "data.split.folds cuts val out of data.manifest; drop "
            "data.split.val_path (the folds cover train and val)"
        )
    rows = entries["train"]
    groups = group_values(*read_table(manifest), manifest, plan.group)
    sizes = {
        name: max(1, round(split[name] * len(rows)))
        for name in ("val", "test")
        if name not in entries and (name == "test" or plan.folds is None)
    }
    labels = [label for _, label, _ in rows]
    parts = plan.parts(len(rows), sizes, labels, groups)
    cut = {name: [rows[i] for i in part.tolist()] for name, part in parts.items()}
    return {**entries, **cut}, [file for file, _, _ in cut.get("val", [])]
