"""Shards written from what torchloom reads (shard.py): each split's samples as Arrow tables,
then Parquet files of a chosen row-group and file size, each written whole or not at all.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import torch

from data.shards.storage import arrow, filesystem


def split_table(inputs: torch.Tensor, targets: torch.Tensor, names: Any, images: str) -> Any:
    """Samples as an Arrow table: uint8 images as C·H·W bytes a cell (fixed-size binary) or
    PNG bytes (``images``: pixels | png) in ``image``, other inputs as fixed-size float32 lists in ``x``;
    the target as class names (``names``), integers, label sets (0/1 rows with ``names``: a
    list of names a row) or float values in ``label``."""
    import pyarrow as pa

    flat = inputs.reshape(len(inputs), -1)
    if inputs.dtype == torch.uint8 and images == "png":
        column, name = pa.array([_png(image) for image in inputs], pa.binary()), "image"
    elif inputs.dtype == torch.uint8:  # one byte a pixel on disk (a uint8 list is 4: INT32)
        raw = pa.py_buffer(flat.contiguous().numpy().tobytes())
        kind = pa.binary(flat.shape[1])
        column, name = pa.FixedSizeBinaryArray.from_buffers(kind, len(flat), [None, raw]), "image"
    else:
        values = pa.array(flat.to(torch.float32).numpy().ravel(), pa.float32())
        column, name = pa.FixedSizeListArray.from_arrays(values, flat.shape[1]), "x"
    if targets.is_floating_point() and names:  # label sets (0/1 per name): their names
        label = pa.array(
            [[names[i] for i in row.nonzero().view(-1).tolist()] for row in targets],
            pa.list_(pa.string()),
        )
    elif targets.dtype == torch.long and names:
        label = pa.array([names[i] for i in targets.tolist()], pa.string())
    elif targets.dtype == torch.long:
        label = pa.array(targets.numpy(), pa.int64())
    else:
        rows = targets.reshape(len(targets), -1).to(torch.float32)
        label = pa.FixedSizeListArray.from_arrays(pa.array(rows.numpy().ravel()), rows.shape[1])
        label = label if rows.shape[1] > 1 else pa.array(rows[:, 0].numpy())
    return pa.table({name: column, "label": label})


def _png(image: torch.Tensor) -> bytes:
    from PIL import Image

    pixels = image.permute(1, 2, 0).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(out, "PNG")
    return out.getvalue()


STREAM_COLUMN = "tokens"  # token shards' column of ids


def token_tables(ids: Any, per_row: int, rows: int) -> Iterator[Any]:
    """A stream of token ids (a 1-D tensor, in order) as Arrow tables of ``rows`` rows of
    ``per_row`` ids each (the last row shorter) in ``tokens``: uint16 lists where every id
    fits (a vocabulary of at most 65,536 ids, two bytes a token), int32 beyond."""
    import pyarrow as pa

    values = ids.numpy()  # int64, or a token cache's uint16 or int32
    wide = len(values) and int(values.max()) >= 1 << 16
    kind = pa.int32() if wide else pa.uint16()
    step = per_row * rows
    for lo in range(0, len(values), step):
        chunk = values[lo : lo + step].astype("int32" if wide else "uint16")
        offsets = pa.array([*range(0, len(chunk), per_row), len(chunk)], pa.int32())
        column = pa.ListArray.from_arrays(offsets, pa.array(chunk, kind))
        yield pa.table({STREAM_COLUMN: column})


def write_shards(tables: Any, url: str, rows_per_group: int, rows_per_file: int) -> list[str]:
    """Arrow tables (one split's samples, in order) as ``part-NNNNN.parquet`` files of
    ``rows_per_file`` rows in row groups of ``rows_per_group``, under ``url`` (a folder or an
    object store prefix), each file written whole or not at all. Returns their names."""
    import pyarrow as pa

    fs, pq = arrow()
    system, root = filesystem(url)
    local = isinstance(system, fs.LocalFileSystem)  # an object store's PUT is whole already
    written, pending, number = [], [], 0

    def flush(table: Any) -> None:
        nonlocal number
        target = f"{root.rstrip('/')}/part-{number:05d}.parquet"
        partial = f"{target}.partial" if local else target
        with system.open_output_stream(partial) as out:
            pq.write_table(table, out, row_group_size=rows_per_group, write_page_checksum=True)
        if local:
            system.move(partial, target)
        written.append(target)
        number += 1

    if local:
        system.create_dir(root, recursive=True)
    for table in tables:
        pending.append(table)
        held = pa.concat_tables(pending)
        while held.num_rows >= rows_per_file:
            flush(held.slice(0, rows_per_file))
            held = held.slice(rows_per_file)
        pending = [held] if held.num_rows else []
    if pending:
        flush(pa.concat_tables(pending))
    return written
