"""``data.categorical=auto``: which of a table's columns are categories (a value that is not a
number, gaps aside) and which are identifiers to leave out, said in one start-up line.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

from data.tables.missing import is_gap
from utils.errors import UserError

log = logging.getLogger("torchloom")

# data.categorical=auto: a text column with a distinct value on at least this share of the rows
# (and MIN_IDENTIFIER_VALUES of them) names rows rather than describing them: a name, an ID.
IDENTIFIER_SHARE = 0.5
MIN_IDENTIFIER_VALUES = 20
COUNTS_ROWS = "numbers the rows"
# An identifier-like column whose cells hold at least this many words on average is text: a
# review, a message (data=text trains on it; a table's model would only see it as a name).
TEXT_WORDS = 4
# A number column where at most this share of the cells (and STRAY_MOST of them) is text holds
# stray cells (a typo, a unit), not categories: they are named, never silently read.
STRAY_SHARE = 0.05
STRAY_MOST = 5


def auto_columns(
    header: list[str], rows: list[list[str]], named: list[str], listed: bool, path: Path
) -> tuple[list[str], list[str]]:
    """(the feature columns kept, the categorical ones) of ``named``, said in one line; columns
    ``listed`` by name in data.features are all kept (a text one is categorical)."""
    categorical, identifiers, gaps = column_kinds(header, rows, named, path)
    texts = [name for name, why in identifiers.items() if why.startswith("text")]
    if texts and len(identifiers) == len(named) and not listed:
        raise UserError(
            f"{path}: column {texts[0]!r} holds text ({identifiers[texts[0]]}), and the "
            "file has no other feature; data=csv reads numbers and categories: train on "
            f"the text with data=text data.path={path} data.text={texts[0]} data.target=..."
        )
    if listed:
        categorical += [name for name, why in identifiers.items() if why != COUNTS_ROWS]
        identifiers = {}
    say_kinds(path, categorical, identifiers, gaps)
    return [name for name in named if name not in identifiers], categorical


def column_kinds(
    header: list[str], rows: list[list[str]], named: list[str], path: Path
) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """``data.categorical=auto`` on the ``named`` feature columns: the categorical ones (a
    value that is not a number, gaps aside); the identifiers left out, each with why: a text
    column of nearly one value a row, or a number column numbering the rows (whole numbers
    rising, or falling, on every row: 1, 2, 4, 5..., gaps in the count included), which would
    teach the model the file's order; and the number columns' gap counts. A number column
    with a few stray text cells is refused, naming the first (:func:`check_strays`)."""
    categorical, identifiers, gaps = [], {}, {}
    for name in named:
        at = header.index(name)
        present = [row[at].strip() for row in rows if not is_gap(row[at])]
        numbers = [_float_or_none(text) for text in present]
        distinct = len(set(present))
        check_strays(name, [row[at] for row in rows], numbers, path)
        if None not in numbers:
            if len(present) == len(rows) >= MIN_IDENTIFIER_VALUES and numbers_rows(numbers):
                identifiers[name] = COUNTS_ROWS
            elif len(present) < len(rows):
                gaps[name] = len(rows) - len(present)
            continue
        if distinct >= max(MIN_IDENTIFIER_VALUES, IDENTIFIER_SHARE * len(rows)):
            words = sum(len(text.split()) for text in present) / max(1, len(present))
            identifiers[name] = (
                f"text of {words:.0f} words a row on average: data=text trains on it"
                if words >= TEXT_WORDS
                else f"{distinct:,} distinct values in {len(rows):,} rows"
            )
        else:
            categorical.append(name)
    return categorical, identifiers, gaps


def numbers_rows(numbers: list[float]) -> bool:
    """Whether ``numbers`` (a column, in file order) are whole numbers that rise (or fall) on
    every row: a row number or an ID given in order, whatever steps it skips."""
    steps = [b - a for a, b in itertools.pairwise(numbers)]
    whole = all(n == int(n) for n in numbers)
    return whole and (all(s > 0 for s in steps) or all(s < 0 for s in steps))


def check_strays(name: str, cells: list[str], numbers: list[float | None], path: Path) -> None:
    """A column of numbers but for a few text cells (``oops`` among 51 numbers) is refused,
    naming the first cell's line and value and the ways to read the column."""
    strays = numbers.count(None)
    one_allowed = 1 if len(numbers) >= MIN_IDENTIFIER_VALUES else 0  # 1 in 3 may be a category
    if not strays or strays > min(STRAY_MOST, max(one_allowed, STRAY_SHARE * len(numbers))):
        return
    line, value = next(
        (n + 2, cell.strip())
        for n, cell in enumerate(cells)
        if not is_gap(cell) and _float_or_none(cell.strip()) is None
    )
    raise UserError(
        f"{path} line {line}, column {name!r}: {value!r} is not a number, where "
        f"{len(numbers) - strays} of the column's cells are ({strays} are not); fix the "
        f"cell, make it a gap (empty or NA), or list {name} in data.categorical=[...] to "
        "read the column as categories"
    )


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
