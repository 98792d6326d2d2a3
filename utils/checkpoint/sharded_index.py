"""Is a sharded checkpoint's index one torchloom can read as data?

DCP's ``.metadata`` is a pickle. It is read by an unpickler that builds only DCP's own metadata
classes, ``torch.Size``, dtypes and paths (as ``weights_only`` does for ``torch.load``); anything
else is refused in one line and nothing runs. What it built is then checked as a whole before
DCP reads a byte of the tensors: every tensor entry holds a real dtype, a size of whole numbers
and chunks inside that size that cover it exactly, none overlapping another (two chunks over
one part left another unread: read as zeros), each with a storage entry at least as large as
its values; entries of pickled objects (which DCP would load with ``weights_only=False``) are
refused; every storage entry names a plain file inside the folder, untransformed, and a range
within that file's bytes that no other entry's range overlaps. So the sizes claimed are
bounded by the bytes the folder holds before anything is allocated (a 16 MB checkpoint whose
entries all named one record claimed gigabytes). An index that fails any of these (edited, or
a file cut short) is refused in one line naming the entry.
"""

from __future__ import annotations

import io
import itertools
import math
import pickle
from pathlib import Path
from typing import Any

import torch

from utils.errors import UserError
from utils.files import SHARDED_INDEX

METADATA = SHARDED_INDEX
MAX_METADATA_BYTES = 2**28  # 256 MiB of index: far more than any model's
# The dtypes a model's and an optimizer's tensors are written in; a complex one would be cast
# into the model with no more than torch's warning.
DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.bool}
DTYPES |= {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _Allowlisted(pickle.Unpickler):
    """Builds DCP's metadata classes and plain values only."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def read_metadata(folder: Path) -> Any:
    """The DCP metadata of ``folder``, read as data: one line naming the folder and what it
    asks for when it is anything but DCP's own index of this folder's files."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = folder / METADATA
    if not path.is_file():
        raise UserError(f"{folder}: no {METADATA}; not a sharded checkpoint torchloom wrote")
    if path.stat().st_size > MAX_METADATA_BYTES:
        raise UserError(f"{path} is larger than any checkpoint's index; was it replaced?")
    try:
        metadata = _Allowlisted(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as error:
        raise UserError(
            f"refusing to load {folder}: its {METADATA} would import {error}, which no "
            "checkpoint needs; it may be hostile, so nothing from it was run"
        ) from None
    except Exception:
        raise UserError(f"{path} is not a checkpoint index torchloom can read") from None
    tensors, storage = getattr(metadata, "state_dict_metadata", None), metadata.storage_data
    if not isinstance(metadata, Metadata) or not isinstance(tensors, dict):
        raise UserError(f"{path} is not a checkpoint index torchloom can read")
    if not isinstance(storage, dict):
        raise UserError(f"{path}: it indexes no files; the checkpoint is incomplete or was edited")
    for info in storage.values():
        _check_stored_range(folder, info)
    _check_disjoint_ranges(path, storage.values())
    for key, entry in tensors.items():
        _check_tensor(path, key, entry, storage)
    return metadata


def _edited(path: Path, key: Any, what: str) -> UserError:
    return UserError(
        f"{path}: {key!r} {what}; the checkpoint was edited or is not one torchloom wrote"
    )


def _whole_numbers(values: Any, length: int | None = None) -> bool:
    return (
        isinstance(values, tuple)
        and (length is None or len(values) == length)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in values)
    )


def _check_tensor(path: Path, key: Any, entry: Any, storage: dict) -> None:
    """The tensor entry ``key`` is one DCP writes for a tensor: a dtype of :data:`DTYPES`, a
    size of whole numbers, chunks inside it that cover it without overlapping, each stored in
    a range of at least its values' bytes."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    if not isinstance(entry, TensorStorageMetadata):
        raise UserError(
            f"refusing to load {path.parent}: {key!r} is a pickled object, which torchloom "
            "never writes into a sharded checkpoint and would have to run to read"
        )
    properties, size, chunks = entry.properties, entry.size, entry.chunks
    if not isinstance(properties, TensorProperties) or properties.dtype not in DTYPES:
        raise _edited(path, key, f"has the dtype {getattr(properties, 'dtype', None)}")
    if not _whole_numbers(size):
        raise _edited(path, key, f"has a size that is not one ({size!r})")
    element = torch.empty(0, dtype=properties.dtype).element_size()
    covered = 0
    for chunk in chunks if isinstance(chunks, list) else [None]:
        if not (
            isinstance(chunk, ChunkStorageMetadata)
            and _whole_numbers(chunk.offsets, len(size))
            and _whole_numbers(chunk.sizes, len(size))
            and all(o + n <= d for o, n, d in zip(chunk.offsets, chunk.sizes, size, strict=True))
        ):
            raise _edited(path, key, f"has a chunk outside its size {list(size)}")
        stored = storage.get(MetadataIndex(key, chunk.offsets))
        if stored is None:
            raise _edited(path, key, f"has a chunk at {list(chunk.offsets)} stored nowhere")
        if math.prod(chunk.sizes) * element > stored.length:
            raise _edited(
                path,
                key,
                f"has a chunk at {list(chunk.offsets)} of more values than its record holds "
                f"({stored.length} bytes)",
            )
        covered += math.prod(chunk.sizes)
    if covered != math.prod(size):
        raise _edited(path, key, f"has chunks of {covered} values for a size of {list(size)}")
    overlap = _overlapping(chunks)
    if overlap is not None:
        raise _edited(path, key, f"has chunks at {overlap[0]} and {overlap[1]} that overlap")


def _overlapping(chunks: list) -> tuple[list[int], list[int]] | None:
    """The offsets of two chunks (boxes) that share a value, or None. Swept along the first
    dimension: chunks that a process each holds (rows of it) are compared with no other."""
    boxes = sorted(
        (tuple(c.offsets), tuple(c.sizes)) for c in chunks if c.sizes and math.prod(c.sizes)
    )
    if not boxes or not boxes[0][0]:  # scalars: one chunk each, already counted
        return None
    open_boxes: list[tuple[tuple, tuple]] = []
    for offsets, sizes in boxes:
        open_boxes = [b for b in open_boxes if b[0][0] + b[1][0] > offsets[0]]
        for other, other_sizes in open_boxes:
            if all(
                o < p + m and p < o + n
                for o, n, p, m in zip(offsets, sizes, other, other_sizes, strict=True)
            ):
                return list(other), list(offsets)
        open_boxes.append((offsets, sizes))
    return None


def _check_stored_range(folder: Path, info: Any) -> None:
    """A storage entry is a plain range of a file in ``folder``."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    path = folder / METADATA
    if not isinstance(info, _StorageInfo):
        raise UserError(f"{path}: an entry is not DCP's; the checkpoint was edited")
    name = info.relative_path
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise UserError(
            f"refusing to load {folder}: an entry points at {name!r}, outside the folder"
        )
    if info.transform_descriptors or not _whole_numbers((info.offset, info.length)):
        raise UserError(f"{path}: an entry of {name!r} is not one torchloom writes")
    file = folder / name
    if not file.is_file() or info.offset + info.length > file.stat().st_size:
        raise UserError(
            f"{folder}: {name} is missing or shorter than its index says (a copy cut short?); "
            "copy the checkpoint again, or resume from the one beside it"
        )


def _check_disjoint_ranges(path: Path, infos: Any) -> None:
    """No two storage entries share a byte: each record is counted, and read, once."""
    ranges = sorted((info.relative_path, info.offset, info.length) for info in infos)
    for (name, offset, length), (other, start, _) in itertools.pairwise(ranges):
        if name == other and start < offset + length:
            raise UserError(
                f"{path}: two entries share the bytes of {name} at {start} (records overlap); "
                "the checkpoint was edited or is not one torchloom wrote"
            )
