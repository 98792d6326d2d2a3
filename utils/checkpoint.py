"""Writing and reading checkpoints.

A checkpoint is a plain dict of tensors, numbers, strings and plain containers, so it loads with
``torch.load(..., weights_only=True)``: loading it can never run code. It holds the unwrapped
model's ``state_dict``, the optimizer, schedule and scaler states, the counters and data
position, the best metric so far, the resolved config and every RNG state.

Files are written atomically: to a temporary file in the same folder, flushed and fsynced, then
renamed over the old one, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils.errors import UserError

FORMAT_VERSION = 1


def unwrap(model: nn.Module) -> nn.Module:
    """The module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        else:
            return model


def save_atomic(state: dict[str, Any], path: Path) -> None:
    """Write ``state`` to ``path`` so that ``path`` always holds a complete checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # Make the rename itself durable.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load on the CPU with ``weights_only=True``; anything else is refused in one line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint file at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        raise UserError(f"not a readable checkpoint: {path}") from None
    if not isinstance(state, dict) or "model" not in state or "format_version" not in state:
        raise UserError(f"not a readable checkpoint: {path} (not a torchloom checkpoint)")
    return state


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
