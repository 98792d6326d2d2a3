"""Which way is better for the monitored metric: ``trainer.monitor_mode`` follows the metric.

Losses and errors are better lower, accuracies and scores higher. ``auto`` (the default) takes
the direction from the metric's name; an explicit ``min`` or ``max`` that contradicts the name
is refused, since best.pt would then hold the worst epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from utils.errors import UserError

# Words of a metric's name (after the split prefix, split at "_") that say its direction.
LOWER_IS_BETTER = ("loss", "error", "err", "mae", "mse", "rmse", "nll", "perplexity")
HIGHER_IS_BETTER = ("acc", "accuracy", "f1", "precision", "recall", "auc", "map", "r2")
MODES = ("auto", "min", "max")


def default_monitor(task_target: str) -> str:
    """trainer.monitor's default (conf/train.yaml: ``${default_monitor:${task._target_}}``): the
    main validation metric of the task ``task_target`` builds, as its class says."""
    from utils import tasks  # torch: imported once a config is resolved, not with the schema

    return tasks.default_monitor(task_target)


def natural_mode(monitor: str) -> str | None:
    """``min`` or ``max`` from the metric's name (``val/loss`` → min), None when it says neither."""
    words = str(monitor).rsplit("/", 1)[-1].lower().split("_")
    if any(word in LOWER_IS_BETTER for word in words):
        return "min"
    if any(word in HIGHER_IS_BETTER for word in words):
        return "max"
    return None


def monitor_mode(monitor: str, mode: str) -> str:
    """The direction in which ``monitor`` improves: ``min`` or ``max``."""
    if mode not in MODES:
        raise UserError(f"trainer.monitor_mode={mode!r} must be auto, min or max")
    natural = natural_mode(monitor)
    if mode == "auto":
        if natural is None:
            raise UserError(
                f"trainer.monitor={monitor!r}: cannot tell whether higher or lower is better; "
                "set trainer.monitor_mode=min or max"
            )
        return natural
    if natural is not None and natural != mode:
        raise UserError(
            f"trainer.monitor={monitor} with trainer.monitor_mode={mode} would keep the worst "
            f"epoch as best.pt ({monitor} is better {'lower' if natural == 'min' else 'higher'}); "
            f"use trainer.monitor_mode={natural} or auto"
        )
    return mode


@dataclass(frozen=True)
class Monitor:
    """The metric that picks best.pt, ranks top-k files, drives early decisions and sorts a
    sweep's jobs, with its direction."""

    name: str
    mode: str  # min | max

    @classmethod
    def from_config(cls, monitor: str, mode: str) -> Monitor:
        return cls(monitor, monitor_mode(monitor, mode))

    @property
    def sign(self) -> int:
        """+1 when higher is better, -1 when lower is: ``sign * (new - old) > 0`` improves."""
        return 1 if self.mode == "max" else -1

    @property
    def worst(self) -> float:
        """What a failed job reports: worse than any value."""
        return -self.sign * math.inf

    def at_least_as_good(self, value: float, than: float | None) -> bool:
        """Ties count: a later epoch with the same value has trained longer."""
        return than is None or self.sign * (value - than) >= 0

    def better(self, value: float, than: float) -> bool:
        return self.sign * (value - than) > 0

    def check_measured(self, measured: list[str]) -> None:
        """Refuse a monitor that validation does not measure (``measured``: val/ names)."""
        if self.name not in measured:
            raise UserError(f"trainer.monitor={self.name!r} is not measured; use one of {measured}")

    def best_or_worst(self, best: float | None) -> float:
        """What a run reports to a sweeper: its best value, or the worst when it has none."""
        return best if best is not None else self.worst
