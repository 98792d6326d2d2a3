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
# Every key a training checkpoint (last.pt, best.pt, the top-k copies) holds, written once:
# (its type, whether a resume needs it, what it is). "required": a resume refuses a file without
# it; "optional": written by later versions, so an older file resumes with the fresh value;
# None: not read by a resume. The README's list is checked against this (tests/).
KEYS: dict[str, tuple[Any, str | None, str]] = {
    "format_version": (int, None, "the layout's version"),
    "model": (dict, None, "the unwrapped module's state_dict"),
    "optimizer": (dict, "required", "the optimizer's state_dict"),
    "scheduler": (dict, "required", "the LR schedule's state"),
    "scaler": (dict, "required", "the loss scaler's state"),
    "epoch": (int, "required", "epochs finished"),
    "batch_in_epoch": (int, "required", "batches of the next epoch already trained"),
    "global_step": (int, "required", "optimizer steps taken"),
    "skipped_steps": (int, "optional", "steps skipped on a NaN/Inf loss"),
    "best_metric": (NUMBER, "required", "the best monitored value so far"),
    "best_epoch": ((int, type(None)), "required", "the epoch of best.pt"),
    "top_k": (list, "required", "the kept copies and their values"),
    "early_stopping": (dict, "optional", "validations without improvement"),
    "metrics": (dict, "required", "the latest metrics, by tag"),
    "elapsed_seconds": (NUMBER, "optional", "the run's wall time up to this save"),
    "stopped_by": ((dict, type(None)), "optional", "the callback that stopped the run, and why"),
    "callbacks": (dict, "optional", "each callback's state, under its name"),
    "provenance": ((dict, type(None)), None, "what produced the run: code, packages, data"),
    "losses": (dict, None, "the loss sums, and the losses not yet summed"),
    "ema": ((dict, type(None)), "optional", "trainer.ema's averaged weights"),
    "swa": ((dict, type(None)), "optional", "trainer.swa's averaged weights"),
    "distill": ((dict, type(None)), None, "the teacher's path and sha256, never its weights"),
    "monitor": (str, None, "the monitored metric's tag"),
    "config": (dict, "required", "the resolved config as plain containers"),
    "overrides": (list, None, "the command line's overrides"),
    "classes": ((list, type(None)), None, "the class names"),
    "inputs": ((dict, type(None)), None, "how inputs reach the model (checkpoint/record.py)"),
    "rng": (dict, "required", "Python, NumPy, torch CPU and CUDA RNG states of rank 0"),
    "rng_per_rank": (list, None, "every process's RNG states"),
    "world_size": (int, "optional", "the processes that wrote it"),
    "global_batch": (int, "optional", "samples of one global micro-batch: batch x processes"),
    "tracking": ((dict, type(None)), None, "the tracked runs it continues, the points held"),
    "numerics": (dict, "optional", "CPU threads, kernel width and MKL settings it trained on"),
}
TRAINING_KEYS = {key: kind for key, (kind, resume, _) in KEYS.items() if resume == "required"}
OPTIONAL_TRAINING_KEYS = {
    key: kind for key, (kind, resume, _) in KEYS.items() if resume == "optional"
}
# What averaged.pt holds (evaluate.py average=top_k): weights to evaluate, predict or start from.
AVERAGED_KEYS = ("format_version", "model", "config", "inputs", "classes", "averaged_from")


def training_checkpoint(**pieces: Any) -> dict[str, Any]:
    """A training checkpoint of exactly :data:`KEYS` (``format_version`` added here)."""
    return _exactly(KEYS, {"format_version": FORMAT_VERSION, **pieces})


def averaged_checkpoint(**pieces: Any) -> dict[str, Any]:
    """averaged.pt: exactly :data:`AVERAGED_KEYS` (``format_version`` added here)."""
    return _exactly(AVERAGED_KEYS, {"format_version": FORMAT_VERSION, **pieces})


def _exactly(keys: Any, checkpoint: dict[str, Any]) -> dict[str, Any]:
    if set(checkpoint) != set(keys):  # a writer out of step with the key set: our bug
        raise RuntimeError(
            f"checkpoint keys {sorted(set(checkpoint) ^ set(keys))} differ from format.py's"
        )
    return checkpoint


MAX_COUNT = 2**53  # epochs, steps and batch positions: a stored count beyond this was edited
COUNTERS = (
    "epoch",
    "batch_in_epoch",
    "global_step",
    "skipped_steps",
    "world_size",
    "global_batch",
)


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
    check_stopped_by(path, checkpoint.get("stopped_by"))
    elapsed = checkpoint.get("elapsed_seconds", 0.0)
    if not (elapsed is None or (math.isfinite(elapsed) and 0 <= elapsed <= MAX_COUNT)):
        raise UserError(
            f"cannot resume from {path}: its elapsed_seconds={elapsed} is out of "
            f"range (was it edited?); use init_from={path} for its weights"
        )


MAX_REASON = 1000  # characters of a callback's stop reason a checkpoint may hold


def check_stopped_by(path: Path, stopped_by: Any) -> None:
    """A stored ``stopped_by`` is None or what a callback's stop writes (hooks.py)."""
    kinds = {"callback": str, "reason": str, "epoch": int, "step": int}
    if stopped_by is None:
        return
    fits = set(stopped_by) == set(kinds) and all(
        isinstance(stopped_by[key], kind) and not isinstance(stopped_by[key], bool)
        for key, kind in kinds.items()
    )
    if not fits or len(stopped_by["callback"]) > 64 or len(stopped_by["reason"]) > MAX_REASON:
        raise UserError(
            f"cannot resume from {path}: its stopped_by is not what torchloom writes (was it "
            f"edited?); use init_from={path} for its weights"
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
