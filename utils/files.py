"""Every file a run writes appears complete or not at all: one atomic writer.

A file is written to a temporary file in the same folder, flushed and fsynced, then renamed over
the old one, so a crash mid-write leaves the previous file intact. Temporary files start with a
dot and name their writer's host and process; discovery ignores them and
:func:`remove_stale_temporary_files` deletes those whose writer is gone. The final file gets the
mode a plain ``open()`` would give (0644 under umask 022), so teammates can read it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from utils.errors import UserError

STALE_AFTER_SECONDS = 3600  # a temporary file of another machine's writer, untouched this long


# --- Writing -------------------------------------------------------------------------------


def save_atomic(state: Mapping[str, Any], path: Path) -> None:
    """Write ``state`` to ``path`` so that ``path`` always holds a complete checkpoint. A failed
    write (disk full, permissions) leaves the previous file intact and says so in one line."""
    import torch  # here: a tracker's own process imports this module, and never torch

    _write_atomic(path, lambda f: torch.save(dict(state), f))


def copy_atomic(source: Path, path: Path) -> None:
    """``source``'s bytes to ``path``, atomically: best.pt and top-k files are copies of the
    last.pt just written, not a second serialisation of the same state."""
    with open(source, "rb") as f:
        _write_atomic(path, lambda out: shutil.copyfileobj(f, out))


def _temporary_prefix(path: Path) -> str:
    """``.<name>.<host>-<pid>.``: whoever cleans up can tell whether the writer still lives."""
    return f".{path.name}.{socket.gethostname()}-{os.getpid()}."


def _default_mode() -> int:
    """The mode ``open()`` gives a new file under this process's umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file that appears at ``path`` complete or not at all: written to a temporary file of
    this host and process beside it, fsynced, renamed, the rename made durable. On any failure
    the temporary file is removed and the error propagates; ``path`` is as it was."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent)
        os.fchmod(fd, _default_mode())  # mkstemp makes it 0600
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _write_atomic(path: Path, write: Any) -> None:
    try:
        with atomic_file(path) as f:
            write(f)
    except (OSError, RuntimeError) as error:  # torch.save reports a failed write as RuntimeError
        first_line = (str(error).strip() or type(error).__name__).splitlines()[0][:120]
        reason = getattr(error, "strerror", None) or (
            f"the write failed ({first_line}; file too large, or disk full?)"
        )
        previous = "the previous checkpoint there is intact" if path.exists() else "nothing saved"
        raise UserError(f"could not write checkpoint {path}: {reason}; {previous}") from None


def remove_stale_temporary_files(folder: Path, suffix: str = ".pt") -> None:
    """Delete temporary files (of files named ``*<suffix>``: checkpoints, image caches) left by
    a write that was killed before its rename: those of a dead process of this machine, and
    others untouched for an hour. A writer still at work, this machine's or another's (a
    shared folder), keeps its file."""
    host = socket.gethostname()
    for leftover in folder.glob(f".*{suffix}.*.tmp"):
        match = re.fullmatch(rf"\..+{re.escape(suffix)}\.(.+)-(\d+)\.[^.]+\.tmp", leftover.name)
        try:
            if match and match.group(1) == host:
                stale = not _process_alive(int(match.group(2)))
            else:  # another machine's writer, or the unnamed files of older versions
                stale = time.time() - leftover.stat().st_mtime > STALE_AFTER_SECONDS
            if stale:
                leftover.unlink(missing_ok=True)
        except OSError:
            continue


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process has no save in flight while it cleans up
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def prepare_dir(path: Path, what: str) -> Path:
    """Create ``path`` and prove it writable now, not after the first epoch's work is lost."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise UserError(
            f"cannot write {what} to {path}: {error.strerror}; choose another folder"
        ) from None
    return path


def write_json(data: Mapping, path: Path) -> None:
    """``data`` as indented JSON at ``path``, written atomically (:func:`atomic_file`): a reader
    sees the previous file or the new one, never half of either."""
    with atomic_file(path) as f:
        f.write((json.dumps(data, indent=2, allow_nan=True) + "\n").encode())


MAX_JSON_BYTES = 64 * 2**20  # a JSON record larger than this was not written by a run


def read_json_object(path: Path) -> dict:
    """The JSON object a run wrote at ``path`` (its metrics.json, provenance.json), read back
    as untrusted data: at most :data:`MAX_JSON_BYTES`, JSON, an object; else one line naming
    the file."""
    if path.stat().st_size > MAX_JSON_BYTES:
        raise UserError(f"{path} is larger than torchloom writes such a file; was it replaced?")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise UserError(f"{path} does not read as JSON ({error}); was it edited?") from None
    if not isinstance(record, dict):
        raise UserError(f"{path} holds {type(record).__name__}, not a JSON object; was it edited?")
    return record


def write_file(path: Path, data: bytes, fix: str) -> None:
    """``data`` at ``path``, complete or not at all (:func:`atomic_file`, its folder made if
    missing); a write the system refuses is one line naming the path, the reason and ``fix``."""
    try:
        with atomic_file(path) as f:
            f.write(data)
    except OSError as error:
        raise UserError(
            f"cannot write {path}: {error.strerror or error}; nothing was written there ({fix})"
        ) from None


# A sharded checkpoint's folder (utils/checkpoint/sharded.py): the state rank 0 writes last,
# and DCP's index of the shards.
SHARDED_STATE, SHARDED_INDEX = "state.pt", ".metadata"


def sharded_folder(path: Path) -> bool:
    """Whether ``path`` is a sharded checkpoint's folder (whole or not), not a run's folder."""
    return path.is_dir() and any((path / n).exists() for n in (SHARDED_STATE, SHARDED_INDEX))


def file_sha256(path: Path | str) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks (an OSError propagates); of a
    folder (a sharded checkpoint), of each of its files' names and sha256s, in name order."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.is_symlink())
        listed = "".join(f"{p.name}\0{file_sha256(p)}\n" for p in files)
        return hashlib.sha256(listed.encode()).hexdigest()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
