"""Which columns of a split's shards are the input, and what they become (data=parquet): the
image column (encoded, ``{bytes, path}`` structs, or C·H·W pixels) and its shape, else an
array column, else a table's columns — numbers as they are, text one-hot over the train split's
values, as the CSV reader encodes them.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any

import torch

from data.images.pixels import decoded
from data.shards.row_groups import Columns, target_column, text_categories
from data.shards.storage import read_row_group
from utils.config.arguments import MAX_IMAGE_PIXELS
from utils.errors import UserError

DESCRIPTION = "torchloom.json"  # shard.py's description of the shards (data/shards/parquet.py)
MAX_CHANNELS = 64  # an image's channels: grey, RGB, RGBA or a multispectral band stack


def input_columns(
    schema: Any, target: list[str], asked: tuple, described: dict, classes: Any, train: Any
) -> Columns:
    """Which columns are the input, and its shape: the image column (``data.image``, or the
    one binary, ``{bytes, path}`` or uint8-list column), else an array column, else the number
    columns (``data.features``, or every one but the target)."""
    import pyarrow as pa

    image, features, shape = asked
    others = [n for n in schema.names if n not in target]
    image = described.get("image") if image == "auto" and "image" in described else image

    def is_image(field: Any) -> bool:
        kind = field.type
        bytes_struct = pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0
        uint8_list = pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind)
        uint8_list = uint8_list and pa.types.is_uint8(kind.value_type)
        binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
        return binary or pa.types.is_fixed_size_binary(kind) or bytes_struct or uint8_list

    if image == "auto":
        found = [n for n in others if is_image(schema.field(n))]
        image = found[0] if len(found) == 1 else None
    given = "data.shape"
    if shape == "auto" and "shape" in described:
        shape, given = described["shape"], f"{DESCRIPTION}'s shape"
    classes = tuple(classes) if classes else None
    if image:
        if image not in schema.names:
            raise UserError(f"data.image={image!r} is not a column ({', '.join(schema.names)})")
        shape = _image_shape(train, image, shape, given)
        return Columns("image", (image,), shape, tuple(target), classes)
    arrays = [n for n in others if pa.types.is_fixed_size_list(schema.field(n).type)]
    if features is None and len(arrays) == 1:
        width = schema.field(arrays[0]).type.list_size
        shape = _array_shape(shape, width, given, arrays[0])
        return Columns("array", (arrays[0],), shape, tuple(target), classes)
    chosen = list(features) if features is not None else others
    unknown = [n for n in chosen if n not in schema.names]
    if unknown:
        raise UserError(
            f"data.features: {unknown[0]!r} is not a column ({', '.join(schema.names)})"
        )
    text = [n for n in chosen if _is_text(schema.field(n).type)]
    whole = target_column(list(train.shards), list(train.groups), text) if text else None
    categories = text_categories(whole, text) if text else ()
    columns = Columns("features", tuple(chosen), (0,), tuple(target), classes)
    columns = dataclasses.replace(columns, categories=categories)
    return dataclasses.replace(columns, shape=(columns.width,))


def _array_shape(shape: Any, width: int, given: str, column: str) -> tuple[int, ...]:
    """An array column's shape: ``data.shape`` (or torchloom.json's: ``given``), which must
    hold exactly the column's ``width`` values, else ``(width,)``."""
    if shape == "auto":
        return (width,)
    whole = isinstance(shape, Sequence) and not isinstance(shape, str) and len(shape) >= 1
    dims = list(shape) if whole else []
    if not dims or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in dims):
        raise UserError(f"{given}={shape!r} must be a list of whole numbers, each 1 or more")
    if math.prod(dims) != width:
        raise UserError(
            f"{given}={dims}: {math.prod(dims):,} values, and column {column!r} holds {width:,} "
            "a row; give a shape of exactly that many values"
        )
    return tuple(dims)


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _image_shape(train: Any, column: str, shape: Any, given: str) -> tuple[int, int, int]:
    """[C, H, W]: ``data.shape`` (or torchloom.json's: ``given`` names which), else the first
    image's size and mode. A shape every image of a run is resized to is bounded as an image
    folder's size is: 60 bytes of torchloom.json claiming [3, 20000, 20000] made every image
    be resized to 1.2 GB of pixels."""
    if shape != "auto":
        whole = isinstance(shape, Sequence) and not isinstance(shape, str) and len(shape) == 3
        if not whole or not all(isinstance(v, int) and not isinstance(v, bool) for v in shape):
            raise UserError(f"{given}={shape!r} must be [channels, height, width]")
        shape = list(shape)
        channels, height, width = shape
        if not (1 <= channels <= MAX_CHANNELS and min(height, width) >= 1) or (
            height * width > MAX_IMAGE_PIXELS
        ):
            raise UserError(
                f"{given}={list(shape)}: an image is 1 to {MAX_CHANNELS} channels of at most "
                f"{MAX_IMAGE_PIXELS:,} pixels (4,096 x 4,096), as an image folder's; pass "
                "data.shape=[channels,height,width] within that (images are resized to it)"
            )
        return tuple(shape)
    from PIL import Image

    first = train.shards[train.groups[0][0]]
    table = read_row_group(first, train.groups[0][1], [column])
    value = table.column(column)[0].as_py()
    value = value.get("bytes") if isinstance(value, dict) else value
    raw = table.schema.field(column).type
    import pyarrow as pa

    if not isinstance(value, bytes | bytearray) or (
        pa.types.is_fixed_size_binary(raw) and not _encoded(value)
    ):
        raise UserError(
            f"{first.name}: column {column!r} holds pixels without their shape; pass "
            "data.shape=[channels,height,width]"
        )
    image = Image.open(io.BytesIO(value))
    channels = 1 if image.mode in ("1", "L", "LA", "I", "I;16", "F") else 3
    width, height = image.size
    decoded(io.BytesIO(value), (height, width), channels, f"{first.name} row 0")  # it decodes
    return channels, height, width


def encoded_column(schema: Any, columns: Columns) -> bool:
    """Whether the image column holds encoded files (decoded one by one), not C·H·W pixels."""
    import pyarrow as pa

    kind = schema.field(columns.inputs[0]).type
    pixels = int(torch.tensor(columns.shape).prod())
    if pa.types.is_fixed_size_binary(kind):
        return kind.byte_width != pixels
    return not (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind))


def _encoded(value: bytes) -> bool:
    """Whether ``value`` starts as an image file does (PIL can tell its format)."""
    from PIL import Image, UnidentifiedImageError

    try:
        Image.open(io.BytesIO(value))
    except (UnidentifiedImageError, OSError, ValueError):
        return False
    return True


def said(columns: Columns) -> str:
    what = {"image": "images", "array": "arrays", "features": "columns"}[columns.kind]
    inputs = ", ".join(columns.inputs[:8]) + ("..." if len(columns.inputs) > 8 else "")
    target = f"{len(columns.classes)} classes" if columns.classes else "values"
    target = f"sets of {len(columns.classes)} labels" if columns.sets else target
    said = f"{what} {inputs} {list(columns.shape)} -> {', '.join(columns.target)} ({target})"
    if columns.categories:  # text columns, one-hot over the train split's values
        said += "; one-hot: " + ", ".join(f"{n} ({len(v)})" for n, v in columns.categories)
    return said
