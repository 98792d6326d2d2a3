"""How a file's target column (or columns) becomes targets, by the kind the task learns
(data/batching/targets.py): one owner for every reader of rows with a header — a table
(data/tables/table.py), texts (data/text/files.py) and an image manifest
(data/images/image_manifest.py) — so a new kind of data reads its targets with no branch of its own.

- ``classes``: one column of class names or integers; the train file's distinct values are the
  classes (integers numerically, names alphabetically); a gap is refused, never a class.
- ``label_sets``: one column of ``a;b`` sets (an empty cell is the empty set), or several 0/1
  columns.
- ``values``: one or more columns of numbers, or one column of ``a;b`` numbers (the same count
  in every row).

An array's ``y`` (data/arrays/tensors.py) is read by kind here too (:func:`target_array`,
:func:`array_targets`). Parquet shards' Arrow columns are read by data/shards/parquet.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from data.batching.targets import SET_SEPARATOR, Targets, label_set, multi_hot, sorted_names
from data.tables.missing import FLOAT32_MAX, is_gap
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
        lines: Sequence[int] | None = None,
    ) -> TargetColumns:
        """Fitted on the train ``rows`` (``lines``: their lines in ``path``, when not all of its
        rows in order): the names of their classes or labels."""
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
            _check_labelled(header, rows, columns[0], path, _lines(lines, rows))
            names = sorted_names({row[header.index(columns[0])].strip() for row in rows})
        elif kind == "label_sets" and isinstance(target, str):  # one column of a;b sets
            at = header.index(target)
            names = sorted_names({label for row in rows for label in label_set(row[at])})
        return cls(target if isinstance(target, str) else columns, kind, names)

    @property
    def are_classes(self) -> bool:
        """Class labels (splits and folds are then stratified by them)."""
        return stratifies(self.kind)

    def targets(self, read: torch.Tensor) -> Targets:
        """The :class:`Targets` of what :meth:`read` gave: as many as its columns (classes,
        labels or values), named when each has a name."""
        width = read.shape[1] if read.dim() == 2 else len(self.names)
        names = tuple(self.names) if len(self.names) == width else None
        return Targets(self.kind, width, names)

    @property
    def columns(self) -> list[str]:
        return [self.target] if isinstance(self.target, str) else list(self.target)

    def read(
        self,
        header: list[str],
        rows: list[list[str]],
        path: Path,
        lines: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """The targets of ``rows``: int64 class indices [N], or float [N, K]; a class or label
        the train file never held is refused naming its line (``lines``: each row's line in
        ``path``, when the rows are not all of its rows in order)."""
        columns = self.columns
        lines = _lines(lines, rows)
        for name in columns:
            if name not in header:
                raise UserError(
                    f"{path} has no column {name!r}; its columns are {', '.join(header)}"
                )
        at = [header.index(name) for name in columns]
        if self.kind == "values":
            return _values(rows, at, columns, path, lines)
        if self.kind == "label_sets" and not isinstance(self.target, str):  # 0/1 columns
            return torch.tensor(
                [
                    [_bit(row[i], name, path, line) for i, name in zip(at, columns, strict=True)]
                    for line, row in zip(lines, rows, strict=True)
                ]
            )
        if self.are_classes:
            _check_labelled(header, rows, columns[0], path, lines)
        known = set(self.names)
        for line, row in zip(lines, rows, strict=True):
            given = label_set(row[at[0]]) if self.kind == "label_sets" else [row[at[0]].strip()]
            unknown = [label for label in given if label not in known]
            if unknown:
                what = "label" if self.kind == "label_sets" else "class"
                raise UserError(
                    f"{path} line {line}: {columns[0]}={unknown[0]!r} is not a "
                    f"{what} of the train split ({', '.join(self.names[:10])}"
                    f"{'...' if len(self.names) > 10 else ''})"
                )
        if self.kind == "label_sets":
            return multi_hot([label_set(row[at[0]]) for row in rows], self.names)
        class_of = {name: i for i, name in enumerate(self.names)}
        return torch.tensor([class_of[row[at[0]].strip()] for row in rows], dtype=torch.long)


def stratifies(kind: str) -> bool:
    """Whether targets of ``kind`` are class labels, by which splits and folds are stratified."""
    return kind == "classes"


def _values(
    rows: list[list[str]], at: list[int], columns: list[str], path: Path, lines: list[int]
) -> torch.Tensor:
    """Number columns [N, K]; one column may hold ``a;b`` numbers, as many in every row."""
    read = []
    for line, row in zip(lines, rows, strict=True):
        cells = [(row[i], name) for i, name in zip(at, columns, strict=True)]
        if len(cells) == 1 and SET_SEPARATOR in cells[0][0]:
            cells = [(part, cells[0][1]) for part in cells[0][0].split(SET_SEPARATOR)]
        read.append([_value(text, name, path, line) for text, name in cells])
    widths = sorted({len(values) for values in read})
    if len(widths) > 1:
        raise UserError(
            f"{path}: rows hold {widths} values in {columns[0]!r}; give every row the same number"
        )
    return torch.tensor(read, dtype=torch.float32).reshape(len(rows), widths[0] if read else 1)


def target_array(y: torch.Tensor, kind: str, path: Path) -> torch.Tensor:
    """An array ``y`` as ``kind`` of target takes it: integer class indices [N], or float
    [N, K] label sets or values (a 1-D y of values is one value a sample)."""
    if stratifies(kind):
        if y.dtype.is_floating_point or y.dtype == torch.bool or y.dim() != 1:
            raise UserError(
                f"{path}: class labels must be integer indices [N], not {y.dtype} "
                f"{list(y.shape)} (label sets and values are task=multilabel's and "
                "task=regression's)"
            )
        return y
    if y.dim() == 1 and kind == "values":
        y = y[:, None]
    if y.dim() != 2:
        raise UserError(
            f"{path}: label sets must be a 0/1 y of shape [N, labels], not {list(y.shape)}"
        )
    return y.float()


def array_targets(
    kind: str, parts: Sequence[torch.Tensor], num_classes: int | None, path: Path
) -> Targets:
    """The :class:`Targets` of the splits' arrays (:func:`target_array`'s): ``num_classes``
    classes (None: the largest label + 1), or as many labels or values as their columns."""
    if stratifies(kind):
        return Targets(
            kind, num_classes if num_classes is not None else int(torch.cat(parts).max()) + 1
        )
    widths = {part.shape[1] for part in parts}
    if len(widths) > 1:
        raise UserError(
            f"{path}: the splits' y have {sorted(widths)} columns; give each split the same"
        )
    return Targets(kind, widths.pop())


def _lines(lines: Sequence[int] | None, rows: list[list[str]]) -> list[int]:
    """Each row's line in its file: as given, or the rows' own order after a header."""
    return list(lines) if lines is not None else [n + 2 for n in range(len(rows))]


def _check_labelled(
    header: list[str], rows: list[list[str]], target: str, path: Path, lines: list[int]
) -> None:
    """Every row of a class column names a class: an empty cell, ``NA`` or ``?`` is a missing
    label, never a class of its own that the model would learn."""
    at = header.index(target)
    unlabelled = [n for n, row in enumerate(rows) if is_gap(row[at])]
    if unlabelled:
        first = rows[unlabelled[0]][at].strip()
        shown = repr(first) if first else "empty"
        raise UserError(
            f"{path} line {lines[unlabelled[0]]}: target column {target!r} is {shown}, a "
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
