"""Ready-made callbacks, chosen with ``callbacks=[...]`` (conf/callbacks/); each is also an
example of a callback you write yourself (docs/callbacks.md)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from utils.config.monitor import natural_mode
from utils.errors import UserError


def seconds_of(max_time: Any) -> float:
    """``max_time`` as seconds: a number of seconds, or ``"DD:HH:MM:SS"`` (leading fields may
    be left out: ``"01:30:00"`` is an hour and a half)."""
    if isinstance(max_time, int | float) and not isinstance(max_time, bool):
        seconds = float(max_time)
    else:
        parts = str(max_time).split(":")
        try:
            fields = [float(part) for part in parts]
        except ValueError:
            fields = []
        if not 1 <= len(fields) <= 4 or len(fields) != len(parts):
            raise UserError(
                f"TimeBudget: max_time={max_time!r} is not a time; give seconds "
                "(3600) or DD:HH:MM:SS (00:23:30:00)"
            )
        seconds = sum(
            f * unit for f, unit in zip(reversed(fields), (1, 60, 3600, 86400), strict=False)
        )
    if not (math.isfinite(seconds) and seconds > 0):
        raise UserError(f"TimeBudget: max_time={max_time!r} must be more than 0 s")
    return seconds


class TimeBudget:
    """Stop once the run has trained for ``max_time`` in all, across resumes (the time of
    every earlier segment is in its state): checked at each logged step and each validation,
    so the run ends with a checkpoint and its test before a job scheduler's limit."""

    def __init__(self, max_time: Any) -> None:
        self.budget = seconds_of(max_time)
        self.earlier = 0.0  # seconds of the run's earlier segments, to their last checkpoint
        self.started = time.monotonic()

    def on_fit_start(self, run: Any) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return self.earlier + time.monotonic() - self.started

    def _spent(self) -> str | None:
        if self.elapsed() < self.budget:
            return None
        return f"the time budget of {self.budget:g} s is spent ({self.elapsed():.0f} s trained)"

    def on_log(self, step: int, metrics: dict) -> str | None:
        return self._spent()

    def on_validation_end(self, epoch: int, metrics: dict) -> str | None:
        return self._spent()

    def state_dict(self) -> dict[str, float]:
        return {"elapsed_seconds": self.elapsed()}

    def load_state_dict(self, state: dict) -> None:
        self.earlier, self.started = float(state["elapsed_seconds"]), time.monotonic()


class StopAtTarget:
    """Stop once a validated ``metric`` reaches ``target`` (at least it, for metrics where
    more is better; at most, for losses and errors: ``mode`` auto decides as trainer.monitor's)."""

    def __init__(self, metric: str, target: float, mode: str = "auto") -> None:
        self.metric, self.target = metric, float(target)
        if mode not in ("auto", "min", "max"):
            raise UserError(f"StopAtTarget: mode={mode!r} must be auto, min or max")
        self.mode = natural_mode(metric) if mode == "auto" else mode
        if self.mode is None:
            raise UserError(
                f"StopAtTarget: cannot tell whether a higher or lower {metric} is better; "
                "give its mode: min or max"
            )

    def on_validation_end(self, epoch: int, metrics: dict) -> str | None:
        if self.metric not in metrics:
            raise KeyError(f"no {self.metric} after validation; there are {', '.join(metrics)}")
        value = metrics[self.metric]
        reached = value >= self.target if self.mode == "max" else value <= self.target
        return f"{self.metric} {value:.4f} reached {self.target:g}" if reached else None


class GradientNoise:
    """Add Gaussian noise to the gradients before each optimizer step, with a variance that
    anneals as ``eta / (1 + step) ** gamma`` (Neelakantan et al., 2015). A mutable callback:
    its draws come from a generator seeded by ``seed`` and the step, so a resumed run adds the
    same noise as one that never stopped, and it needs no state."""

    def __init__(self, eta: float = 0.01, gamma: float = 0.55, seed: int = 0) -> None:
        if not (eta >= 0 and gamma >= 0):
            raise UserError(f"GradientNoise: eta={eta} and gamma={gamma} must be 0 or more")
        self.eta, self.gamma, self.seed = eta, gamma, seed

    def on_before_optimizer_step(self, step: Any) -> None:
        std = math.sqrt(self.eta / (1 + step.global_step) ** self.gamma)
        generators: dict[torch.device, torch.Generator] = {}
        for parameter in step.model.parameters():
            grad = parameter.grad
            if grad is None:
                continue
            if grad.device not in generators:
                generators[grad.device] = torch.Generator(grad.device)
                generators[grad.device].manual_seed(self.seed * 1_000_003 + step.global_step)
            noise = torch.randn(
                grad.shape, generator=generators[grad.device], device=grad.device, dtype=grad.dtype
            )
            grad.add_(noise, alpha=std)
