"""Sums of the training loss, for the logging window and for the epoch, kept on the device with
no work per step: each micro-batch's loss is appended to a list, and the list is summed only
where the loop reads the sums anyway, at logging steps and at the end of an epoch. On a small
model a scalar op costs as much as a few percent of the step, and on a GPU each is a kernel
launch; a step adds none.

Where the list is summed depends on the step count alone, and losses not yet summed travel in
the checkpoint, so a resumed run adds the same numbers in the same order as one that never
stopped: its logged losses are bit-identical. The same pass finds the first optimizer step whose
loss was NaN or Inf (``trainer.nonfinite=stop``).
"""

from __future__ import annotations

from typing import Any

import torch


class LossSums:
    def __init__(self, device: torch.device, accumulate: int) -> None:
        self.device = device
        self.accumulate = accumulate  # micro-batches per optimizer step
        self.pending: list[torch.Tensor] = []
        self.epoch = torch.zeros((), device=device)
        self.window = torch.zeros((), device=device)
        self.window_batches = 0
        self.nonfinite_at = torch.full((), -1, dtype=torch.long, device=device)

    def add(self, loss: torch.Tensor) -> None:
        """One micro-batch's detached loss."""
        self.pending.append(loss)

    def window_mean(self, step: int) -> torch.Tensor:
        """The mean loss of the logging window that ends with optimizer step ``step``; the next
        window starts empty."""
        self._sum_pending(step)
        mean = self.window / max(self.window_batches, 1)
        self.window, self.window_batches = torch.zeros_like(self.window), 0
        return mean

    def epoch_mean(self, step: int, micro_batches: int) -> torch.Tensor:
        """The mean loss of the epoch that ends with optimizer step ``step``."""
        self._sum_pending(step)
        mean = self.epoch / micro_batches
        self.epoch = torch.zeros_like(self.epoch)
        return mean

    def first_nonfinite_step(self, step: int) -> int:
        """The first optimizer step whose loss was NaN or Inf, or -1; ``step`` is the last one
        taken. A host sync. Pending losses are looked at, not summed: summing them here would
        move the points where the sums are cut."""
        found = self.nonfinite_at
        if self.pending:
            found = self._first_nonfinite(torch.stack(self.pending), step, found)
        return int(found.item())

    def _sum_pending(self, step: int) -> None:
        if not self.pending:
            return
        losses = torch.stack(self.pending)
        self.pending = []
        total = losses.sum()
        self.epoch += total
        self.window += total
        self.window_batches += len(losses)
        self.nonfinite_at = self._first_nonfinite(losses, step, self.nonfinite_at)

    def _first_nonfinite(self, losses: torch.Tensor, step: int, found: torch.Tensor):
        """On the device: ``found`` if set, else the step of the first non-finite loss in
        ``losses`` (which end with step ``step``), else -1."""
        bad = ~torch.isfinite(losses)
        first = bad.int().argmax()
        at = step - (len(losses) - 1 - first) // self.accumulate
        return torch.where(bad.any() & (found < 0), at, found)

    def state_dict(self) -> dict[str, Any]:
        pending = torch.stack(self.pending) if self.pending else torch.zeros(0, device=self.device)
        return {
            "epoch": self.epoch,
            "window": self.window,
            "window_batches": self.window_batches,
            "pending": pending,
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.epoch = saved["epoch"].to(self.device)
        self.window = saved["window"].to(self.device)
        self.window_batches = saved["window_batches"]
        self.pending = list(saved["pending"].to(self.device).unbind())
