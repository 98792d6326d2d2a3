"""``trainer.ema``: an exponential moving average of the weights, the model validation, best.pt
and the final test judge when it is on.

After every optimizer step that was taken, each floating-point parameter moves toward the
trained one, ``ema = decay_n * ema + (1 - decay_n) * param``, as one foreach ``lerp_`` over all
of them on their device (no host synchronisation). With ``warmup``, ``decay_n =
min(decay, (1 + n) / (10 + n))`` after ``n`` updates, so the early average is not dominated by
the random initial weights; without it, ``decay_n = decay``. Buffers (BatchNorm's running
statistics and counters) are copied, not averaged: they are already averages, and the EMA
model's statistics then match the weights they were measured with most recently.

Under DDP it averages the unwrapped module, whose parameters are the same on every process
after every step, so every process holds the same average. A checkpoint holds the raw weights
(``model``, what training continues from) and the average (``ema``: its weights and update
count), so a resume continues both exactly; evaluate.py and the exports choose with
``weights=ema|raw``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import nn

from utils.errors import UserError
from utils.model.weights import load_weights, unwrap

log = logging.getLogger("torchloom")


class WeightAverage:
    def __init__(self, model: nn.Module, decay: float, warmup: bool) -> None:
        if not (isinstance(decay, float | int) and not isinstance(decay, bool) and 0 < decay < 1):
            raise UserError(f"trainer.ema.decay={decay!r} must be above 0 and below 1, or null")
        self.decay, self.warmup = float(decay), warmup
        self.module = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.updates = 0
        self._pairs(model)

    @classmethod
    def of(cls, config: Any, model: nn.Module) -> WeightAverage | None:
        """``trainer.ema`` for ``model`` (its unwrapped module); None when ``decay`` is null."""
        if config.decay is None:
            return None
        return cls(model, config.decay, config.warmup)

    def _pairs(self, model: nn.Module) -> None:
        """The tensors each update reads and writes, paired once (not looked up every step)."""
        trained, averaged = unwrap(model), self.module
        pairs = list(zip(trained.parameters(), averaged.parameters(), strict=True))
        self.params = [p for p, _ in pairs if p.is_floating_point()]
        self.averaged_params = [a for p, a in pairs if p.is_floating_point()]
        buffers = list(zip(trained.buffers(), averaged.buffers(), strict=True))
        self.buffers = [b for b, _ in buffers]
        self.averaged_buffers = [a for _, a in buffers]

    def decay_now(self) -> float:
        """The decay of the next update (after :attr:`updates` updates)."""
        if not self.warmup:
            return self.decay
        n = self.updates
        return min(self.decay, (1 + n) / (10 + n))

    @torch.no_grad()
    def update(self) -> None:
        """Move the average toward the weights the optimizer step just wrote."""
        weight = 1.0 - self.decay_now()
        if self.params:
            torch._foreach_lerp_(self.averaged_params, self.params, weight)
        if self.buffers:
            torch._foreach_copy_(self.averaged_buffers, self.buffers)
        self.updates += 1

    @torch.no_grad()
    def restart_from(self, model: nn.Module) -> None:
        """Start the average again at ``model``'s weights (fresh weights from init_from, or a
        checkpoint written without an EMA)."""
        self.module.load_state_dict(unwrap(model).state_dict())
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: Any, where: str) -> None:
        """The average a checkpoint at ``where`` holds, its types checked (it is untrusted)."""
        ok = (
            isinstance(state, dict)
            and isinstance(state.get("model"), dict)
            and isinstance(state.get("updates"), int)
            and not isinstance(state.get("updates"), bool)
            and state["updates"] >= 0
        )
        if not ok:
            raise UserError(
                f"{where}: its ema entry is not what torchloom writes (was it edited?); resume "
                "with trainer.ema.decay=null, or use init_from=... for its weights"
            )
        load_weights(self.module, state["model"])
        self.updates = state["updates"]
