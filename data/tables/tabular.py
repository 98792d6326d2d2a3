"""A table of features in a CSV or TSV file, one row a sample (``data=csv``).

    python train.py data=csv data.path=houses.csv data.target=price_band model=mlp
    python train.py data=csv data.path=train.tsv data.split.val_path=val.tsv data.target=label
    python train.py data=csv data.path=a.csv data.target=y data.categorical=[city,colour]
    python train.py task=regression data=csv data.path=houses.csv data.target=[price,rent]
    python train.py task=multilabel data=csv data.path=t.csv data.target=tags    # cells a;b
    python train.py task=multilabel data=csv data.path=t.csv data.target=[red,round]  # 0/1

The first row names the columns. ``target`` is the label column: class names or integers, each
distinct value a class (in sorted order; the names are kept). For ``task=regression`` it names
one or more columns of numbers; for ``task=multilabel``, one column of ``a;b`` label sets (an
empty cell is the empty set), or a list of 0/1 columns. The features are the other columns, or
the ``features`` listed; each must hold numbers, except the ``categorical`` ones,
which are one-hot encoded with the categories of the ``path`` file (a category only a separate
val or test file holds encodes as all zeros; an empty cell is a category of its own). A value
that is not a number is refused naming its file, column and line; a gap (an empty cell, ``NA``,
``?``...) is too, unless ``data.na`` says what it becomes (data/tables/missing.py: dropped, or filled
with a statistic of the train split alone). Features are standardised with the mean and standard deviation of
the train split alone, so no statistic of val or test leaks into training. Splits: separate
files (``split.val_path``, ``split.test_path``), or fractions of ``path`` held out by the
seeded ``split.seed``. Inputs have shape (F,), which ``model=mlp`` takes; they are held whole
in memory and batched by slicing, like every in-memory dataset.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from data.batching.dataset import Batching, Data, Splits, can
from data.batching.folds import FoldIds, FoldPlan, group_values, tensor_splits
from data.batching.splits import channel_statistics
from data.batching.targets import Targets, reads_targets
from data.tables.inputs import Rows
from data.tables.missing import NA_KEYS
from data.tables.table import Columns, read_table, unseen_line
from data.tables.target_columns import stratifies

log = logging.getLogger("torchloom")


@can("folds", "refits")
@reads_targets("label_sets", "values")
def load_csv(
    path: str,
    target: Any,
    features: Sequence[str] | None,
    categorical: Sequence[str],
    split: Mapping[str, Any],
    **options,
) -> Data:
    """conf/data/csv.yaml. ``options``: the keys of :class:`data.batching.dataset.Batching` but ``mean``
    and ``std``, which come from the train split; the ``na`` keys (data/tables/missing.py); and ``targets``, the kind of target the task
    learns (data/batching/targets.py; train.py passes it)."""
    kind = options.pop("targets", "classes")
    gaps = {key: options.pop(key) for key in NA_KEYS if key in options}  # data/tables/missing.py
    target = target if isinstance(target, str) else list(target)
    train_path = Path(path)
    header, rows = read_table(train_path)
    columns = Columns(
        header,
        rows,
        {
            "target": target,
            "features": features,
            "kind": kind,
            "categorical": categorical,
            "na": gaps,
            "group": (split or {}).get("group"),
        },
        train_path,
    )
    samples = columns.encode(header, rows, train_path)
    given = _given_splits(columns, split)  # data.split.val_path, test_path: read alike
    plan = FoldPlan.of(
        split, stratifies(kind), split["seed"], groups_allowed=True
    )  # data/batching/folds.py
    groups = group_values(header, rows, train_path, plan.group)
    *parts, val_rows = tensor_splits(samples, given, split, plan, groups)  # test first, then val
    columns.fit_gaps(parts[0], train_path)  # fill values from the train split alone
    train, val, test = (
        columns.filled(part, name)
        for part, name in zip(parts, ("train", "val", "test"), strict=True)
    )
    mean, std = channel_statistics(train.inputs)  # a constant feature keeps std 1
    _describe(train_path, columns, kind)
    batching = Batching(mean=mean, std=std, **options)
    targets = Targets(kind, len(columns.classes), tuple(columns.classes))
    inputs = Rows(table=columns.record(), gapped=frozenset(columns.gapped))
    splits = Splits(train, val, test)
    data = Data(f"csv {train_path.name}", splits, targets.count, batching, targets, inputs=inputs)
    if plan.folds is not None:  # cv=K's oof.csv names each val row by its line in the file
        kept = val_rows[columns.kept["val"]].tolist()
        data.fold_ids = FoldIds(plan.fold, [f"line {i + 2}" for i in kept])
    return data


def _given_splits(columns: Columns, split: Mapping[str, Any]) -> dict[str, Any]:
    """The val and test files ``split`` names (``val_path``, ``test_path``), encoded exactly
    as the train file was; a category the train file never held is said once per file."""
    given = {}
    for name in ("val", "test"):
        if not split[f"{name}_path"]:
            continue
        other = Path(split[f"{name}_path"])
        other_header, other_rows = read_table(other)
        given[name] = columns.encode(other_header, other_rows, other)
        said = unseen_line(other, columns.unseen(other_header, other_rows))
        if said:
            log.warning("warning: %s; they are encoded as all zeros", said)
    return given


def _describe(path: Path, columns: Columns, kind: str) -> None:
    names = columns.feature_names
    shown = ", ".join(names[:8]) + ("..." if len(names) > 8 else "")
    log.info(
        "csv %s: %d features (%s), %d %s; standardised with the train split's statistics",
        path.name,
        len(names),
        shown,
        len(columns.classes),
        kind.replace("_", " ").replace("label sets", "labels"),
    )
