"""``trainer.nonfinite``: what a NaN or Inf loss does to a run.

``stop`` (default) adds no work to a step: where the loop syncs anyway (logging steps, the end
of an epoch) and before every checkpoint, it asks the loss sums (:mod:`utils.fit.loss_sums`) for
the first step whose loss was not finite, and ends the run naming the step, the LR, the loss
scale and the first parameter with non-finite gradients or values. No checkpoint is ever
written from non-finite weights. ``skip`` reads one flag per optimizer step, skips the steps
with a non-finite loss, counts them, and stops after ``max_consecutive_skips`` in a row. An
fp16 loss scale that collapses below :data:`MIN_LOSS_SCALE` (every step overflowing) is an
error too, not a silent stall.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from utils.errors import UserError
from utils.fit.loss_sums import LossSums
from utils.system import distributed

MIN_LOSS_SCALE = 2.0**-14  # GradScaler starts at 2**16 and halves on each overflowing step
REMEDIES = (
    "lower optim.lr, set trainer.gradient_clip_val=1.0, use precision=bf16 instead of fp16, "
    "or trainer.nonfinite=skip to step over rare bad batches"
)


class NonFinite(UserError):
    """The run diverged: the message names where and what to change."""


class NonFiniteWatch:
    def __init__(self, policy: str, max_consecutive_skips: int, losses: LossSums) -> None:
        if policy not in ("stop", "skip"):
            raise UserError(f"trainer.nonfinite={policy!r} must be stop or skip")
        self.policy = policy
        self.max_consecutive_skips = max_consecutive_skips
        self.losses = losses
        self.step_bad = torch.zeros((), dtype=torch.bool, device=losses.device)  # skip
        self.consecutive = 0  # skipped steps in a row (the total is TrainState.skipped_steps)
        if policy == "stop":  # the run ends at the next sync; the sums need no cleaning
            self.observe = torch.Tensor.detach  # per micro-batch: no more than that

    def observe(self, loss: torch.Tensor) -> torch.Tensor:
        """Called for every micro-batch's loss; no host sync. Returns the detached loss for the
        running sums; under ``skip`` a non-finite one counts as 0, so a skipped step does not
        poison them (under ``stop`` this is ``Tensor.detach`` itself: see ``__init__``)."""
        loss = loss.detach()
        self.step_bad |= ~torch.isfinite(loss)
        return torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0)

    def step_allowed(self, step: int, optimizer) -> bool:
        """At the end of a step's micro-batches: whether the optimizer may step (the caller
        counts the skipped steps). Under ``skip`` this reads one flag from the device (agreed
        by all processes)."""
        if self.policy == "stop":
            return True
        bad = distributed.agree(bool(self.step_bad.item()), self.step_bad.device)
        self.step_bad.zero_()
        if not bad:
            self.consecutive = 0
            return True
        self.consecutive += 1
        optimizer.zero_grad(set_to_none=True)
        if self.consecutive > self.max_consecutive_skips:
            raise NonFinite(
                f"non-finite loss on {self.consecutive} optimizer steps in a row (up to step "
                f"{step}, lr {optimizer.param_groups[0]['lr']:.3g}), more than "
                f"trainer.max_consecutive_skips={self.max_consecutive_skips}; "
                f"{REMEDIES.rsplit(', or ', 1)[0]}"
            )
        return False

    def check(self, step: int, parts: Any, saved: str, weights: bool = False) -> None:
        """Where the loop syncs anyway, after optimizer step ``step``: end the run if a step
        went non-finite (or, with ``weights``, before a checkpoint, if any weight is), or if
        the fp16 loss scale collapsed. ``parts``: the step's (utils/fit/loop.py); ``saved``: what
        the last good checkpoint holds, for the message."""
        model, optimizer, scaler = parts.model, parts.optimizer, parts.precision.scaler
        bad_step = self.losses.first_nonfinite_step(step) if self.policy == "stop" else -1
        weights_bad = weights and not self.weights_finite(model)
        if distributed.agree(bad_step >= 0 or weights_bad, self.losses.device):
            what = (
                f"non-finite loss at optimizer step {bad_step}"
                if bad_step >= 0
                else "non-finite weights before writing a checkpoint"
            )
            scale = f"{scaler.get_scale():.3g}" if scaler.is_enabled() else "none (not fp16)"
            raise NonFinite(
                f"{what} (lr {optimizer.param_groups[0]['lr']:.3g}, loss scale {scale}); first "
                f"parameter with non-finite gradients or values: {first_nonfinite(model)}; "
                f"{saved}; {REMEDIES}"
            )
        if scaler.is_enabled() and scaler.get_scale() < MIN_LOSS_SCALE:
            raise NonFinite(
                f"the fp16 loss scale collapsed to {scaler.get_scale():.3g} (below "
                f"{MIN_LOSS_SCALE:.3g}): gradients overflow on every step, so nothing trains; "
                f"{saved}; use precision=bf16 or fp32, or lower optim.lr"
            )

    def weights_finite(self, model: nn.Module) -> bool:
        flags = [torch.isfinite(p).all() for p in model.parameters()]
        return bool(torch.stack(flags).all().item()) if flags else True


def first_nonfinite(model: nn.Module) -> str:
    """The first parameter whose gradient (else whose value) holds a NaN or Inf."""
    for name, parameter in model.named_parameters():
        if parameter.grad is not None and not torch.isfinite(parameter.grad).all():
            return f"{name} (gradient)"
    for name, parameter in model.named_parameters():
        if not torch.isfinite(parameter).all():
            return f"{name} (value)"
    return "none found (the loss itself overflowed)"
