"""``trainer.early_stopping``: end a run once the monitored metric stops improving.

Counted in validations, not epochs (``trainer.val_every_n_epochs`` may skip epochs): after
``patience`` validations in a row without an improvement of at least ``min_delta`` over the best
value so far, in the monitor's direction, the run stops after that epoch's checkpoint and goes
on to test best.pt as a finished run does. Its count and best value are part of the training
state (``early_stopping`` in the checkpoint), so a resumed run stops at the same epoch as one
that never stopped.
"""

from __future__ import annotations

import logging
from typing import Any

from utils.errors import UserError
from utils.monitor import Monitor

log = logging.getLogger("torchloom")


class EarlyStopping:
    def __init__(self, patience: int | None, min_delta: float, monitor: Monitor) -> None:
        self.patience, self.min_delta, self.monitor = patience, min_delta, monitor
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.bad_validations = 0
        self.stopped_at: int | None = None  # the epoch it ended the run after

    @classmethod
    def of(cls, config: Any, monitor: Monitor, state: Any) -> EarlyStopping:
        """``trainer.early_stopping``, continuing the count a resumed ``state`` holds."""
        early = cls(config.patience, config.min_delta, monitor)
        if state.early_stopping:
            early.load_state_dict(state.early_stopping)
        stopped = early.stopped_at is not None
        if stopped and (early.patience is None or early.bad_validations < early.patience):
            log.info("early stopping: the checkpoint stopped after epoch %d with %d validations "
                     "without improvement; trainer.early_stopping.patience=%s now lets it go on",
                     early.stopped_at, early.bad_validations, early.patience)  # fmt: skip
            early.stopped_at = None  # the stop no longer applies: training continues
        return early

    def done(self) -> bool:
        return self.stopped_at is not None

    def update(self, value: float, epoch: int) -> dict[str, Any]:
        """Take one validation's monitored ``value`` after ``epoch``; returns the state to
        save with that epoch. :meth:`done` is then true when the run should stop."""
        if self.patience is None:
            return self.state_dict()
        improved = self.best is None or self.monitor.better(
            value - self.monitor.sign * self.min_delta, self.best
        )
        if improved:
            self.best, self.best_epoch, self.bad_validations = value, epoch, 0
        else:
            self.bad_validations += 1
        if self.bad_validations >= self.patience:
            self.stopped_at = epoch
        return self.state_dict()

    @property
    def reason(self) -> str | None:
        """Why the run stopped early, in one sentence; None when it did not."""
        if self.stopped_at is None:
            return None
        return (f"{self.monitor.name} did not improve by {self.min_delta:g} for "
                f"{self.bad_validations} validations; best {self.best:.4f} at epoch "
                f"{self.best_epoch}")  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """What metrics.json records: the epoch the run stopped after, and why (null when it
        ran to trainer.max_epochs)."""
        return {"stopped_early_at_epoch": self.stopped_at, "early_stopping": self.reason}

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch,
                "bad_validations": self.bad_validations, "stopped_at": self.stopped_at}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kinds = {"best": (float, int, type(None)), "best_epoch": (int, type(None)),
                 "bad_validations": (int,), "stopped_at": (int, type(None))}  # fmt: skip
        for key, kind in kinds.items():
            value = state.get(key, ...)
            if not isinstance(value, kind) or isinstance(value, bool):  # True is an int too
                raise UserError(
                    f"the checkpoint's early_stopping.{key} is {state.get(key, 'missing')!r}, "
                    "not what torchloom writes (was it edited?); use init_from=... for its weights"
                )
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.bad_validations, self.stopped_at = state["bad_validations"], state["stopped_at"]
