"""How a file's target column (or columns) becomes targets, by the kind the task learns
(data/batching/targets.py): one owner for every reader of rows with a header — a table
(data/readers/table.py) and texts (data/text/files.py) — so a new kind of data reads its
targets with no branch of its own.

- ``classes``: one column of class names or integers; the train file's distinct values are the
  classes (integers numerically, names alphabetically); a gap is refused, never a class.
- ``label_sets``: one column of ``a;b`` sets (an empty cell is the empty set), or several 0/1
  columns.
- ``values``: one or more columns of numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from data.batching.targets import label_set, multi_hot, sorted_names
from data.readers.missing import FLOAT32_MAX, is_gap
from utils.errors import UserError


class TargetColumns:
    """The target column(s) ``target`` of kind ``kind``, fitted on the train file's rows (its
    class or label names, :attr:`names`), then read from every file alike."""

    def __init__(self, target: str | Sequence[str], kind: str, names: Sequence[str]) -> None:
        self.target = target if isinstance(target, str) else list(target)
        self.kind, self.names = kind, list(names)

    @classmethod
    def fitted(
        cls,
        header: list[str],
        rows: list[list[str]],
        target: str | Sequence[str],
        kind: str,
        path: Path,
    ) -> TargetColumns:
        columns = [target] if isinstance(target, str) else list(target)
        for name in columns:
            if name not in header:
                raise UserError(
                    f"{path} has no column {name!r}; its columns are {', '.join(header)}"
                )
        if len(columns) > 1 and kind == "classes":
            raise UserError(
                f"data.target names {len(columns)} columns; task=classification "
                "takes one (several are task=multilabel's 0/1 columns or "
                "task=regression's values)"
            )
        names: list[str] = columns  # what each output is called: labels or values
        if kind == "classes":
            _check_labelled(header, rows, columns[0], path)
            names = sorted_names({row[header.index(columns[0])].strip() for row in rows})
        elif kind == "label_sets" and isinstance(target, str):  # one column of a;b sets
            at = header.index(target)
            names = sorted_names({label for row in rows for label in label_set(row[at])})
        return cls(target if isinstance(target, str) else columns, kind, names)

    @property
    def are_classes(self) -> bool:
        """Class labels (splits and folds are then stratified by them)."""
        return self.kind == "classes"

    @property
    def columns(self) -> list[str]:
        return [self.target] if isinstance(self.target, str) else list(self.target)

    def read(self, header: list[str], rows: list[list[str]], path: Path) -> torch.Tensor:
        """The targets of ``rows``: int64 class indices [N], or float [N, K]; a class or label
        the train file never held is refused naming its line."""
        columns = self.columns
        for name in columns:
            if name not in header:
                raise UserError(
                    f"{path} has no column {name!r}; its columns are {', '.join(header)}"
                )
        at = [header.index(name) for name in columns]
        if self.kind == "values":
            return torch.tensor(
                [
                    [_value(row[i], name, path, n + 2) for i, name in zip(at, columns, strict=True)]
                    for n, row in enumerate(rows)
                ]
            )
        if self.kind == "label_sets" and not isinstance(self.target, str):  # 0/1 columns
            return torch.tensor(
                [
                    [_bit(row[i], name, path, n + 2) for i, name in zip(at, columns, strict=True)]
                    for n, row in enumerate(rows)
                ]
            )
        known = set(self.names)
        for n, row in enumerate(rows):
            given = label_set(row[at[0]]) if self.kind == "label_sets" else [row[at[0]].strip()]
            unknown = [label for label in given if label not in known]
            if unknown:
                what = "label" if self.kind == "label_sets" else "class"
                raise UserError(
                    f"{path} line {n + 2}: {columns[0]}={unknown[0]!r} is not a "
                    f"{what} of the train split ({', '.join(self.names[:10])}"
                    f"{'...' if len(self.names) > 10 else ''})"
                )
        if self.kind == "label_sets":
            return multi_hot([label_set(row[at[0]]) for row in rows], self.names)
        class_of = {name: i for i, name in enumerate(self.names)}
        return torch.tensor([class_of[row[at[0]].strip()] for row in rows], dtype=torch.long)


def _check_labelled(header: list[str], rows: list[list[str]], target: str, path: Path) -> None:
    """Every row of a class column names a class: an empty cell, ``NA`` or ``?`` is a missing
    label, never a class of its own that the model would learn."""
    at = header.index(target)
    unlabelled = [n for n, row in enumerate(rows) if is_gap(row[at])]
    if unlabelled:
        first = rows[unlabelled[0]][at].strip()
        shown = repr(first) if first else "empty"
        raise UserError(
            f"{path} line {unlabelled[0] + 2}: data.target column {target!r} is {shown}, a "
            f"missing label ({len(unlabelled)} of {len(rows)} rows); a class is not learnt "
            "from a gap: give those rows their class or remove them"
        )


def _value(text: str, column: str, path: Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        shown = repr(text.strip()) if text.strip() else "empty"
        raise UserError(
            f"{path} line {line}, column {column!r}: {shown} is not a number, "
            "and task=regression learns the numbers in data.target; fix the value "
            "or choose number columns"
        )
    return value


def _bit(text: str, column: str, path: Path, line: int) -> float:
    if text.strip() not in ("0", "1"):
        raise UserError(
            f"{path} line {line}, column {column!r}: {text.strip()!r} is not 0 or 1 "
            "(a label column of task=multilabel)"
        )
    return float(text.strip())
