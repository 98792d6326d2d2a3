"""``data.categorical=auto``: which of a table's columns are categories (a value that is not a
number, gaps aside) and which are identifiers to leave out, said in one start-up line.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

from data.readers.missing import is_gap

log = logging.getLogger("torchloom")

# data.categorical=auto: a text column with a distinct value on at least this share of the rows
# (and MIN_IDENTIFIER_VALUES of them) names rows rather than describing them: a name, an ID.
IDENTIFIER_SHARE = 0.5
MIN_IDENTIFIER_VALUES = 20
COUNTS_ROWS = "counts the rows"


def auto_columns(
    header: list[str], rows: list[list[str]], named: list[str], listed: bool, path: Path
) -> tuple[list[str], list[str]]:
    """(the feature columns kept, the categorical ones) of ``named``, said in one line; columns
    ``listed`` by name in data.features are all kept (a text one is categorical)."""
    categorical, identifiers, gaps = column_kinds(header, rows, named)
    if listed:
        categorical += [name for name, why in identifiers.items() if why != COUNTS_ROWS]
        identifiers = {}
    say_kinds(path, categorical, identifiers, gaps)
    return [name for name in named if name not in identifiers], categorical


def column_kinds(
    header: list[str], rows: list[list[str]], named: list[str]
) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """``data.categorical=auto`` on the ``named`` feature columns: the categorical ones (a
    value that is not a number, gaps aside); the identifiers left out, each with why: a text
    column of nearly one value a row, or a number column counting the rows (1, 2, 3...), which
    would teach the model the file's order; and the number columns' gap counts."""
    categorical, identifiers, gaps = [], {}, {}
    for name in named:
        at = header.index(name)
        present = [row[at].strip() for row in rows if not is_gap(row[at])]
        numbers = [_float_or_none(text) for text in present]
        distinct = len(set(present))
        if None not in numbers:
            steps = {b - a for a, b in itertools.pairwise(numbers)}
            if len(present) == len(rows) >= MIN_IDENTIFIER_VALUES and steps == {1.0}:
                identifiers[name] = COUNTS_ROWS
            elif len(present) < len(rows):
                gaps[name] = len(rows) - len(present)
            continue
        if distinct >= max(MIN_IDENTIFIER_VALUES, IDENTIFIER_SHARE * len(rows)):
            identifiers[name] = f"{distinct:,} distinct values in {len(rows):,} rows"
        else:
            categorical.append(name)
    return categorical, identifiers, gaps


def say_kinds(
    path: Path, categorical: list[str], identifiers: dict[str, str], gaps: dict[str, int]
) -> None:
    """The start-up line of ``data.categorical=auto``: what it chose, left out and found gaps in."""
    shown = ", ".join(categorical) if categorical else "none"
    left = "; ".join(f"{name} ({why})" for name, why in identifiers.items())
    log.info(
        "%s: data.categorical=auto: categorical (not all numbers): %s%s; gaps in %s",
        path.name,
        shown,
        f"; left out as identifiers: {left} (data.features=[...] keeps one)" if left else "",
        ", ".join(f"{name} ({count})" for name, count in gaps.items()) if gaps else "no column",
    )


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
