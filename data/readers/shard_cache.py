"""Where fetched row groups are kept (``data.shard_cache_gb``, ``data.shard_cache_dir``): a
local folder of the columns read from each row group, as Arrow IPC files, so a second epoch
over object storage reads local disk instead of the network.

An entry is named by the sha256 of what it holds (the object's name, size and version, the row
group and the columns), so a changed object is never answered from its old bytes. An entry is
written under a temporary name and renamed once whole: a kill mid-write leaves a file that is
never read (and is removed by the next eviction). Reading one is reading data (Arrow IPC holds
no code); an entry that does not read back whole is removed and fetched again. When the folder
holds more than its bound, the least recently used entries go. Only this module's own files
(``*.arrow``, ``*.arrow.partial-*``) are ever removed, and only inside the folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.errors import UserError

SUFFIX = ".arrow"
PARTIAL = ".arrow.partial-"
DEFAULT_GB = 20.0  # data.shard_cache_gb=auto for an object store: at most this ...
FREE_SHARE = 0.5  # ... and at most this share of the free disk where the cache is


@dataclass(frozen=True)
class ShardCache:
    """The cache folder and its bound in bytes; the reading threads share it."""

    folder: str
    limit: int

    def key(self, *described: Any) -> str:
        return hashlib.sha256(json.dumps(described, default=str).encode()).hexdigest()

    def get(self, key: str, rows: int, columns: list[str]) -> Any | None:
        """The table kept under ``key``, or None: absent, or not ``rows`` rows of ``columns``
        (a damaged entry, removed so it is fetched again)."""
        import pyarrow as pa

        path = Path(self.folder) / f"{key}{SUFFIX}"
        try:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException):
            path.unlink(missing_ok=True)
            return None
        if table.num_rows != rows or table.column_names != columns:
            path.unlink(missing_ok=True)
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
            with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
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
            name = entry.name
            try:
                writer = name.rsplit("-", 1)[-1].split("_")[0]  # the process writing it
                if PARTIAL in name and not _alive(writer):
                    os.unlink(entry.path)
                elif name.endswith(SUFFIX):
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
            entry.stat().st_size for entry in os.scandir(self.folder) if entry.name.endswith(SUFFIX)
        )


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
    if gb != "auto" and (isinstance(gb, bool) or not isinstance(gb, int | float) or gb < 0):
        raise UserError(f"data.shard_cache_gb={gb!r} must be auto, 0 (no cache) or a size in GB")
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
