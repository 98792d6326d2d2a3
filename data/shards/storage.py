"""Where shards live: a local path or a URL (``s3://``, ``gs://``, ``hf://``, ``file://``),
listed, described and read through one small door, with retries.

Readers call :func:`files_of`, :func:`parquet_file` and :func:`read_row_group`, and never
import a client library themselves. Every page that carries a CRC checksum (shard.py writes one
on each) is checked against it when read: a byte changed on a disk or in a copy is one line
naming the file, never silently different values (a file written without checksums cannot be
checked). An S3-compatible store's endpoint comes from
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` and its credentials from the usual AWS
variables or config files, read by the client: none of them is ever put into a config, a
checkpoint, a log or a record. ``pyarrow`` is the ``shards`` extra.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from utils.errors import UserError
from utils.system.signals import Interrupted, stop_requested

log = logging.getLogger("torchloom")
EXTRA = 'pip install -e ".[shards]"'
ATTEMPTS = 5  # tries of one read before the run ends on it
FIRST_WAIT = 0.5  # seconds before the second try; doubled before each next one
SCHEMES = ("s3://", "gs://", "gcs://", "hf://", "file://")
CHECKSUM_VARIABLES = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION")


def arrow() -> tuple[Any, Any]:
    """(pyarrow.fs, pyarrow.parquet), or the one line naming the extra."""
    try:
        import pyarrow.fs as fs
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"data=parquet needs pyarrow: {EXTRA}") from None
    return fs, pq


@dataclass(frozen=True)
class Shard:
    """One Parquet file: where it is (as the user named its folder, and the path its
    filesystem knows), its size and version (an ETag or a modification time)."""

    name: str  # the URL or path shown in messages and records
    path: str  # the path within ``filesystem``
    size: int
    version: str
    where: str  # the URL or local root the filesystem was opened for


def endpoint() -> str | None:
    """The S3-compatible server's address the environment names (None: AWS itself): two
    servers may hold the same bucket and key."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def filesystem(url: str) -> tuple[Any, str]:
    """(the pyarrow filesystem for ``url``, the path within it). S3 honours
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (an S3-compatible server, such as MinIO)."""
    fs, _ = arrow()
    if url.startswith("s3://"):
        server = endpoint()
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        options: dict[str, Any] = {"region": region} if region else {}
        if server:
            scheme, _, host = server.rpartition("://")
            options.update(endpoint_override=host or server, scheme=scheme or "https")
            # S3-compatible servers (MinIO, rclone, Ceph) often refuse the streamed checksums
            # the AWS SDK sends by default since 2025; send them only where an API needs them.
            for variable in CHECKSUM_VARIABLES:
                os.environ.setdefault(variable, "when_required")
        return fs.S3FileSystem(**options), url.removeprefix("s3://")
    if url.startswith(("gs://", "gcs://", "hf://")):
        try:
            import fsspec
        except ImportError:
            raise UserError(f"{url.split(':')[0]}:// needs fsspec: {EXTRA}") from None
        remote, path = fsspec.core.url_to_fs(url)
        return fs.PyFileSystem(fs.FSSpecHandler(remote)), path
    path = url.removeprefix("file://")
    return fs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))


def files_of(given: str | Sequence[str], what: str) -> list[Shard]:
    """The ``.parquet`` files ``given`` names: a folder (every file below it, in name order),
    a glob (``shards/train-*.parquet``), a file, or a list of any of these; one line naming
    the path when nothing is there."""
    found: list[Shard] = []
    for url in [given] if isinstance(given, str) else list(given):
        found += _listed(str(url), what)
    if not found:
        raise UserError(f"{what}={given}: no .parquet files there; check the path")
    return found


def _listed(url: str, what: str) -> list[Shard]:
    fs, _ = arrow()
    system, path = filesystem(url)
    pattern = None
    if any(char in path for char in "*?["):
        path, pattern = path.rsplit("/", 1)[0], path
    info = retried(lambda: system.get_file_info(path), url)
    if info.type == fs.FileType.NotFound:
        raise UserError(f"{what}={url}: nothing is there; check the path (and the credentials)")
    if info.type == fs.FileType.File:
        entries = [info]
    else:
        selector = fs.FileSelector(path, recursive=True)
        entries = retried(lambda: system.get_file_info(selector), url)
    scheme = url.split("://")[0] + "://" if url.startswith(SCHEMES[:-1]) else ""
    files = [
        e
        for e in entries
        if e.type == fs.FileType.File
        and e.path.endswith(".parquet")
        and (pattern is None or fnmatch.fnmatch(e.path, pattern))
    ]
    kept = [e for e in files if not _hidden(e.path, path)]
    if len(kept) < len(files):
        log.info(
            "%s=%s: %d .parquet files skipped under names that begin with '_' or '.' (a "
            "writer's _temporary/ attempts, .ipynb_checkpoints/ copies: not data, as pyarrow's "
            "own discovery has it)",
            what,
            url,
            len(files) - len(kept),
        )
    shards = [Shard(f"{scheme}{e.path}", e.path, e.size or 0, _version(e), url) for e in kept]
    return sorted(shards, key=lambda shard: shard.name)


def _hidden(found: str, listed: str) -> bool:
    """Whether a file found under the folder ``listed`` lies under a name (a folder's or its
    own) that begins with ``_`` or ``.``."""
    inside = found[len(listed) :] if found.startswith(listed) else found.rsplit("/", 1)[-1]
    return any(part.startswith(("_", ".")) for part in inside.split("/") if part)


def _version(info: Any) -> str:
    mtime = getattr(info, "mtime_ns", None)
    return str(mtime) if mtime is not None else ""


_open: dict[tuple, Any] = {}  # this process's open files (a footer read once)
MAX_OPEN = 256


def parquet_file(shard: Shard) -> Any:
    """The ``pyarrow.parquet.ParquetFile`` of ``shard`` (its footer read once per process);
    a file that is no Parquet is one line naming it."""
    # Per process (a file opened before a fork shares its connection) and per reading thread
    # (data/shards/batches.py's each read through their own; a thread of the next epoch in
    # the same slot has the same name, and reuses it rather than reading the footer again).
    key = (os.getpid(), threading.current_thread().name, endpoint(), shard.where, shard.path)
    key += (shard.size, shard.version)  # a rewritten object is opened anew
    if key not in _open:
        _, pq = arrow()
        system, _ = filesystem(shard.where)
        if len(_open) >= MAX_OPEN:
            _open.pop(next(iter(_open)))
        _open[key] = retried(lambda: _checked_file(pq, system, shard.path), shard.name)
    return _open[key]


def _checked_file(pq: Any, system: Any, path: str) -> Any:
    """The Parquet file at ``path``, each page checked against its CRC checksum when read."""
    return pq.ParquetFile(system.open_input_file(path), page_checksum_verification=True)


def read_row_group(shard: Shard, group: int, columns: list[str]) -> Any:
    """Row group ``group`` of ``shard``, the ``columns`` only, as a ``pyarrow.Table``."""
    return retried(lambda: parquet_file(shard).read_row_group(group, columns=columns), shard.name)


def retried(read: Callable[[], Any], name: str) -> Any:
    """``read()``, tried :data:`ATTEMPTS` times with doubling waits when the store fails
    (a dropped connection, a throttled request); what can never succeed (a denied request,
    a file that is not Parquet) and a stop signal end it at once. A read that keeps failing is
    one line naming the object."""
    wait = FIRST_WAIT
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return read()
        except UserError:
            raise
        except Exception as error:  # pyarrow raises OSError and ArrowInvalid for all of it
            reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            reason = reason or type(error).__name__
            if _final(reason) or attempt == ATTEMPTS:
                raise UserError(f"cannot read {name}: {reason}{_fix(reason)}") from None
            log.warning(
                "warning: reading %s failed (%s); trying again in %.1f s", name, reason, wait
            )
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if stop_requested():
                    raise Interrupted from None
                time.sleep(0.05)
            wait *= 2
    raise AssertionError("unreachable")


# A file whose bytes are damaged: never read right by trying again.
DAMAGED = ("corrupt", "checksum", "thrift", "snappy", "decompress")
FINAL_WORDS = (
    *DAMAGED,
    "access denied",
    "forbidden",
    "not found",
    "no such",
    "parquet magic",
    "invalid",
    "does not exist",
    "is not a parquet",
)


def _final(reason: str) -> bool:
    return any(word in reason.lower() for word in FINAL_WORDS)


def _fix(reason: str) -> str:
    lowered = reason.lower()
    if "access denied" in lowered or "forbidden" in lowered:
        return (
            "; check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) and the bucket's policy"
        )
    if any(word in lowered for word in DAMAGED):
        return "; the file is damaged (changed on a disk or in a copy): copy or write it again"
    if "magic" in lowered or "invalid" in lowered:
        return "; it is not a whole Parquet file: write it again, or remove it"
    return "; check the path"
