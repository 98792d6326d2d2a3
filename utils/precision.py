"""Mixed precision as one switch: one autocast context and one GradScaler.

The scaler is enabled only for float16, whose narrow range needs loss scaling; bfloat16 and
float32 pass through it unchanged, so the loop has no precision branches.
"""

from __future__ import annotations

import contextlib
import operator

import torch

from utils.errors import UserError
from utils.system.distributed import NO_CONTEXT

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 where the GPU supports it, else fp16 on CUDA; fp32 on CPU."""
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in DTYPES:
        raise UserError(f"precision.dtype={dtype!r} is unknown; use one of {[*DTYPES, 'auto']}")
    return DTYPES[dtype]


class Precision:
    """Built from ``conf/precision/*.yaml``; ``device`` is supplied by train.py."""

    def __init__(self, dtype: str, device: torch.device) -> None:
        self.dtype = resolve_dtype(dtype, device)
        self.device = device
        if self.dtype == torch.float16 and device.type == "cpu":
            try:  # fp16 autocast on CPU exists only in some builds
                with torch.autocast("cpu", dtype=torch.float16):
                    torch.ones(2, 2) @ torch.ones(2, 2)
            except RuntimeError:
                raise UserError(
                    "precision=fp16 is not supported on this CPU build of torch; "
                    "use precision=bf16 or fp32"
                ) from None
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        if not self.scaler.is_enabled():  # the loop calls these every step: no more than torch's
            self.backward = torch.Tensor.backward
            self.step = operator.methodcaller("step")

    def backward(self, loss: torch.Tensor) -> None:
        """The gradients of ``loss`` (scaled by the loss scale under float16)."""
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's step (skipped by the scaler when float16 gradients overflowed, the
        scale then lowered)."""
        self.scaler.step(optimizer)
        self.scaler.update()

    def discard_step(self) -> None:
        """An optimizer step that is skipped (``trainer.nonfinite=skip``): the scaler forgets
        this step's unscaling, as ``update()`` does after a step, and keeps its scale. Without
        this the next ``unscale_`` raises "unscale_() has already been called"."""
        if self.scaler.is_enabled():
            self.scaler.update(self.scaler.get_scale())

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def autocasts(self) -> bool:
        """Whether the forward runs under autocast (bfloat16, float16)."""
        return self.dtype != torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.autocasts:
            return NO_CONTEXT
        return torch.autocast(self.device.type, dtype=self.dtype)
