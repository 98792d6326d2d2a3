"""``tune=lr`` and ``tune=batch_size``: measure before training instead of guessing.

    python train.py tune=lr                  # LR range test: suggested LR, curve as PNG + TensorBoard
    python train.py tune=batch_size          # the largest batch that fits this model, precision, device

Both leave the model and optimizer as they found them.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from utils import plots
from utils.files import write_file
from utils.system.memory import free_memory

log = logging.getLogger("torchloom")


@dataclass(frozen=True)
class RangeTest:
    """The LR range test's sweep: ``steps`` steps from ``start_lr`` to ``end_lr``, the loss
    smoothed by an exponential average with factor ``smoothing``."""

    steps: int = 200
    start_lr: float = 1e-7
    end_lr: float = 10.0
    smoothing: float = 0.98


def lr_range_test(
    model: nn.Module, optimizer, batches, precision, loss_of, sweep: RangeTest = RangeTest()
) -> tuple[list[float], list[float], float]:
    """Train ``sweep.steps`` steps with the LR rising exponentially from ``sweep.start_lr`` to
    ``sweep.end_lr`` (stopping early once the loss explodes). Returns the LRs, the smoothed
    losses and the suggested LR: where the smoothed loss falls fastest. Model and optimizer
    are restored."""
    steps, start_lr, end_lr = sweep.steps, sweep.start_lr, sweep.end_lr
    smoothing = sweep.smoothing
    saved_model = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    lrs, losses, average, best = [], [], 0.0, math.inf
    model.train()
    stream = itertools.chain.from_iterable(batches.epoch(e) for e in itertools.count())
    for step, (images, labels) in zip(range(steps), stream, strict=False):
        lr = start_lr * (end_lr / start_lr) ** (step / (steps - 1))
        for group in optimizer.param_groups:
            group["lr"] = lr
        with precision.autocast():
            loss = loss_of(model(images), labels)  # the task's loss, as training computes it
        optimizer.zero_grad(set_to_none=True)
        precision.scaler.scale(loss).backward()
        precision.scaler.step(optimizer)
        precision.scaler.update()
        value = loss.item()  # the finder needs every loss; it is not the training loop
        if not math.isfinite(value):
            break
        average = smoothing * average + (1 - smoothing) * value
        smoothed = average / (1 - smoothing ** (step + 1))
        lrs.append(lr)
        losses.append(smoothed)
        best = min(best, smoothed)
        if step > 10 and smoothed > 4 * best:
            break
    model.load_state_dict(saved_model)
    optimizer.load_state_dict(saved_optimizer)
    return lrs, losses, suggest_lr(lrs, losses)


def suggest_lr(lrs: list[float], losses: list[float], skip: int = 10) -> float:
    """The LR where the smoothed loss falls fastest per decade of LR (before its minimum)."""
    end = losses.index(min(losses)) + 1 if losses else 0
    if end - skip < 2:
        return lrs[end - 1] if end else math.nan
    slopes = [
        (losses[i + 1] - losses[i]) / (math.log10(lrs[i + 1]) - math.log10(lrs[i]))
        for i in range(skip, end - 1)
    ]
    return lrs[skip + slopes.index(min(slopes))]


def find_batch_size(fits: Callable[[int], bool], start: int, limit: int) -> int:
    """The largest batch size ≤ ``limit`` for which ``fits`` is true: doubling from ``start``,
    then bisecting between the last size that fit and the first that did not."""
    if not fits(start):
        return 0
    good, bad = start, None
    while bad is None and good < limit:
        trial = min(good * 2, limit)
        if fits(trial):
            good = trial
        else:
            bad = trial
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def batch_fits(parts: Any, data: Any):
    """A ``fits(batch_size)`` trial: one forward, backward and optimizer step of ``parts`` (the
    step model, optimizer, precision and loss) on a random batch of ``data``'s shapes and kind
    of target (texts: every one ``data.max_length`` tokens, the most a batch holds); an
    out-of-memory means no. Model and optimizer are restored after each."""
    model, optimizer, precision = parts.model, parts.optimizer, parts.precision
    device = precision.device
    saved_model = {k: v.to("cpu", copy=True) for k, v in model.state_dict().items()}
    saved_optimizer = copy.deepcopy(optimizer.state_dict())

    def fits(batch_size: int) -> bool:
        try:
            generator = torch.Generator(device=device).manual_seed(0)  # not the training RNG
            images = data.inputs.example(data.input_shape, batch_size, device, generator)
            labels = data.targets.random(batch_size, device, tuple(data.input_shape))
            with precision.autocast():
                loss = parts.loss(model(images), labels)
            precision.scaler.scale(loss).backward()
            precision.scaler.step(optimizer)
            precision.scaler.update()
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        optimizer.zero_grad(set_to_none=True)
        images = labels = loss = None
        free_memory()
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_optimizer)
        log.info("batch %d: %s", batch_size, "fits" if ok else "out of memory")
        return ok

    return fits


def tune(kind: str, parts: Any, batches: Any, data: Any, out: Any) -> float:
    """Run the finder ``tune=`` names on the step model, optimizer and precision of ``parts``
    and report its answer through ``out`` (utils/run/outputs.py: only a process that writes the
    run's files writes the curve and its TensorBoard points); the model and optimizer are
    left as they were."""
    model, optimizer, precision = parts.model, parts.optimizer, parts.precision
    device, run_dir, console = precision.device, out.run_dir, out.console
    if kind == "lr":
        lrs, losses, suggested = lr_range_test(model, optimizer, batches, precision, parts.loss)
        out.track()
        for step, (lr, loss) in enumerate(zip(lrs, losses, strict=True)):
            out.scalars("tune", {"lr": lr, "smoothed_loss": loss}, step)
        out.close()
        where = ""
        if out.writes_events:
            picture = plots.lr_range(lrs, losses, suggested if math.isfinite(suggested) else None)
            write_file(run_dir / "lr_finder.png", picture, "choose a folder this user can write")
            where = f"; curve: {run_dir / 'lr_finder.png'} and TensorBoard tune/"
        console.print(
            f"LR range test over {len(lrs)} steps ({lrs[0]:.0e} to {lrs[-1]:.1e}): suggested "
            f"optim.lr={suggested:.2e}{where}"
        )
        return suggested
    if kind == "batch_size":
        limit = len(data.splits["train"])
        fits = batch_fits(parts, data)
        found = find_batch_size(fits, start=1, limit=limit)
        capped = " (all of the training split: the cap)" if found == limit else ""
        console.print(
            f"largest batch that fits for {model.__class__.__name__} at {precision.name} on "
            f"{device}: data.batch_size={found}{capped}"
        )
        return float(found)
    raise AssertionError(f"tune={kind!r}: refused by check_config")
