"""Are a file's bytes as they were written? ``torch.save`` writes a zip archive that holds the
CRC-32 of each record, and ``torch.load`` does not check them: a byte changed on a disk or in a
copy loads as other weights or values without a word. :func:`check_intact` checks them (at about
the speed the file is read) before every ``torch.load`` of a file: checkpoints, each tensor of a
sharded checkpoint, given weights, ``data=tensors`` files, a cv fold's predictions. A
``.safetensors`` file holds no checksum: an export records :func:`tensors_digest` of its weights.
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import torch

from utils.errors import UserError


def damaged_record(archive: Path | BinaryIO) -> str | None:
    """What is wrong with the zip archive ``archive`` (its file or bytes): a record whose bytes
    do not match their CRC-32, a compressed record (``torch.save`` never writes one; its check
    could inflate without bound), records that overlap or claim more bytes than the file holds
    (a crafted file that would be read many times over), or a directory that does not read; None when every record matches, or for a
    file that is no zip archive (torch's legacy format: not checked here)."""
    try:
        if not zipfile.is_zipfile(archive):
            return None
        size = archive.stat().st_size if isinstance(archive, Path) else archive.seek(0, 2)
        with zipfile.ZipFile(archive) as opened:
            records = opened.infolist()
            compressed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED]
            if compressed:
                return f"{compressed[0]} in it is compressed, which torch.save never does"
            if sum(r.compress_size for r in records) > size:
                return "its records overlap or pass the file's end, which torch.save never writes"
            damaged = opened.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError):
        return "its directory does not read as a zip archive's"
    finally:
        if not isinstance(archive, Path):
            archive.seek(0)
    return f"{damaged} in it does not match the checksum written with it" if damaged else None


def check_intact(path: Path, fix: str) -> None:
    """One line naming ``path`` and what is damaged in it, and ``fix``, when its bytes are not
    those written."""
    damaged = damaged_record(path)
    if damaged:
        raise UserError(
            f"{path} is damaged: {damaged} (changed on a disk or in a copy?), and nothing from "
            f"it was loaded; {fix}"
        )


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """The sha256 of named tensors (their names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
