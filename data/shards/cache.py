"""Where fetched row groups are kept (``data.shard_cache_gb``, ``data.shard_cache_dir``): a
local folder of the columns read from each row group, as Arrow IPC files, so a second epoch
over object storage reads local disk instead of the network.

An entry is named by the sha256 of what it holds (the object's name, size and version, the row
group and the columns), so a changed object is never answered from its old bytes. An entry is
written under a temporary name and renamed once whole: a kill mid-write leaves a file that is
never read (and is removed by the next eviction). Reading one is reading data (Arrow IPC holds
no code). An entry is a derived file, checked as its source is: it ends with the CRC-32 of its
Arrow bytes, and one that does not match (a byte changed on the disk, a file planted or cut
short) or does not read back whole is removed, said once, and fetched again. When the folder
holds more than its bound, the least recently used entries go. Only names this module writes
(:data:`ENTRY`: 64 hex digits, ``.arrow``, and their ``.partial-<pid>_<thread>`` files) are
ever removed, and only inside the folder: a ``*.arrow`` file of the user's there is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.errors import UserError

log = logging.getLogger("torchloom")

SUFFIX = ".arrow"
PARTIAL = ".arrow.partial-"
# The names an entry and its partial file take: only these are ever removed from the folder.
ENTRY = re.compile(r"[0-9a-f]{64}\.arrow")
PARTIAL_ENTRY = re.compile(r"[0-9a-f]{64}\.arrow\.partial-(\d+)_\d+")
# After an entry's Arrow bytes: this tag and their CRC-32, little-endian.
TRAILER = b"torchloom-crc32"
TRAILER_BYTES = len(TRAILER) + 4
DEFAULT_GB = 20.0  # data.shard_cache_gb=auto for an object store: at most this ...
FREE_SHARE = 0.5  # ... and at most this share of the free disk where the cache is
MAX_GB = 10**6  # data.shard_cache_gb: a petabyte, more than any disk (inf and nan are no size)


@dataclass(frozen=True)
class ShardCache:
    """The cache folder and its bound in bytes; the reading threads share it."""

    folder: str
    limit: int

    def key(self, *described: Any) -> str:
        return hashlib.sha256(json.dumps(described, default=str).encode()).hexdigest()

    def get(self, key: str, rows: int, columns: list[str]) -> Any | None:
        """The table kept under ``key``, or None: absent, or not ``rows`` rows of ``columns``
        with the checksum written after them (a damaged entry, removed so it is fetched
        again)."""
        import pyarrow as pa

        path = Path(self.folder) / f"{key}{SUFFIX}"
        try:
            with pa.memory_map(str(path)) as source:
                table = _checked_table(source.read_buffer())
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException, ValueError) as error:
            _damaged(path, str(error) if isinstance(error, ValueError) else "does not read back")
            return None
        if table.num_rows != rows or table.column_names != columns:
            _damaged(path, "holds other rows or columns than its name says")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to go
        return table

    def put(self, key: str, table: Any) -> None:
        """Keep ``table`` under ``key`` (whole, or not at all), then evict down to the bound.
        A full disk or a folder that cannot be written only means no caching."""
        import pyarrow as pa

        folder = Path(self.folder)
        path = folder / f"{key}{SUFFIX}"
        partial = folder / f"{key}{PARTIAL}{os.getpid()}_{threading.get_ident()}"
        try:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            arrow = sink.getvalue()
            with open(partial, "wb") as file:
                file.write(arrow)
                file.write(TRAILER + struct.pack("<I", zlib.crc32(arrow)))
            os.replace(partial, path)
        except OSError:
            partial.unlink(missing_ok=True)
            return
        self.evict()

    def evict(self) -> None:
        """Remove the least recently used entries until the folder holds at most the bound,
        and partial files no process is writing any more."""
        entries = []
        for entry in os.scandir(self.folder):
            name, partial = entry.name, PARTIAL_ENTRY.fullmatch(entry.name)
            try:
                if partial is not None and not _alive(partial[1]):  # its writer is gone
                    os.unlink(entry.path)
                elif ENTRY.fullmatch(name):
                    stat = entry.stat()
                    entries.append((stat.st_mtime_ns, stat.st_size, entry.path))
            except OSError:
                continue  # another process removed it first
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.limit:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
            total -= size

    def held_bytes(self) -> int:
        return sum(
            entry.stat().st_size for entry in os.scandir(self.folder) if ENTRY.fullmatch(entry.name)
        )


def _checked_table(buffer: Any) -> Any:
    """The Arrow table in an entry's bytes, once their CRC-32 matches the one written after
    them; ValueError saying what is wrong otherwise."""
    import pyarrow as pa

    size = buffer.size - TRAILER_BYTES
    if size <= 0 or buffer.slice(size, len(TRAILER)).to_pybytes() != TRAILER:
        raise ValueError("has no checksum (cut short, or not written by torchloom)")
    arrow = buffer.slice(0, size)
    (written,) = struct.unpack("<I", buffer.slice(size + len(TRAILER)).to_pybytes())
    if zlib.crc32(memoryview(arrow)) != written:
        raise ValueError("does not match its checksum (changed on the disk)")
    return pa.ipc.open_file(arrow).read_all()


def _damaged(path: Path, why: str) -> None:
    """An entry that cannot be used: removed, and said, so it is fetched again."""
    log.warning("warning: the cached row group %s %s; fetching it again", path, why)
    path.unlink(missing_ok=True)


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def default_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchloom" / "shards"


def shard_cache(gb: Any, folder: Any, remote: bool) -> tuple[ShardCache | None, str]:
    """The cache ``data.shard_cache_gb`` and ``data.shard_cache_dir`` ask for, and the words
    that say it at start-up. ``auto``: for an object store, :data:`DEFAULT_GB` or half the free
    disk, whichever is less; for local files none (they are on disk already)."""
    number = isinstance(gb, int | float) and not isinstance(gb, bool)
    if gb != "auto" and not (number and math.isfinite(gb) and 0 <= gb <= MAX_GB):
        raise UserError(
            f"data.shard_cache_gb={gb!r} must be auto, 0 (no cache) or a size in GB from 0 to "
            f"{MAX_GB:,}"
        )
    if gb == 0 or (gb == "auto" and not remote):
        return None, "no local cache of row groups (data.shard_cache_gb)"
    where = Path(os.path.expanduser(str(folder))) if folder else default_folder()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        free = shutil.disk_usage(where).free
    except OSError as error:
        raise UserError(
            f"data.shard_cache_dir={str(where)!r} cannot be written ({error.strerror}); "
            "give another folder, or data.shard_cache_gb=0"
        ) from None
    limit = (
        int(float(gb) * 2**30) if gb != "auto" else int(min(DEFAULT_GB * 2**30, free * FREE_SHARE))
    )
    return ShardCache(str(where), limit), f"row groups kept in {where} up to {limit / 2**30:.1f} GB"
