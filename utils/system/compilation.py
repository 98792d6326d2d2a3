"""``trainer.compile``: torch.compile the model, or train eagerly when the compiler fails."""

from __future__ import annotations

import logging

import torch
from torch import nn

from utils.errors import UserError
from utils.text import first_line

log = logging.getLogger("torchloom")


def compile_or_eager(model: nn.Module, example: torch.Tensor, mode: str) -> nn.Module:
    """The compiled model, proven now on ``example`` (a batch of what the data gives it:
    data/batching/inputs.py); the eager model, with one warning, if compilation fails (no C++
    compiler, an unsupported op, an old GPU)."""
    try:
        compiled = torch.compile(model, mode=mode)
    except RuntimeError as error:  # an unknown mode is refused here, before any compiling
        raise UserError(f"trainer.compile_mode={mode!r}: {error}") from None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            compiled(example)
    except Exception as error:  # any compiler failure: train eagerly rather than not at all
        log.warning("warning: torch.compile failed (%s); training without it", first_line(error))
        return model
    finally:
        model.train(was_training)
    return compiled
