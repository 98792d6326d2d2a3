"""Sums of the training loss, for the logging window and for the epoch, with no work per step:
each micro-batch's loss stays on the device in a list, and the list is read only where the loop
waits for the device anyway, at logging steps and at the end of an epoch. There it is copied to
the host in one transfer and summed there, in double precision. On a small model a scalar op
costs as much as a few percent of the step, and on a GPU each is a kernel launch; a step adds
none, and a read adds one.

Where the list is read depends on the step count alone, and losses not yet read travel in the
checkpoint, so a resumed run adds the same numbers in the same order as one that never stopped:
its logged losses are bit-identical. A sum that is not finite holds a NaN or Inf loss; only then
is the list searched, for the first optimizer step whose loss was one (``trainer.nonfinite=stop``).
"""

from __future__ import annotations

import math
from typing import Any

import torch


class LossSums:
    def __init__(self, device: torch.device, accumulate: int) -> None:
        self.device = device
        self.accumulate = accumulate  # micro-batches per optimizer step
        self.pending: list[torch.Tensor] = []  # one list for the run: ``add`` appends to it
        self.add = self.pending.append  # one micro-batch's detached loss, every micro-batch
        self.epoch = 0.0
        self.window = 0.0
        self.window_batches = 0
        self.nonfinite_at = -1

    def window_mean(self, step: int) -> float:
        """The mean loss of the logging window that ends with optimizer step ``step``; the next
        window starts empty. Waits for the device."""
        self._sum_pending(step)
        mean = self.window / max(self.window_batches, 1)
        self.window, self.window_batches = 0.0, 0
        return mean

    def epoch_mean(self, step: int, micro_batches: int) -> float:
        """The mean loss of the epoch that ends with optimizer step ``step``. Waits for the
        device."""
        self._sum_pending(step)
        mean = self.epoch / micro_batches
        self.epoch = 0.0
        return mean

    def first_nonfinite_step(self, step: int) -> int:
        """The first optimizer step whose loss was NaN or Inf, or -1; ``step`` is the last one
        taken. Pending losses are looked at, not summed: summing them here would move the
        points where the sums are cut."""
        if self.nonfinite_at < 0 and self.pending:
            return self._first_nonfinite(_to_host(self.pending), step)
        return self.nonfinite_at

    def _sum_pending(self, step: int) -> None:
        if not self.pending:
            return
        values = _to_host(self.pending)
        self.pending.clear()
        total = sum(values)
        self.epoch += total
        self.window += total
        self.window_batches += len(values)
        if self.nonfinite_at < 0 and not math.isfinite(total):
            self.nonfinite_at = self._first_nonfinite(values, step)

    def _first_nonfinite(self, values: list[float], step: int) -> int:
        """The step of the first non-finite loss in ``values`` (which end with step ``step``),
        or -1."""
        for index, value in enumerate(values):
            if not math.isfinite(value):
                return step - (len(values) - 1 - index) // self.accumulate
        return -1

    def state_dict(self) -> dict[str, Any]:
        pending = torch.stack(self.pending) if self.pending else torch.zeros(0, device=self.device)
        return {
            "epoch": torch.tensor(self.epoch, dtype=torch.float64),
            "window": torch.tensor(self.window, dtype=torch.float64),
            "window_batches": self.window_batches,
            "pending": pending,
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """The sums as :meth:`state_dict` wrote them; anything else (an edited file) raises
        here, where the checkpointer names the piece, not at the next sync mid-run."""
        epoch, window = float(saved["epoch"]), float(saved["window"])
        batches, pending = saved["window_batches"], saved["pending"]
        if not (math.isfinite(epoch) and math.isfinite(window)):
            raise ValueError(f"loss sums {epoch}, {window}: a run with a NaN/Inf loss saves none")
        if type(batches) is not int or batches < 0:
            raise ValueError(f"window_batches={batches!r}: a count")
        if not (isinstance(pending, torch.Tensor) and pending.dim() == 1):
            raise ValueError("pending: one loss per micro-batch, a 1-D tensor")
        if not pending.is_floating_point():
            raise ValueError(f"pending: losses, not {pending.dtype}")
        self.epoch, self.window, self.window_batches = epoch, window, batches
        self.pending[:] = pending.to(self.device).unbind()


def _to_host(losses: list[torch.Tensor]) -> list[float]:
    """Losses on the device → Python floats, in one transfer."""
    return torch.stack(losses).tolist()
