"""A table read as text, and its columns encoded into one float tensor: numbers standardised,
categories one-hot, targets by kind. :class:`Columns` records the encoding, so predict.py reads
new rows exactly as training read its own, and flags categories training never saw.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from data.batching.splits import TensorSplit
from data.batching.targets import KINDS
from data.tables.column_kinds import auto_columns
from data.tables.missing import FLOAT32_MAX, MissingValues, is_gap
from data.tables.target_columns import TargetColumns
from utils.errors import UserError

log = logging.getLogger("torchloom")


def read_table(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a .csv (commas) or .tsv (tabs) file."""
    if not path.is_file():
        raise UserError(f"no CSV file at {path}; check data.path")
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM is no name
            rows = list(csv.reader(f, delimiter=delimiter))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UserError(
            f"cannot read {path}: {getattr(error, 'strerror', None) or error}"
        ) from None
    if len(rows) < 2:
        raise UserError(f"{path} has no data rows (the first row names the columns)")
    header = [name.strip() for name in rows[0]]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise UserError(
            f"{path}: the header names column {repeated[0]!r} "
            f"{header.count(repeated[0])} times; give each column its own name"
        )
    for line, row in enumerate(rows, start=1):
        if line > 1 and len(row) != len(header):
            raise UserError(
                f"{path} line {line} has {len(row)} values; the header names {len(header)} columns"
            )
        nul = next((n for n, cell in enumerate(row) if "\0" in cell), None)
        if nul is not None:  # no path, name or number holds one: a binary or damaged file
            column = f"column {header[nul]!r}" if line > 1 else "the header"
            raise UserError(
                f"{path} line {line}, {column}: holds a NUL byte (\\x00), which no "
                "text table does; fix that row (is the file damaged or binary?)"
            )
    return header, rows[1:]


class Columns:
    """Which columns are the target and the features, and how each becomes numbers: fitted on
    the train file (its class names and categories), then applied to every file. ``kind``
    (data/batching/targets.py): ``classes`` (one column of class names or integers), ``label_sets``
    (one column of ``a;b`` sets, or several 0/1 columns) or ``values`` (one or more columns of
    numbers)."""

    def __init__(
        self, header: list[str], rows: list[list[str]], choice: Mapping[str, Any], path: Path
    ) -> None:
        target, features, kind = choice["target"], choice["features"], choice["kind"]
        targets = [target] if isinstance(target, str) else list(target)
        auto = choice["categorical"] == "auto"
        categorical = [] if auto else list(choice["categorical"] or [])
        for name in [*targets, *(features or []), *categorical]:
            if name not in header:
                raise UserError(
                    f"{path} has no column {name!r}; its columns are {', '.join(header)}"
                )
        if features is not None and not features:
            raise UserError(
                "data.features=[] names no column; leave it null to use every column but the target"
            )
        answer = [name for name in targets if name in [*(features or []), *categorical]]
        if answer:
            raise UserError(
                f"data.target column {answer[0]!r} is also listed in "
                f"data.{'features' if answer[0] in (features or []) else 'categorical'}"
                "; the model would be given the answer: remove it there"
            )
        self.target_columns = TargetColumns.fitted(header, rows, target, kind, path)
        self.kind, self.target = kind, self.target_columns.target
        group = choice.get("group")  # data.split.group: never a feature unless listed
        _check_group(group, targets, categorical, features or [])
        named = (
            features
            if features is not None
            else [c for c in header if c not in targets and c != group]
        )
        if auto:  # data.categorical=auto: from the values, said in one line
            named, categorical = auto_columns(header, rows, named, features is not None, path)
        self.numeric = [c for c in named if c not in categorical]
        self.categorical = categorical
        self.classes = self.target_columns.names  # what each output is called
        self.categories = {
            name: sorted({row[header.index(name)].strip() for row in rows}) for name in categorical
        }
        self.missing = MissingValues.of(choice["na"], self.numeric, path)  # data.na: gaps
        self.kept: dict[str, torch.Tensor] = {}  # of each split, the rows :meth:`filled` kept
        self.gapped: set[str] = set()  # the number columns with a gap :meth:`filled` filled

    def record(self) -> dict:
        """What rebuilds this encoding without the train file (checkpoints keep it)."""
        return {
            "target": self.target,
            "numeric": self.numeric,
            "categories": self.categories,
            "classes": self.classes,
            "kind": self.kind,
            "na": self.missing.record(),
        }

    @classmethod
    def from_record(cls, record: dict) -> Columns:
        """The encoding a checkpoint recorded (untrusted: its types are checked); one written
        before tasks other than classification existed has no ``kind``."""

        def names(value: Any) -> bool:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)

        categories, target = record.get("categories"), record.get("target")
        ok = (
            (isinstance(target, str) or names(target))
            and names(record.get("numeric"))
            and names(record.get("classes"))
            and isinstance(categories, dict)
            and record.get("kind", "classes") in KINDS
            and all(isinstance(k, str) and names(v) for k, v in categories.items())
        )
        if not ok:
            raise UserError(
                "the checkpoint's table record is not what torchloom writes (was it edited?)"
            )
        columns = cls.__new__(cls)
        columns.target, columns.numeric = target, record["numeric"]
        columns.categorical, columns.categories = list(categories), categories
        columns.gapped, columns.kept = set(), {}
        columns.classes, columns.kind = record["classes"], record.get("kind", "classes")
        columns.target_columns = TargetColumns(target, columns.kind, columns.classes)
        columns.missing = MissingValues.from_record(record.get("na"), columns.numeric)
        return columns

    @property
    def feature_names(self) -> list[str]:
        one_hot = [
            f"{name}={value}" for name, values in self.categories.items() for value in values
        ]
        indicators = [f"{name}=missing" for name in self.missing.indicators]
        return [*self.numeric, *one_hot, *indicators]

    def encode(self, header: list[str], rows: list[list[str]], path: Path) -> TensorSplit:
        """``rows`` of a file with ``header`` as features [N, F] (float32) and targets: class
        indices [N], or float [N, K] label sets or values."""
        targets = [self.target] if isinstance(self.target, str) else self.target
        for name in targets:
            if name not in header:
                raise UserError(f"{path} has no column {name!r}, which the train file has")
        return TensorSplit(self.raw_features(header, rows, path), self.targets(header, rows, path))

    def unseen(self, header: list[str], rows: list[list[str]]) -> list[str]:
        """Each row's categorical values the train file never held, as ``column=value``
        (``;``-joined; empty when none): such a value is encoded as all zeros."""
        at = {name: header.index(name) for name in self.categories}
        return [
            ";".join(
                f"{name}={row[i].strip()}"
                for name, i in at.items()
                if row[i].strip() not in self.categories[name]
            )
            for row in rows
        ]

    def targets(self, header: list[str], rows: list[list[str]], path: Path) -> torch.Tensor:
        return self.target_columns.read(header, rows, path)

    def fit_gaps(self, train: TensorSplit, path: Path) -> None:
        """What the gaps of every split become, fitted on the ``train`` split alone
        (data/tables/missing.py)."""
        self.missing.fit(train.inputs, self.numeric, path)

    def filled(self, split: TensorSplit, name: str) -> TensorSplit:
        """``split`` (of :meth:`encode`) with its gaps filled, its indicator columns added and
        the rows a ``drop`` column has a gap in left out."""
        inputs, keep = self.missing.apply(split.inputs, self.numeric)
        gaps = torch.isnan(split.inputs[:, : len(self.numeric)]).any(dim=0).tolist()
        self.gapped |= {name for name, gap in zip(self.numeric, gaps, strict=True) if gap}
        self.kept[name] = keep  # which rows stay: cv=K's oof.csv names the val rows kept
        if len(keep) and not bool(keep.any()):
            raise UserError(
                f"the {name} split has no rows left: each has a gap in a column of "
                "data.na=drop; fill the gaps instead (data.na=median)"
            )
        if not bool(keep.all()):
            dropped, share = int((~keep).sum()), float((~keep).float().mean())
            log.log(
                logging.WARNING if share > 0.5 else logging.INFO,
                "%s%s split: %d of %d rows left out for their gaps (data.na=drop)%s",
                "warning: " if share > 0.5 else "",
                name,
                dropped,
                len(keep),
                "; data.na=median keeps them" if share > 0.5 else "",
            )
            return TensorSplit(inputs[keep], split.labels[keep])
        return TensorSplit(inputs, split.labels)

    def features(self, header: list[str], rows: list[list[str]], path: Path) -> torch.Tensor:
        """The feature columns of ``rows`` encoded as training encoded them, gaps filled as
        training filled them: [N, F] float32 (predict.py). A row with a gap that training
        left such rows out for is refused naming its line."""
        inputs, keep = self.missing.apply(self.raw_features(header, rows, path), self.numeric)
        if not bool(keep.all()):
            line = int((~keep).nonzero()[0]) + 2
            raise UserError(
                f"{path} line {line} has a gap in a column that training left rows "
                "out for (data.na=drop); fill it to predict this row"
            )
        return inputs

    def raw_features(self, header: list[str], rows: list[list[str]], path: Path) -> torch.Tensor:
        """The feature columns of ``rows`` as numbers: [N, F] float32, NaN at the gaps that
        their column's ``data.na`` mode allows (refused at the first other one)."""
        for name in [*self.numeric, *self.categorical]:
            if name not in header:
                raise UserError(f"{path} has no column {name!r}, which the train file has")
        index = {name: i for i, name in enumerate(header)}
        features = torch.zeros(
            len(rows), len(self.numeric) + sum(map(len, self.categories.values()))
        )
        allowed = {name: self.missing.mode(name) != "error" for name in self.numeric}
        for n, row in enumerate(rows):
            line = n + 2  # the header is line 1
            for f, name in enumerate(self.numeric):
                text = row[index[name]]
                if not is_gap(text):
                    features[n, f] = _number(text, name, path, line)
                elif allowed[name]:
                    features[n, f] = math.nan
                else:
                    raise self.missing.refused(name, path, line, text)
            offset = len(self.numeric)
            for name, values in self.categories.items():
                value = row[index[name]].strip()
                if value in values:
                    features[n, offset + values.index(value)] = 1.0
                offset += len(values)
        return features


def _check_group(group: str | None, targets: list, categorical: list, features: list) -> None:
    if group is not None and group in targets:
        raise UserError(
            f"data.split.group={group} is the target column; name the column "
            "that ties samples together (a patient, a session)"
        )
    if group is not None and group in categorical and group not in features:
        raise UserError(
            f"data.categorical lists {group!r}, the data.split.group column, "
            "which is not a feature unless data.features lists it; drop it "
            "from data.categorical (or list it in data.features too)"
        )


def unseen_line(path: Path, flags: list[str]) -> str | None:
    """One line naming the categorical values of ``path`` the train file never held (each
    column and value, and how many rows), from :meth:`Columns.unseen`; None when none."""
    counts: dict[str, int] = {}
    for flag in flags:
        for pair in filter(None, flag.split(";")):
            counts[pair] = counts.get(pair, 0) + 1
    if not counts:
        return None
    rows = sum(1 for flag in flags if flag)
    shown = ", ".join(f"{pair!r} in {n} row{'s' * (n > 1)}" for pair, n in list(counts.items())[:5])
    more = f" and {len(counts) - 5} more" if len(counts) > 5 else ""
    verb = "holds" if rows == 1 else "hold"
    return f"{path}: {rows} row{'s' * (rows > 1)} {verb} a category the train file never held ({shown}{more})"


def _number(text: str, column: str, path: Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        shown = repr(text.strip()) if text.strip() else "empty"
        raise UserError(
            f"{path} line {line}, column {column!r}: {shown} is not a number; fix or drop the "
            f"value, or list the column in data.categorical (or leave it out of data.features)"
        ) from None
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:  # features live in float32
        raise UserError(
            f"{path} line {line}, column {column!r}: {text.strip()} is not finite "
            f"as a float32 feature (at most {FLOAT32_MAX:.3g} in size); fix or "
            "drop the value"
        )
    return value
