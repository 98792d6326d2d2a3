"""Writing, finding and reading checkpoints, safely.

A checkpoint is a plain dict of tensors, numbers, strings and plain containers, so it loads with
``torch.load(..., weights_only=True)``: loading it can never run code. It holds the unwrapped
model's ``state_dict``, the optimizer, schedule and scaler states, the counters and the exact
data position, the best metric so far, the resolved config and every RNG state.

Files are written atomically: to a temporary file in the same folder, flushed and fsynced, then
renamed over the old one, so a crash mid-write leaves the previous checkpoint intact. Temporary
files start with a dot; discovery ignores them and :func:`remove_stale_temporary_files` deletes
those a killed run left behind.
"""

from __future__ import annotations

import logging
import os
import pickle
import pickletools
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from utils.errors import UserError

FORMAT_VERSION = 2  # 2: loss sums under "losses", with the losses not yet summed
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


def _write_atomic(path: Path, write: Any) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as error:
        previous = "the previous checkpoint there is intact" if path.exists() else "nothing saved"
        raise UserError(
            f"could not write checkpoint {path}: {error.strerror or error}; {previous}"
        ) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def remove_stale_temporary_files(folder: Path) -> None:
    """Delete temporary files left by a save that was killed before its rename."""
    for leftover in folder.glob(".*.pt.*.tmp"):
        leftover.unlink(missing_ok=True)


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
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"not a readable checkpoint: {path} (no model weights in it)")
    return state


def find_checkpoints(folder: Path) -> list[Path]:
    """Candidates to resume from, newest first: ``last.pt``, then the others by age."""
    others = sorted(
        (p for p in folder.glob("*.pt") if not p.name.startswith(".") and p.name != "last.pt"),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    last = folder / "last.pt"
    return ([last] if last.is_file() else []) + others


def load_latest(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint in ``folder``, warning about each unreadable one."""
    for candidate in find_checkpoints(folder):
        try:
            return candidate, load_checkpoint(candidate)
        except UserError as error:
            log.warning("warning: %s; trying the previous checkpoint", error)
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
    incoming = strip_wrapper_prefixes(state_dict)
    expected = target.state_dict()
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
        Console(stderr=True).print(table)
        raise UserError(
            f"the checkpoint's weights do not fit the model: {len(missing)} missing, "
            f"{len(unexpected)} unexpected, {len(mismatched)} of another shape "
            f"({fitting} of {len(expected)} fit); was it trained with another model config?"
        )
    fits = {k: v for k, v in incoming.items() if k in expected and v.shape == expected[k].shape}
    target.load_state_dict(fits, strict=False)


# --- Resuming and retention ----------------------------------------------------------------


def resume_point(resume: str | None, checkpoint_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """What ``resume=`` names: a checkpoint file, a folder of them, or ``auto`` (the run's own
    folder if it holds a readable checkpoint, else a fresh start)."""
    if resume is None:
        return None
    if resume == "auto":
        found = load_latest(checkpoint_dir) if checkpoint_dir.is_dir() else None
        if found is None:
            log.info("resume=auto: no checkpoint in %s yet; starting fresh", checkpoint_dir)
        return found
    path = Path(resume)
    if path.is_dir():
        found = load_latest(path)
        if found is None:
            raise UserError(f"resume={resume}: no readable checkpoint in that folder")
        return found
    return path, load_checkpoint(path)


def top_k_name(epoch: int, monitor: str, value: float) -> str:
    return f"epoch={epoch:03d}-{monitor.replace('/', '_')}={value:.4f}.pt"


def rank_top_k(ranked: list, k: int, name: str, value: float, sign: int) -> tuple[bool, list[str]]:
    """Enter ``name`` (scored ``value``) into ``ranked``, the ``[[value, file name], ...]`` list
    kept in the training state, best first. Returns whether the file should be written and
    which files fell out; the caller writes the new file before deleting those, so a crash
    never leaves fewer than before."""
    if k == 0 or (len(ranked) >= k and sign * (value - ranked[-1][0]) <= 0):
        return False, []
    ranked.append([value, name])
    ranked.sort(key=lambda entry: -sign * entry[0])
    dropped = [dropped_name for _, dropped_name in ranked[k:]]
    del ranked[k:]
    return True, dropped


def check_resumable(
    path: Path, checkpoint: dict[str, Any], config: dict, allow: bool, overrides: list[str]
) -> None:
    """Refuse to continue a run whose model, data or batch size the new config changes, and,
    in a sweep, a checkpoint of another job."""
    from utils.config import config_changes
    from utils.sweep import check_same_job, in_sweep

    if in_sweep():
        check_same_job(path, checkpoint["overrides"], overrides)

    changes = config_changes(checkpoint["config"], config)
    if changes and not allow:
        raise UserError(
            f"refusing to resume {path}: the config changed ({'; '.join(changes)}); "
            "pass resume_allow_changes=true to resume anyway"
        )


def training_checkpoint(
    model: nn.Module, optimizer, schedule, scaler, state: dict[str, Any], losses, monitor: str,
    config: dict, overrides: list[str], world_size: int,
) -> dict[str, Any]:  # fmt: skip
    """Everything that rebuilds and resumes a run, as a plain dict: the unwrapped model's
    weights, optimizer, schedule, loss scaler, the training state and loss sums, the config,
    and the RNG."""
    from utils.seeding import rng_state

    return {
        "format_version": FORMAT_VERSION,
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": schedule.state_dict(),
        "scaler": scaler.state_dict(),
        **state,
        "losses": losses.state_dict(),
        "monitor": monitor,
        "config": config,
        "overrides": overrides,
        "rng": rng_state(),
        "world_size": world_size,
    }


def fresh_state() -> dict[str, Any]:
    """The training state of a run that has not started: counters, data position, best
    metric, top-k list."""
    return {
        "epoch": 0,
        "batch_in_epoch": 0,
        "global_step": 0,
        "best_metric": None,
        "best_epoch": None,
        "top_k": [],
        "metrics": {},
    }


def legacy_loss_sums(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The loss sums of a format-1 checkpoint, which kept them as running totals."""
    return {
        "epoch": checkpoint["epoch_loss"],
        "window": checkpoint["window_loss"],
        "window_batches": checkpoint["window_batches"],
        "pending": torch.zeros(0),
    }


def keep_copies(folder: Path, best: bool, top_k_file: str | bool, dropped: list[str]) -> None:
    """Copy the just-written ``last.pt`` to ``best.pt`` and to its top-k name, then delete the
    top-k files that fell out: new files are complete before old ones go."""
    if best:
        copy_atomic(folder / "last.pt", folder / "best.pt")
    if top_k_file:
        copy_atomic(folder / "last.pt", folder / top_k_file)
        for name in dropped:
            (folder / name).unlink(missing_ok=True)


def restore(
    checkpoint: dict[str, Any], model: nn.Module, optimizer, schedule, scaler,
    state: dict[str, Any], losses,
) -> None:  # fmt: skip
    """Put every piece of a training checkpoint back: weights, optimizer, schedule, loss
    scaler, the counters and data position in ``state``, the loss sums, and — last, because
    building the model drew from it — the RNG."""
    from utils.seeding import set_rng_state

    load_weights(model, checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    schedule.load_state_dict(checkpoint["scheduler"])
    scaler.load_state_dict(checkpoint["scaler"])
    state.update({key: checkpoint[key] for key in state})
    losses.load_state_dict(checkpoint.get("losses") or legacy_loss_sums(checkpoint))
    set_rng_state(checkpoint["rng"])
