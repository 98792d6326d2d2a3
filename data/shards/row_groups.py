"""Parquet shards read into tensors, a row group at a time (data=parquet).

What a split's shards hold is found from their footers alone (row groups, rows, the schema);
their columns become tensors as the other kinds': an image column (encoded bytes, Hugging
Face's ``{bytes, path}`` struct, or fixed-size uint8 pixels) → uint8 [C, H, W]; an array column
(a fixed-size list of numbers) → float32 of its recorded shape; number columns → float32
features [F]. The target: class names or integers → class indices (classes sorted as the CSV
reader sorts them), or number columns → float32 values (task=regression). Everything read from
a shard is checked where it enters: a wrong type, a gap, a corrupt row group is one line
naming the object, the row group and the column.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from data.batching.targets import SET_SEPARATOR, sorted_names
from data.images.pixels import decoded
from data.shards.cache import ShardCache
from data.shards.storage import (
    Shard,
    arrow,
    endpoint,
    parquet_file,
    read_row_group,
)
from utils.errors import UserError

MAX_PIXELS = 2**26  # elements of one array or image sample read from a shard: 64 Mi


@dataclass(frozen=True)
class Columns:
    """Which columns a split reads and what they become: ``kind`` ``image`` (one column of
    images, decoded to ``shape`` [C, H, W]), ``array`` (one column of fixed-size lists, of
    ``shape``) or ``features`` (number columns); ``target`` the target columns, as class
    indices of ``classes`` or as ``values``."""

    kind: str
    inputs: tuple[str, ...]
    shape: tuple[int, ...]
    target: tuple[str, ...]
    classes: tuple[str, ...] | None  # None: the target's values are learnt (regression)
    sets: bool = False  # label sets (task=multilabel): ``classes`` are the labels
    # of ``features``: the text columns among ``inputs`` and their categories (of the train
    # split), one-hot after the number columns, as the CSV reader encodes them
    categories: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def numbers(self) -> tuple[str, ...]:
        text = {name for name, _ in self.categories}
        return tuple(name for name in self.inputs if name not in text)

    @property
    def width(self) -> int:
        return len(self.numbers) + sum(len(values) for _, values in self.categories)

    @property
    def read(self) -> list[str]:
        return [*self.inputs, *self.target]


@dataclass(frozen=True)
class RowGroups:
    """Reads and decodes a split's row group ``g`` (numbered in file order): picklable, so the
    DataLoader workers of data/shards/batches.py call it in their own processes."""

    shards: tuple[Shard, ...]
    groups: tuple[tuple[int, int], ...]  # (shard, row group within it), in file order
    sizes: tuple[int, ...]  # the rows of each
    columns: Columns
    cache: ShardCache | None = None  # data.shard_cache_gb: fetched row groups kept on disk

    def __call__(
        self, g: int, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Row group ``g``'s inputs and targets; with ``rows``, only those rows' inputs are
        decoded (the others are zeros: no batch of this process takes them)."""
        index, group = self.groups[g]
        shard = self.shards[index]
        where = f"{shard.name} row group {group}"
        table = self.fetched(shard, group, self.sizes[g])
        targets = targets_of(table, self.columns, where)
        if rows is None or len(rows) == table.num_rows:
            return inputs_of(table, self.columns, where), targets
        decoded = inputs_of(table.take(rows.numpy()), self.columns, where)
        inputs = torch.zeros((table.num_rows, *decoded.shape[1:]), dtype=decoded.dtype)
        inputs[rows] = decoded
        return inputs, targets

    def fetched(self, shard: Shard, group: int, rows: int) -> Any:
        """The columns of row group ``group`` of ``shard``: from the local cache when it holds
        them, else read (and kept)."""
        columns = self.columns.read
        if self.cache is None:
            return read_row_group(shard, group, columns)
        key = self.cache.key(endpoint(), shard.name, shard.size, shard.version, group, columns)
        table = self.cache.get(key, rows, columns)
        if table is None:
            table = read_row_group(shard, group, columns)
            if table.num_rows == rows:
                self.cache.put(key, table)
        return table


def row_groups(shards: list[Shard]) -> tuple[list[tuple[int, int]], list[int], Any]:
    """((shard, row group) of every row group, in file order; their rows; the first shard's
    Arrow schema), from the footers alone. Every shard must hold the first one's columns."""
    groups, sizes, schema = [], [], None
    for index, shard in enumerate(shards):
        opened = parquet_file(shard)
        meta = opened.metadata
        if schema is None:
            schema = opened.schema_arrow
        elif not set(schema.names) <= set(opened.schema_arrow.names):
            missing = sorted(set(schema.names) - set(opened.schema_arrow.names))
            raise UserError(
                f"{shard.name} lacks column {missing[0]!r} that {shards[0].name} holds; "
                "every shard of a split must hold the same columns"
            )
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            if rows:
                groups.append((index, group))
                sizes.append(rows)
    if not sizes:
        raise UserError(f"{shards[0].name}: its shards hold no rows; write some, or check the path")
    return groups, sizes, schema


def footprint(shards: list[Shard]) -> str:
    """The sha256 of what the shards are, without reading them: each object's name, size and
    version (ETag or modification time) and its Parquet footer (schema and row groups)."""
    digest = hashlib.sha256()
    for shard in shards:
        digest.update(json.dumps(_described(shard), default=str).encode())
    return digest.hexdigest()


def footprints(shards: list[Shard]) -> dict[str, str]:
    """Each object's own sha256 of what :func:`footprint` covers, by name: a resume on changed
    shards names the objects that changed."""
    return {
        shard.name: hashlib.sha256(json.dumps(_described(shard), default=str).encode()).hexdigest()
        for shard in shards
    }


def _described(shard: Shard) -> list:
    meta = parquet_file(shard).metadata
    footer = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    schema = parquet_file(shard).schema_arrow.to_string()
    return [shard.name, shard.size, shard.version, schema, footer]


def target_column(shards: list[Shard], groups: list[tuple[int, int]], names: Sequence[str]) -> Any:
    """The target columns of every row group, read column by column (cheap in Parquet): what
    the classes are found from, and what stratifies and weights them."""
    arrow()  # the extra, named in one line when missing
    import pyarrow as pa

    return pa.concat_tables([read_row_group(shards[s], g, list(names)) for s, g in groups])


def classes_of(table: Any, column: str, where: str) -> tuple[str, ...]:
    """The sorted class names of a class column (strings, or integers as text); a gap is a
    missing label, never a class."""
    values = table.column(column).to_pylist()
    if any(value is None or (isinstance(value, str) and not value.strip()) for value in values):
        raise UserError(
            f"{where}: data.target column {column!r} has a missing label; a class is not learnt "
            "from a gap: give those rows their class or remove them"
        )
    return tuple(sorted_names({str(value).strip() for value in values}))


def label_names(table: Any, column: str, where: str) -> tuple[str, ...]:
    """The sorted labels of a label-set column (task=multilabel): a list of strings a cell,
    as pandas and Hugging Face write them, or one string of labels joined by ``;``."""
    import pyarrow.compute as pc

    labels = pc.utf8_trim_whitespace(_label_lists(table.column(column), where).flatten())
    names = {name for name in pc.unique(labels).to_pylist() if name}
    if not names:
        raise UserError(f"{where}: data.target column {column!r} holds no labels")
    return tuple(sorted_names(names))


def _label_lists(column: Any, where: str) -> Any:
    """A label-set column as one list of strings a row (a gap: the empty set)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lists = column.combine_chunks()
        return lists.cast(pa.list_(pa.string())).fill_null(pa.scalar([], pa.list_(pa.string())))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = column.combine_chunks().cast(pa.string()).fill_null("")
        return pc.split_pattern(text, SET_SEPARATOR)
    raise UserError(
        f"{where}: the label-set column holds {kind}; write a list of label names a row, or "
        f"the names joined by '{SET_SEPARATOR}'"
    )


def _multi_hot(table: Any, columns: Columns, where: str) -> torch.Tensor:
    """Label sets → a 0/1 float32 matrix [rows, labels]; a label the train split lacks is one
    line naming it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = _label_lists(table.column(columns.target[0]), where)
    labels = pc.utf8_trim_whitespace(lists.flatten())
    rows = pc.list_parent_indices(lists)
    given = pc.not_equal(labels, "")
    labels, rows = labels.filter(given), rows.filter(given)
    found = pc.index_in(labels, value_set=pa.array(columns.classes, pa.string()))
    if found.null_count:
        unknown = labels.filter(pc.is_null(found)).to_pylist()[0]
        raise UserError(
            f"{where}: label {unknown!r} of {columns.target[0]} is not a label of the train "
            f"split ({', '.join(columns.classes[:10])}{'...' if len(columns.classes) > 10 else ''})"
        )
    matrix = torch.zeros(table.num_rows, len(columns.classes))
    at_row = torch.from_numpy(rows.to_numpy(zero_copy_only=False).astype(np.int64))
    at_label = torch.from_numpy(found.to_numpy(zero_copy_only=False).astype(np.int64))
    matrix[at_row, at_label] = 1.0
    return matrix


def targets_of(table: Any, columns: Columns, where: str) -> torch.Tensor:
    if columns.sets:
        return _multi_hot(table, columns, where)
    if columns.classes is None:
        return torch.from_numpy(_numbers(table, columns.target, where)).to(torch.float32)
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(columns.target[0])
    names = pc.utf8_trim_whitespace(column.cast(pa.string()))
    found = pc.index_in(names, value_set=pa.array(columns.classes, pa.string()))  # vectorised
    if found.null_count:
        unknown = names.filter(pc.is_null(found)).to_pylist()[:1] or [None]
        raise UserError(
            f"{where}: {columns.target[0]}={unknown[0]!r} is not a class of the train split "
            f"({', '.join(columns.classes[:10])}{'...' if len(columns.classes) > 10 else ''})"
        )
    return torch.from_numpy(found.to_numpy(zero_copy_only=False).astype(np.int64))


def inputs_of(table: Any, columns: Columns, where: str) -> torch.Tensor:
    if columns.kind == "features":
        numbers = torch.from_numpy(_numbers(table, columns.numbers, where))
        return torch.cat([numbers, *_one_hot(table, columns.categories)], dim=1)
    column = columns.inputs[0]
    whole = _fixed_size(table.column(column), columns, table.num_rows)
    if whole is not None:  # pixels or numbers of one fixed size: one copy, no loop in Python
        return whole
    values = table.column(column).to_pylist()
    if columns.kind == "array":
        return torch.stack(
            [_array(v, columns.shape, f"{where}, column {column!r}") for v in values]
        )
    channels, height, width = columns.shape
    return torch.stack(
        [_image(v, (height, width), channels, f"{where}, column {column!r}") for v in values]
    )


def _fixed_size(column: Any, columns: Columns, rows: int) -> torch.Tensor | None:
    """A fixed-size list column without gaps whose values are uint8 pixels (an image column)
    or numbers (an array column), of the columns' shape, as one tensor; None for any other."""
    import pyarrow as pa

    kind, size = column.type, int(np.prod(columns.shape))
    if pa.types.is_fixed_size_binary(kind) and columns.kind == "image":
        return _raw_pixels(column, size, columns.shape, rows)
    if not pa.types.is_fixed_size_list(kind) or column.null_count:
        return None
    values = column.combine_chunks().flatten()
    pixels = columns.kind == "image" and pa.types.is_uint8(kind.value_type)
    numbers = columns.kind == "array" and pa.types.is_floating(kind.value_type)
    numbers = numbers or (columns.kind == "array" and pa.types.is_integer(kind.value_type))
    if (
        not (pixels or numbers)
        or values.null_count
        or len(values) != rows * int(np.prod(columns.shape))
    ):
        return None
    array = values.to_numpy(zero_copy_only=False).reshape(rows, *columns.shape)
    if numbers and not np.isfinite(array).all():
        return None  # the per-cell path names the bad value
    return torch.from_numpy(array.astype(np.uint8 if pixels else np.float32, copy=True))


def _raw_pixels(column: Any, size: int, shape: tuple, rows: int) -> torch.Tensor | None:
    """A fixed-size binary column of C·H·W bytes a cell (as shard.py writes pixels: one byte a
    pixel on disk, read without decoding), as uint8 [rows, C, H, W]; None for any other."""
    if column.type.byte_width != size or column.null_count:
        return None
    chunk = column.combine_chunks()
    data = chunk.buffers()[1]
    array = np.frombuffer(data, dtype=np.uint8, count=rows * size, offset=chunk.offset * size)
    return torch.from_numpy(array.reshape(rows, *shape).copy())


def text_categories(table: Any, names: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each text column's categories (its distinct values, trimmed; a gap is none), sorted as
    the CSV reader sorts them: fitted on the train split's whole column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fitted = []
    for name in names:
        values = pc.utf8_trim_whitespace(table.column(name).cast(pa.string()))
        fitted.append((name, tuple(sorted(v for v in pc.unique(values).to_pylist() if v))))
    return tuple(fitted)


def _one_hot(table: Any, categories: Sequence) -> list[torch.Tensor]:
    """Each text column one-hot over its categories; a gap or a value the train split never
    held is all zeros (the CSV reader's rule for unseen categories)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    for name, values in categories:
        text = pc.utf8_trim_whitespace(table.column(name).cast(pa.string()))
        found = pc.index_in(text, value_set=pa.array(values, pa.string()))
        at = torch.from_numpy(found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
        hot = torch.zeros(table.num_rows, len(values) + 1)
        hot[torch.arange(table.num_rows), at] = 1.0  # -1: the last, dropped, column
        parts.append(hot[:, : len(values)])
    return parts


def _numbers(table: Any, names: Sequence[str], where: str) -> np.ndarray:
    """Number columns as float32 [rows, columns]; a gap, a text or an infinite value is one
    line naming the column."""
    if not names:
        return np.zeros((table.num_rows, 0), dtype=np.float32)
    parts = []
    for name in names:
        column = table.column(name)
        try:
            values = column.to_numpy(zero_copy_only=False).astype(np.float32)
        except (ValueError, TypeError):
            raise UserError(
                f"{where}: column {name!r} holds {column.type}, not numbers; leave it out of "
                "data.features"
            ) from None
        if column.null_count or not np.isfinite(values).all():
            raise UserError(
                f"{where}: column {name!r} has a gap or a value that is not finite; fill it "
                "when writing the shards"
            )
        parts.append(values)
    return np.stack(parts, axis=1)


def _array(value: Any, shape: tuple[int, ...], where: str) -> torch.Tensor:
    flat = np.asarray(value, dtype=np.float32) if value is not None else None
    if flat is None or flat.size != int(np.prod(shape)) or flat.size > MAX_PIXELS:
        raise UserError(f"{where}: a value is not {list(shape)} numbers; write it again")
    return torch.from_numpy(flat.reshape(shape))


def _image(value: Any, size: tuple[int, int], channels: int, where: str) -> torch.Tensor:
    """An image cell: encoded bytes, a ``{bytes, path}`` struct, or C·H·W uint8 pixels."""
    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, bytes | bytearray):
        return decoded(io.BytesIO(value), size, channels, where)
    if isinstance(value, list) and len(value) == channels * size[0] * size[1]:
        pixels = np.asarray(value)
        if pixels.min(initial=0) < 0 or pixels.max(initial=0) > 255:
            raise UserError(f"{where}: a pixel is outside 0..255; write the images again")
        return torch.from_numpy(pixels.astype(np.uint8).reshape(channels, *size))
    raise UserError(
        f"{where}: a cell is neither an encoded image nor {channels}x{size[0]}x{size[1]} uint8 "
        "pixels; check data.image, data.image_size and data.channels"
    )
