"""What a checkpoint holds: its keys, written once here, and the check that a file meant to be
resumed has them, each of the kind and range torchloom writes.

A checkpoint is a plain dict of tensors, numbers, strings and plain containers, so it loads with
``torch.load(..., weights_only=True)``: loading it can never run code.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from utils.errors import UserError

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


# --- Migrating older formats --------------------------------------------------------------


def legacy_loss_sums(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The loss sums of a format-1 checkpoint, which kept them as running totals."""
    return {
        "epoch": checkpoint["epoch_loss"],
        "window": checkpoint["window_loss"],
        "window_batches": checkpoint["window_batches"],
        "pending": torch.zeros(0),
    }
