"""A table of features in a CSV or TSV file, one row a sample (``data=csv``).

    python train.py data=csv data.path=houses.csv data.target=price_band model=mlp
    python train.py data=csv data.path=train.tsv data.split.val_path=val.tsv data.target=label
    python train.py data=csv data.path=a.csv data.target=y data.categorical=[city,colour]

The first row names the columns. ``target`` is the label column: class names or integers, each
distinct value a class (in sorted order; the names are kept). The features are the other
columns, or the ``features`` listed; each must hold numbers, except the ``categorical`` ones,
which are one-hot encoded with the categories of the ``path`` file (a category only a separate
val or test file holds encodes as all zeros). A value that is not a number, or is empty, is refused naming
its file, column and line. Features are standardised with the mean and standard deviation of
the train split alone, so no statistic of val or test leaks into training. Splits: separate
files (``split.val_path``, ``split.test_path``), or fractions of ``path`` held out by the
seeded ``split.seed``. Inputs have shape (F,), which ``model=mlp`` takes; they are held whole
in memory and batched by slicing, like every in-memory dataset.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from data.batches import Batching, Data, Splits, TensorSplit, channel_statistics, fill_splits
from utils.errors import UserError

log = logging.getLogger("torchloom")


def read_table(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a .csv (commas) or .tsv (tabs) file."""
    if not path.is_file():
        raise UserError(f"no CSV file at {path}; check data.path")
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter=delimiter))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UserError(
            f"cannot read {path}: {getattr(error, 'strerror', None) or error}"
        ) from None
    if len(rows) < 2:
        raise UserError(f"{path} has no data rows (the first row names the columns)")
    header = [name.strip() for name in rows[0]]
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise UserError(f"{path} line {line} has {len(row)} values; the header names "
                            f"{len(header)} columns")  # fmt: skip
    return header, rows[1:]


class Columns:
    """Which columns are the target and the features, and how each becomes numbers: fitted on
    the train file (its class names and categories), then applied to every file."""

    def __init__(self, header: list[str], rows: list[list[str]], choice: Mapping[str, Any],
                 path: Path) -> None:  # fmt: skip
        target, features = choice["target"], choice["features"]
        categorical = list(choice["categorical"] or [])
        for name in [target, *(features or []), *categorical]:
            if name not in header:
                raise UserError(f"{path} has no column {name!r}; its columns are "
                                f"{', '.join(header)}")  # fmt: skip
        self.target = target
        named = features if features is not None else [c for c in header if c != target]
        self.numeric = [c for c in named if c not in categorical]
        self.categorical = categorical
        at = header.index(target)
        values = {row[at].strip() for row in rows}
        whole = all(_is_int(v) for v in values)
        self.classes = sorted(values, key=int) if whole else sorted(values)
        self.categories = {
            name: sorted({row[header.index(name)].strip() for row in rows}) for name in categorical
        }

    def record(self) -> dict:
        """What rebuilds this encoding without the train file (checkpoints keep it)."""
        return {"target": self.target, "numeric": self.numeric, "categories": self.categories,
                "classes": self.classes}  # fmt: skip

    @classmethod
    def from_record(cls, record: dict) -> Columns:
        """The encoding a checkpoint recorded (untrusted: its types are checked)."""

        def names(value: Any) -> bool:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)

        categories = record.get("categories")
        ok = (isinstance(record.get("target"), str) and names(record.get("numeric"))
              and names(record.get("classes")) and isinstance(categories, dict)
              and all(isinstance(k, str) and names(v) for k, v in categories.items()))  # fmt: skip
        if not ok:
            raise UserError("the checkpoint's table record is not what torchloom writes (was "
                            "it edited?)")  # fmt: skip
        columns = cls.__new__(cls)
        columns.target, columns.numeric = record["target"], record["numeric"]
        columns.categorical, columns.categories = list(categories), categories
        columns.classes = record["classes"]
        return columns

    @property
    def feature_names(self) -> list[str]:
        one_hot = [
            f"{name}={value}" for name, values in self.categories.items() for value in values
        ]
        return [*self.numeric, *one_hot]

    def encode(self, header: list[str], rows: list[list[str]], path: Path) -> TensorSplit:
        """``rows`` of a file with ``header`` as features [N, F] (float32) and labels [N]."""
        if self.target not in header:
            raise UserError(f"{path} has no column {self.target!r}, which the train file has")
        at, class_of = header.index(self.target), {name: i for i, name in enumerate(self.classes)}
        labels = torch.empty(len(rows), dtype=torch.long)
        for n, row in enumerate(rows):
            label = row[at].strip()
            if label not in class_of:
                raise UserError(f"{path} line {n + 2}: {self.target}={label!r} is not a class "
                                f"of the train split ({', '.join(self.classes[:10])}...)")  # fmt: skip
            labels[n] = class_of[label]
        return TensorSplit(self.features(header, rows, path), labels)

    def features(self, header: list[str], rows: list[list[str]], path: Path) -> torch.Tensor:
        """The feature columns of ``rows`` encoded as training encoded them: [N, F] float32."""
        for name in [*self.numeric, *self.categorical]:
            if name not in header:
                raise UserError(f"{path} has no column {name!r}, which the train file has")
        index = {name: i for i, name in enumerate(header)}
        features = torch.zeros(len(rows), len(self.feature_names))
        for n, row in enumerate(rows):
            line = n + 2  # the header is line 1
            for f, name in enumerate(self.numeric):
                features[n, f] = _number(row[index[name]], name, path, line)
            offset = len(self.numeric)
            for name, values in self.categories.items():
                value = row[index[name]].strip()
                if value in values:
                    features[n, offset + values.index(value)] = 1.0
                offset += len(values)
        return features


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def _number(text: str, column: str, path: Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        shown = repr(text.strip()) if text.strip() else "empty"
        raise UserError(
            f"{path} line {line}, column {column!r}: {shown} is not a number; fix or drop the "
            f"value, or list the column in data.categorical (or leave it out of data.features)"
        ) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise UserError(f"{path} line {line}, column {column!r}: {text.strip()} is not finite")
    return value


def load_csv(path: str, target: str, features: Sequence[str] | None,
             categorical: Sequence[str], split: Mapping[str, Any], **batching) -> Data:  # fmt: skip
    """conf/data/csv.yaml. ``batching``: the keys of :class:`data.batches.Batching` but
    ``mean`` and ``std``, which come from the train split."""
    train_path = Path(path)
    header, rows = read_table(train_path)
    columns = Columns(header, rows, {"target": target, "features": features,
                                     "categorical": categorical}, train_path)  # fmt: skip
    samples = columns.encode(header, rows, train_path)
    paths = {name: Path(split[f"{name}_path"]) for name in ("val", "test") if split[f"{name}_path"]}
    given = {name: columns.encode(*read_table(other), other) for name, other in paths.items()}
    train, val, test = fill_splits(samples, given, split)  # the others held out of `path`
    mean, std = channel_statistics(train.inputs)  # a constant feature keeps std 1
    log.info("csv %s: %d features (%s), %d classes; standardised with the train split's "
             "statistics", train_path.name, len(columns.feature_names),
             ", ".join(columns.feature_names[:8]) + ("..." if len(columns.feature_names) > 8 else ""),
             len(columns.classes))  # fmt: skip
    batching = Batching(mean=mean, std=std, **batching)
    splits = Splits(train, val, test)
    data = Data(f"csv {train_path.name}", splits, len(columns.classes), batching, columns.classes)
    data.table = columns.record()
    return data
