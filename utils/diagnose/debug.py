"""The debug modes of ``conf/debug/``: small, honest checks of a run's wiring.

python train.py debug=fast_dev_run   # one batch of train, val and test; nothing saved
python train.py debug=overfit        # a few fixed batches must be learned to ~0 loss
python train.py debug=limit          # a fraction of the batches of each epoch
python train.py debug=anomaly        # autograd anomaly detection names the op making NaN
python train.py debug=profile        # torch.profiler: a TensorBoard trace and a top-ops table
python train.py debug=shapes         # per-layer output shapes and parameters, then exit
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rich.table import Table
from torch import nn

from data.batching.dataset import RunBatches
from utils.errors import UserError

log = logging.getLogger("torchloom")


def batch_limit(limit: Any, available: int, key: str) -> int:
    """``limit`` as a batch count: null = all, an int = that many, a float in (0, 1] = that
    fraction (at least one batch)."""
    if limit is None:
        return available
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0:
        raise UserError(f"{key}={limit!r} must be a count (5), a fraction (0.1) or null")
    if isinstance(limit, float):
        if limit > 1:
            raise UserError(f"{key}={limit} as a fraction must be at most 1.0; use an int count")
        return max(1, int(available * limit))
    return min(int(limit), available)


def wrap_batches(batches: RunBatches, trainer: Any) -> RunBatches:
    """A run's batches as the debug modes ask: ``debug=overfit`` trains on the same few
    batches every epoch; ``debug=limit`` and ``fast_dev_run`` cut each epoch short."""
    train = batches.train
    if trainer.overfit_batches:
        train = Fixed(train, trainer.overfit_batches)
    key = "limit_eval_batches"
    return RunBatches(
        train=limited(train, trainer.limit_train_batches, "limit_train_batches"),
        val=limited(batches.val, trainer.limit_eval_batches, key),
        test=lambda: limited(batches.test(), trainer.limit_eval_batches, key),
        train_in_order=lambda: limited(batches.train_in_order(), trainer.limit_eval_batches, key),
    )


def limited(batches: Any, limit: Any, key: str) -> Any:
    """``batches`` cut to ``trainer.<key>`` batches per epoch (unchanged when it is null)."""
    if limit is None:
        return batches
    return Limited(batches, batch_limit(limit, len(batches), f"trainer.{key}"))


class Limited:
    """The first ``count`` batches of each epoch of ``batches``."""

    def __init__(self, batches: Any, count: int) -> None:
        self.batches, self.count = batches, count

    def __len__(self) -> int:
        return self.count

    def epoch(self, epoch: int, start: int = 0) -> Iterator:
        return itertools.islice(self.batches.epoch(epoch, start), max(0, self.count - start))


class Fixed:
    """The same first ``count`` batches of epoch 0 in every epoch: for the overfit check."""

    def __init__(self, batches: Any, count: int) -> None:
        self.cached = list(itertools.islice(batches.epoch(0), count))

    def __len__(self) -> int:
        return len(self.cached)

    def epoch(self, epoch: int, start: int = 0) -> Iterator:
        return iter(self.cached[start:])


def after_fit(trainer: Any, state: Any, batches: Any) -> None:
    """``debug=overfit``: fails unless the training loss fell below ``trainer.overfit_loss``."""
    if trainer.overfit_batches:
        loss = state.metrics.get("train/loss", math.inf)  # inf: no epoch was trained
        check_overfit(loss, trainer.overfit_loss, len(batches), state.epoch)


def check_overfit(train_loss: float, target: float, batches: int, epochs: int) -> None:
    if not train_loss < target:
        raise UserError(
            f"overfit check failed: the training loss is {train_loss:.4f} after {epochs} epochs "
            f"on the same {batches} batches, not below trainer.overfit_loss={target}; the model "
            "cannot fit a few fixed batches, so something is broken: labels not aligned with "
            "inputs, an output that ignores the input, frozen or unregistered layers, or an LR "
            "far too high or low"
        )


def anomaly_error(error: RuntimeError) -> UserError | None:
    """Anomaly mode's report of a backward op that produced NaN/Inf, as one line."""
    message = str(error)
    if "returned nan values" not in message and "returned inf values" not in message:
        return None
    return UserError(
        f"autograd anomaly: {message.strip().splitlines()[0]} (its forward call is in the "
        "warning above); look for log/sqrt/division of values that reach 0, or a too-high LR"
    )


class Profiled:
    """Batches that step ``profiler`` before each one, so the loop needs no profiling code."""

    def __init__(self, batches: Any, profiler: torch.profiler.profile) -> None:
        self.batches, self.profiler = batches, profiler

    def __len__(self) -> int:
        return len(self.batches)

    def epoch(self, epoch: int, start: int = 0) -> Iterator:
        for batch in self.batches.epoch(epoch, start):
            self.profiler.step()
            yield batch


class Debugging:
    """``debug=anomaly`` and ``debug=profile`` around training: anomaly detection on, and a
    profiler stepped by the training batches, its table shown when training ends."""

    def __init__(self, trainer: Any, run_dir: Path) -> None:
        set_anomaly_detection(trainer.detect_anomaly)
        self.profiler = start_profiler(trainer.profile_steps, run_dir)

    def batches(self, batches: Any) -> Any:
        return Profiled(batches, self.profiler) if self.profiler else batches

    def report(self, out: Any) -> None:
        if self.profiler:
            out.print(profile_table(self.profiler))


def show_shapes(modules: Any, out: Any) -> float:
    """``debug=shapes``: each layer's output shape and parameters; nothing is trained."""
    out.print(shape_table(modules.model, modules.example))
    return NO_RESULT


def set_anomaly_detection(on: bool) -> None:
    torch.autograd.set_detect_anomaly(on)
    if on:
        log.warning("warning: autograd anomaly detection is on: training runs several times slower")


def start_profiler(steps: int, run_dir: Path) -> torch.profiler.profile | None:
    """A started profiler: skip 1 batch, warm up 1, record ``steps``; the trace goes to
    ``<run_dir>/profile`` for TensorBoard's profiler plugin. None when ``steps`` is 0."""
    if not steps:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(run_dir / "profile")),
    )
    profiler.start()
    return profiler


def profile_table(profiler: torch.profiler.profile, rows: int = 15) -> Table:
    """The operators that took the most time in the recorded steps (self time)."""
    profiler.stop()
    events = profiler.key_averages()
    on_gpu = any(getattr(e, "self_device_time_total", 0) for e in events)
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    table = Table(title=f"top operators by self {'GPU' if on_gpu else 'CPU'} time")
    for column in ("operator", "calls", "self ms", "total ms"):
        table.add_column(column, justify="left" if column == "operator" else "right")
    for event in sorted(events, key=lambda e: getattr(e, key), reverse=True)[:rows]:
        total = event.device_time_total if on_gpu else event.cpu_time_total
        table.add_row(
            event.key, str(event.count), f"{getattr(event, key) / 1000:.2f}", f"{total / 1000:.2f}"
        )
    return table


def shape_table(model: nn.Module, example: torch.Tensor) -> Table:
    """Each layer's output shape and parameter count, from one forward of ``example`` (a
    batch of what the data gives the model: data/batching/inputs.py), through hooks."""
    rows: list[tuple[str, str, str, int]] = []

    def record(name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            shape = (
                list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            )
            own = sum(p.numel() for p in module.parameters(recurse=False))
            rows.append((name, module.__class__.__name__, str(shape), own))

        return hook

    hooks = [
        module.register_forward_hook(record(name))
        for name, module in model.named_modules()
        if name and not any(module.children())
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            model(example)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    shape = example.shape[1:]
    table = Table(title=f"layers for input [N, {', '.join(map(str, shape))}]")
    for column in ("layer", "type", "output shape", "parameters"):
        table.add_column(column, justify="right" if column == "parameters" else "left")
    for name, kind, shape, own in rows:
        table.add_row(name, kind, shape.replace("[2,", "[N,", 1), f"{own:,}")
    total = sum(p.numel() for p in model.parameters())
    table.add_row("total", "", "", f"{total:,}", style="bold")
    return table


NO_RESULT = math.nan  # what train.py returns from a mode that does not train
