"""Turning ``trainer.device`` into a torch.device, with a clear error when it is not there."""

from __future__ import annotations

import torch

from utils.errors import UserError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; ``cpu``, ``cuda`` and ``cuda:N`` are taken as asked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(
            f"trainer.device={name!r} is not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(
                f"trainer.device={name} but this machine has no usable CUDA GPU "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                "use trainer.device=cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(
                f"trainer.device={name} but only {torch.cuda.device_count()} GPU(s) are visible"
            )
    elif device.type != "cpu":
        raise UserError(f"trainer.device={name!r} is not supported; use auto, cpu, cuda or cuda:N")
    return device
