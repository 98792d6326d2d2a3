"""Writing, finding and reading checkpoints, safely.

A checkpoint is a plain dict of tensors, numbers, strings and plain containers, so it loads with
``torch.load(..., weights_only=True)``: loading it can never run code. It holds the unwrapped
model's ``state_dict``, the optimizer, schedule and scaler states, the counters and the exact
data position, the best metric so far, the resolved config and every RNG state.

Files are written atomically: to a temporary file in the same folder, flushed and fsynced, then
renamed over the old one, so a crash mid-write leaves the previous checkpoint intact. Temporary
files start with a dot and name their writer's host and process; discovery ignores them and
:func:`remove_stale_temporary_files` deletes those whose writer is gone. The final file gets
the mode a plain ``open()`` would give (0644 under umask 022), so teammates can read it.

Which run a command continues or replaces is decided in :mod:`utils.run`; which top-k copies
are kept, in :mod:`utils.checkpointer`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import pickletools
import re
import shutil
import socket
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch
from rich.table import Table
from torch import nn

from utils.errors import UserError
from utils.text import console

FORMAT_VERSION = 2  # 2: loss sums under "losses", with the losses not yet summed
# What resuming needs besides the weights (format 1 kept its loss sums under other names).
NUMBER = (int, float, type(None))
TRAINING_KEYS = {
    "optimizer": dict,
    "scheduler": dict,
    "scaler": dict,
    "epoch": int,
    "batch_in_epoch": int,
    "global_step": int,
    "best_metric": NUMBER,
    "best_epoch": (int, type(None)),
    "top_k": list,
    "metrics": dict,
    "config": dict,
    "rng": dict,
}
# Written by later versions; an older checkpoint without them resumes with their fresh value.
OPTIONAL_TRAINING_KEYS = {
    "skipped_steps": int,
    "early_stopping": dict,
    "ema": (dict, type(None)),
    "swa": (dict, type(None)),
    "world_size": int,
    "elapsed_seconds": NUMBER,
}
MAX_COUNT = 2**53  # epochs, steps and batch positions: a stored count beyond this was edited
COUNTERS = ("epoch", "batch_in_epoch", "global_step", "skipped_steps", "world_size")
STALE_AFTER_SECONDS = 3600  # a temporary file of another machine's writer, untouched this long
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DataParallel, torch.compile
log = logging.getLogger("torchloom")


def unwrap(model: nn.Module) -> nn.Module:
    """The module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        else:
            return model


# --- Writing -------------------------------------------------------------------------------


def save_atomic(state: Mapping[str, Any], path: Path) -> None:
    """Write ``state`` to ``path`` so that ``path`` always holds a complete checkpoint. A failed
    write (disk full, permissions) leaves the previous file intact and says so in one line."""
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


def replace_inputs_record(path: Path, inputs: dict, seen: os.stat_result) -> None:
    """``path`` with its inputs record replaced by ``inputs`` and everything else as it was,
    written atomically (evaluate.py's calibration). Refused, with nothing written, when the
    file changed since it was read (``seen``: its stat then), so a checkpoint a run wrote in the
    meantime is never replaced by the older one."""

    def identity(stat: os.stat_result) -> tuple:
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    if identity(path.stat()) != identity(seen):
        raise UserError(
            f"{path} changed while it was evaluated (is a run still writing it?); "
            "nothing was stored: run it again once the run is done"
        )
    checkpoint = load_checkpoint(path)
    checkpoint["inputs"] = inputs
    save_atomic(checkpoint, path)


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


# --- Reading -------------------------------------------------------------------------------


def _offending_global(path: Path, error: Exception) -> str | None:
    """The importable name a refused pickle asks for, read without running anything."""
    match = re.search(r"GLOBAL (\S+)", str(error))
    if match:
        return match.group(1)
    if zipfile.is_zipfile(path):
        return None
    strings: list[str] = []
    try:
        with open(path, "rb") as f:
            for opcode, argument, _ in pickletools.genops(f):
                if isinstance(argument, str) and "UNICODE" in opcode.name:
                    strings.append(argument)
                elif opcode.name == "GLOBAL":
                    return str(argument).replace(" ", ".")
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    return f"{strings[-2]}.{strings[-1]}"
    except Exception:
        return None
    return None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load on the CPU with ``weights_only=True``, never anything looser: a file that would
    import code is refused naming what it asks for, and nothing runs."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint file at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        name = _offending_global(path, error)
        if name:
            raise UserError(
                f"refusing to load {path}: it would import {name}, which no checkpoint needs; "
                f"it may be hostile, so nothing from it was run"
            ) from None
        raise UserError(f"not a readable checkpoint: {path}") from None
    except Exception:
        raise UserError(f"not a readable checkpoint: {path}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise UserError(f"not a readable checkpoint: {path} (no model weights in it)")
    averages = [
        (f"{key}.model", entry.get("model"))
        for key in ("ema", "swa")
        if isinstance(entry := state.get(key), dict)
    ]  # their own checks say more
    for where, weights in (("model", state["model"]), *averages):
        if isinstance(weights, dict) and not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
        ):
            raise UserError(
                f"not a readable checkpoint: {path} (its {where} holds something "
                "other than named tensors; was it edited?)"
            )
    version = state.get("format_version", 1)
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise UserError(
            f"{path} has checkpoint format {version!r}; this torchloom reads formats 1 to "
            f"{FORMAT_VERSION}: update torchloom to read it"
        )
    return state


def check_training_checkpoint(path: Path, checkpoint: dict[str, Any]) -> None:
    """``checkpoint`` holds everything a resume restores, not only weights."""
    missing = [key for key in TRAINING_KEYS if key not in checkpoint]
    if missing:
        raise UserError(
            f"cannot resume from {path}: it holds no {', '.join(missing)} (weights only?); "
            f"use init_from={path} to start from its weights"
        )
    optional = {key: kind for key, kind in OPTIONAL_TRAINING_KEYS.items() if key in checkpoint}
    for key, kind in {**TRAINING_KEYS, **optional}.items():
        value = checkpoint[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise UserError(
                f"cannot resume from {path}: its {key!r} is a {type(value).__name__}, not what "
                f"torchloom writes (was it edited?); use init_from={path} for its weights"
            )
    for key in (k for k in COUNTERS if k in checkpoint):
        least = 1 if key == "world_size" else 0  # the processes that wrote it
        if not least <= checkpoint[key] <= MAX_COUNT:
            raise UserError(
                f"cannot resume from {path}: its {key}={checkpoint[key]} is out of "
                f"range (was it edited?); use init_from={path} for its weights"
            )
    numbers = all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in checkpoint["metrics"].items()
    )
    if not numbers:
        raise UserError(
            f"cannot resume from {path}: its metrics are not named numbers (was it "
            f"edited?); use init_from={path} for its weights"
        )
    elapsed = checkpoint.get("elapsed_seconds", 0.0)
    if not (elapsed is None or (math.isfinite(elapsed) and 0 <= elapsed <= MAX_COUNT)):
        raise UserError(
            f"cannot resume from {path}: its elapsed_seconds={elapsed} is out of "
            f"range (was it edited?); use init_from={path} for its weights"
        )


@contextlib.contextmanager
def restoring(piece: str, path: Path) -> Iterator[None]:
    """Put ``piece`` of the checkpoint at ``path`` back into its owner: a state of other keys
    or types (a hand-edited file) is one line naming the piece, not a traceback."""
    try:
        yield
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as error:
        raise UserError(
            f"cannot resume from {path}: the {piece} in it are not what torchloom writes "
            f"({type(error).__name__}"
            f"; was it edited?); use init_from={path} to start from its weights"
        ) from None


TO_RESUME = ("last.pt",)  # the exact position of the run
TO_EVALUATE = ("best.pt", "last.pt")  # the run's best weights


def find_checkpoints(folder: Path, prefer: tuple[str, ...] = TO_RESUME) -> list[Path]:
    """The one rule for "which file in a run's folder": the ``prefer`` names that exist, in
    that order, then the folder's other checkpoints (top-k copies), newest first. Resume
    prefers ``last.pt``; evaluation ``best.pt``, then ``last.pt``."""
    preferred = [folder / name for name in prefer if (folder / name).is_file()]
    others = sorted(
        (p for p in folder.glob("*.pt") if not p.name.startswith(".") and p.name not in prefer),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    return preferred + others


def checkpoint_to_evaluate(folder: Path) -> Path | None:
    """A run's checkpoint to evaluate or predict with: best.pt, else last.pt, else the newest
    top-k copy (None when the folder holds none)."""
    return next(iter(find_checkpoints(folder, prefer=TO_EVALUATE)), None)


def load_latest(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint in ``folder``, warning about each unreadable one; None
    when there is no checkpoint at all. When there are some but none is readable, that is an
    error naming them: starting fresh would overwrite them."""
    candidates = find_checkpoints(folder)
    for candidate in candidates:
        try:
            return candidate, load_checkpoint(candidate)
        except UserError as error:
            log.warning("warning: %s; trying the previous checkpoint", error)
    if candidates:
        names = ", ".join(str(p) for p in candidates)
        raise UserError(
            f"no readable checkpoint in {folder} ({names} are not readable); move them away "
            "to start this run afresh, or resume from a good copy with resume=<file>"
        )
    return None


# --- Weights -------------------------------------------------------------------------------


def strip_wrapper_prefixes(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove ``module.`` and ``_orig_mod.`` prefixes, in any order and number."""
    cleaned = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned


def load_weights(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
) -> None:
    """Load weights into the unwrapped ``model``. A mismatch prints a table of missing,
    unexpected and shape-mismatched keys; ``strict=False`` loads what fits, but loading
    nothing at all is always an error."""
    target = unwrap(model)
    target.load_state_dict(weights_that_fit(target.state_dict(), state_dict, strict), strict=False)


def weights_that_fit(
    expected: Mapping[str, torch.Tensor], state_dict: Mapping[str, torch.Tensor], strict: bool
) -> dict[str, torch.Tensor]:
    """The tensors of ``state_dict`` that fit a model whose own state is ``expected`` (its
    tensors may be on the meta device: only their shapes are read), or the mismatch table
    and a :class:`UserError` (see :func:`load_weights`)."""
    incoming = strip_wrapper_prefixes(state_dict)
    missing = [k for k in expected if k not in incoming]
    unexpected = [k for k in incoming if k not in expected]
    mismatched = [
        (k, tuple(incoming[k].shape), tuple(v.shape))
        for k, v in expected.items()
        if k in incoming and incoming[k].shape != v.shape
    ]
    fitting = len(expected) - len(missing) - len(mismatched)
    if (strict and (missing or unexpected or mismatched)) or fitting == 0:
        table = Table(title="checkpoint weights vs model")
        for column in ("key", "problem", "checkpoint", "model"):
            table.add_column(column)
        for key in missing:
            table.add_row(key, "missing from checkpoint", "", "")
        for key in unexpected:
            table.add_row(key, "not in model", "", "")
        for key, have, want in mismatched:
            table.add_row(key, "shape", str(list(have)), str(list(want)))
        console(stderr=True).print(table)
        raise UserError(
            f"the checkpoint's weights do not fit the model: {len(missing)} missing, "
            f"{len(unexpected)} unexpected, {len(mismatched)} of another shape "
            f"({fitting} of {len(expected)} fit); was it trained with another model config?"
        )
    return {k: v for k, v in incoming.items() if k in expected and v.shape == expected[k].shape}


# --- Migrating older formats --------------------------------------------------------------


def legacy_loss_sums(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The loss sums of a format-1 checkpoint, which kept them as running totals."""
    return {
        "epoch": checkpoint["epoch_loss"],
        "window": checkpoint["window_loss"],
        "window_batches": checkpoint["window_batches"],
        "pending": torch.zeros(0),
    }
