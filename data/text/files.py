"""Texts and their targets read from files (``data=text``): a CSV or TSV file, a JSON-lines
file (``.jsonl``: one object a line), or a folder with one sub-folder of ``.txt`` files per
class (the layout of the public review sets: ``train/pos/1.txt``). Each becomes a header and
rows of strings, so the targets are read by data/tables/target_columns.py as a table's are.

Files from elsewhere are read strictly: UTF-8 only (a BOM is allowed), and an undecodable byte,
a NUL byte or a text longer than :data:`MAX_TEXT_CHARS` is one line naming the file and line.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from utils.errors import UserError

log = logging.getLogger("torchloom")

MAX_TEXT_CHARS = 1_000_000  # one text (a cell, a line, a file): about 200 pages
MAX_FILE_BYTES = 2**31  # one file read whole: 2 GB
TEXT_EXTENSIONS = {".csv", ".tsv", ".tab", ".jsonl"}
FOLDER_HEADER = ["text", "label"]  # a class folder's texts read as these two columns
SEPARATOR = " [SEP] "  # between the columns of data.text=[a, b]


def decoded(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The text of ``path``: UTF-8, else one line naming the line of the first bad byte."""
    try:
        if path.stat().st_size > limit:
            raise UserError(
                f"{path} is {path.stat().st_size / 2**30:.1f} GB, more than the "
                f"{limit / 2**30:.0f} GB a text file read whole may be; split it into files"
            )
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    return utf8_text(data, path)


def utf8_text(data: bytes, path: Path) -> str:
    """``data`` (the bytes of ``path``) as UTF-8 text, else one line naming the line of the
    first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise UserError(
            f"{path} line {line}: byte 0x{data[error.start]:02x} is not UTF-8; save the file "
            "as UTF-8 (iconv -f <its encoding> -t utf-8)"
        ) from None


def read_rows(path: Path) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, names) of a text file or class folder; ``names`` say where each row is
    (``line 7``, ``pos/12.txt``) for the lines that refuse one."""
    if path.is_dir():
        return _read_folder(path)
    if not path.is_file():
        raise UserError(f"data.path={path}: no such file or folder")
    if path.suffix.lower() not in TEXT_EXTENSIONS:
        raise UserError(
            f"data.path={path}: a text file is {', '.join(sorted(TEXT_EXTENSIONS))}, or a folder "
            "of class sub-folders of .txt files"
        )
    text = decoded(path)
    if path.suffix.lower() == ".jsonl":
        return _read_json_lines(path, text)
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    limit = csv.field_size_limit(MAX_TEXT_CHARS + 1)  # longer cells are named below
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        rows = list(reader)
    except csv.Error as error:  # a cell over the limit, a broken quote
        raise UserError(
            f"{path} line {reader.line_num}: {error} (a text of more than "
            f"{MAX_TEXT_CHARS:,} characters?); split such documents or drop that row"
        ) from None
    finally:
        csv.field_size_limit(limit)
    if len(rows) < 2:
        raise UserError(f"{path} has no data rows (the first row names the columns)")
    header = [name.strip() for name in rows[0]]
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise UserError(
                f"{path} line {line} has {len(row)} values; the header names {len(header)} columns"
            )
        _check_cells(row, path, f"line {line}")
    return header, rows[1:], [f"line {n}" for n in range(2, len(rows) + 1)]


def _check_cells(cells: Sequence[str], path: Path, where: str) -> None:
    for cell in cells:
        if "\0" in cell:
            raise UserError(
                f"{path} {where}: holds a NUL byte (\\x00), which no text does; fix that row "
                "(is the file damaged or binary?)"
            )
        if len(cell) > MAX_TEXT_CHARS:
            raise UserError(
                f"{path} {where}: a text of {len(cell):,} characters, more than "
                f"{MAX_TEXT_CHARS:,}; split such documents or drop that row"
            )


def _read_json_lines(path: Path, text: str) -> tuple[list[str], list[list[str]], list[str]]:
    """One JSON object a line; the header is the first object's keys; a list value is a label
    set (``a;b``)."""
    header: list[str] | None = None
    rows, names = [], []
    for line, content in enumerate(text.splitlines(), start=1):
        if not content.strip():
            continue
        if len(content) > MAX_TEXT_CHARS + 10_000:
            _check_cells([content], path, f"line {line}")
        try:
            record = json.loads(content)
        except (json.JSONDecodeError, RecursionError):
            raise UserError(f"{path} line {line}: not a JSON object; one object a line") from None
        if not isinstance(record, dict):
            raise UserError(f"{path} line {line}: not a JSON object; one object a line")
        header = header or list(record)
        missing = [key for key in header if key not in record]
        if missing:
            raise UserError(f"{path} line {line}: no {missing[0]!r}, which line 1 has")
        row = [_cell(record[key]) for key in header]
        _check_cells(row, path, f"line {line}")
        rows.append(row)
        names.append(f"line {line}")
    if header is None:
        raise UserError(f"{path} holds no JSON lines")
    return header, rows, names


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    return "" if value is None else str(value)


def _read_folder(root: Path) -> tuple[list[str], list[list[str]], list[str]]:
    """``root/<class>/*.txt``: each file a text of that class. Hidden files and folders (a
    ``.ipynb_checkpoints/`` copy, read as more texts before) are skipped, and counted."""
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    rows, names, hidden = [], [], 0
    for folder in classes:
        for file in sorted(folder.rglob("*.txt")):
            if any(part.startswith(".") for part in file.relative_to(folder).parts):
                hidden += 1
                continue
            if not file.is_file():
                continue
            text = decoded(file, limit=4 * MAX_TEXT_CHARS)
            where = str(file.relative_to(root))
            _check_cells([text], root, where)
            rows.append([text, folder.name])
            names.append(where)
    if hidden:
        log.info(
            "data.path=%s: %d hidden .txt files skipped (names beginning with '.')", root, hidden
        )
    if not rows:
        raise UserError(
            f"data.path={root}: no .txt files in class sub-folders ({root}/<class>/<name>.txt)"
        )
    return list(FOLDER_HEADER), rows, names


def texts_of(
    header: list[str], rows: list[list[str]], columns: str | Sequence[str], path: Path
) -> list[str]:
    """The ``data.text`` column of each row, or its columns joined by :data:`SEPARATOR`."""
    names = [columns] if isinstance(columns, str) else list(columns)
    if not names:
        raise UserError("data.text=[] names no column; name the text column")
    for name in names:
        if name not in header:
            raise UserError(
                f"{path} has no column {name!r} for data.text; its columns are {', '.join(header)}"
            )
    at = [header.index(name) for name in names]
    return [SEPARATOR.join(row[i].strip() for i in at) for row in rows]
