"""Who runs in a run's folder: one process at a time.

Two ``train.py run_name=x`` started at the same moment would both find the folder empty, and
one's checkpoints would replace the other's, their TensorBoard events mixed. So a run (or a
sweep, for its whole folder) first claims its folder: an exclusive ``flock`` on
``<run dir>/.torchloom-claim``, which names the holder's host and process. The lock is the
kernel's, so it ends with the process however the process ends: a crash or a SIGKILL leaves
the file with its holder's name but no lock, and the next run takes it over, saying so in one
line. A finished run empties the file and lets go. The file itself is never deleted: a
process that opened it just before a deletion would lock a file no one else sees.

    claim = RunClaim.take(run_dir)   # UserError naming the holder when another run has it
    ...
    claim.release()
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from utils.errors import UserError

log = logging.getLogger("torchloom")
CLAIM_FILE = ".torchloom-claim"
_held: dict[Path, RunClaim] = {}  # this process's claims, released at the command line's edge


class ClaimHeld(UserError):
    """Another live run holds the folder: this run (or the whole sweep) stops, nothing written."""


class RunClaim:
    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def take(cls, folder: Path, what: str = "run") -> RunClaim:
        """Claim ``folder`` (created if missing) for this process, or raise :class:`ClaimHeld`
        naming the live holder. A claim this process already holds is returned as it is."""
        path = folder / CLAIM_FILE
        if path in _held:
            return _held[path]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise UserError(
                f"cannot claim {folder} for this {what}: {error.strerror}; choose "
                "another paths.runs or run_name"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise ClaimHeld(
                f"{folder} is in use by {holder}; wait for it to end, or choose "
                "another run_name=..."
            ) from None
        previous = _holder(fd)
        if previous != "unknown":  # it ended without letting go: killed, or its machine died
            log.info(
                "%s: taking over the claim of %s, which ended without releasing it",
                folder,
                previous,
            )
        mine = {
            "what": what,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        claim = cls(path, fd)
        _held[path] = claim
        return claim

    def release(self) -> None:
        """Empty the file (a clean end) and let go of the lock."""
        if _held.pop(self.path, None) is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        finally:
            os.close(self.fd)  # closing the descriptor ends the lock


def _holder(fd: int) -> str:
    """Who the claim file names, in words; ``unknown`` when it names no one (released)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"null")
        return (
            f"a {holder['what']} (process {int(holder['pid'])} on {holder['host']}, since "
            f"{holder['since']})"
        )
    except (OSError, ValueError, TypeError, KeyError):
        return "unknown"


def release_claims() -> None:
    """Let go of every claim this process holds (the command line's edge calls it as it
    returns, however it returns)."""
    for claim in list(_held.values()):
        claim.release()
