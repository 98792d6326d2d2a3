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

from utils.config.monitor import Monitor
from utils.errors import UserError

log = logging.getLogger("torchloom")


FRESH = {"best": None, "best_epoch": None, "bad_validations": 0, "stopped_at": None}
KINDS = {
    "best": (float, int, type(None)),
    "best_epoch": (int, type(None)),
    "bad_validations": (int,),
    "stopped_at": (int, type(None)),
}


class EarlyStopping:
    """The rule; its count lives in the training state (``state.early_stopping``, saved and
    resumed with it), so it is read afresh at every question and nothing is copied back."""

    def __init__(
        self, patience: int | None, min_delta: float, monitor: Monitor, state: Any
    ) -> None:
        self.patience, self.min_delta, self.monitor, self.state = (
            patience,
            min_delta,
            monitor,
            state,
        )
        self.told = False  # a resumed stop that no longer applies is logged once

    @classmethod
    def of(cls, config: Any, monitor: Monitor, state: Any) -> EarlyStopping:
        """``trainer.early_stopping``, counting in ``state`` (utils/fit/state.py TrainState)."""
        return cls(config.patience, config.min_delta, monitor, state)

    @property
    def count(self) -> dict[str, Any]:
        """best, best_epoch, bad_validations and stopped_at, as the state holds them."""
        return {**FRESH, **check_count(self.state.early_stopping)}

    @property
    def stopped_at(self) -> int | None:
        """The epoch the run stopped after, when the rule still says so: a checkpoint's stop
        that a raised or removed patience no longer applies to lets training go on."""
        count = self.count
        if count["stopped_at"] is None:
            return None
        if self.patience is not None and count["bad_validations"] >= self.patience:
            return count["stopped_at"]
        if not self.told:
            self.told = True
            log.info(
                "early stopping: the checkpoint stopped after epoch %d with %d validations "
                "without improvement; trainer.early_stopping.patience=%s now lets it go on",
                count["stopped_at"],
                count["bad_validations"],
                self.patience,
            )
        return None

    def done(self) -> bool:
        return self.stopped_at is not None

    def update(self, value: float, epoch: int) -> None:
        """Take one validation's monitored ``value`` after ``epoch`` into the state's count.
        :meth:`done` is then true when the run should stop."""
        count = self.count
        if self.patience is None:
            self.state.early_stopping = {**count, "stopped_at": None}
            return
        best = count["best"]
        improved = best is None or self.monitor.better(
            value - self.monitor.sign * self.min_delta, best
        )
        if improved:
            count.update(best=value, best_epoch=epoch, bad_validations=0)
        else:
            count["bad_validations"] += 1
        count["stopped_at"] = epoch if count["bad_validations"] >= self.patience else None
        self.state.early_stopping = count
        if self.done():
            log.info("early stopping after epoch %d: %s", epoch, self.reason)

    @property
    def reason(self) -> str | None:
        """Why the run stopped early, in one sentence; None when it did not."""
        if self.stopped_at is None:
            return None
        count = self.count
        return (
            f"{self.monitor.name} did not improve by {self.min_delta:g} for "
            f"{count['bad_validations']} validations; best {count['best']:.4f} at epoch "
            f"{count['best_epoch']}"
        )

    def summary(self) -> dict[str, Any]:
        """What metrics.json records: the epoch the run stopped after, and why (null when it
        ran to trainer.max_epochs)."""
        return {"stopped_early_at_epoch": self.stopped_at, "early_stopping": self.reason}


def check_count(stored: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``early_stopping`` count (untrusted: {} or what :meth:`update` writes)."""
    if not stored:
        return {}
    for key, kind in KINDS.items():
        value = stored.get(key, ...)
        if not isinstance(value, kind) or isinstance(value, bool):  # True is an int too
            raise UserError(
                f"the checkpoint's early_stopping.{key} is {stored.get(key, 'missing')!r}, "
                "not what torchloom writes (was it edited?); use init_from=... for its weights"
            )
    return {key: stored[key] for key in KINDS}
