"""``trainer.compile``: torch.compile the model, or train eagerly when the compiler fails."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from utils.errors import UserError
from utils.text import first_line

log = logging.getLogger("torchloom")


def compile_or_eager(
    model: nn.Module, input_shape: Sequence[int], device: torch.device, mode: str
) -> nn.Module:
    """The compiled model, proven on a dummy batch now; the eager model, with one warning, if
    compilation fails (no C++ compiler, an unsupported op, an old GPU)."""
    try:
        compiled = torch.compile(model, mode=mode)
    except RuntimeError as error:  # an unknown mode is refused here, before any compiling
        raise UserError(f"trainer.compile_mode={mode!r}: {error}") from None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            compiled(torch.zeros(2, *input_shape, device=device))
    except Exception as error:  # any compiler failure: train eagerly rather than not at all
        log.warning("warning: torch.compile failed (%s); training without it", first_line(error))
        return model
    finally:
        model.train(was_training)
    return compiled
