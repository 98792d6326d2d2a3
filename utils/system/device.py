"""Turning ``trainer.device`` into a torch.device, with a clear error when it is not there;
fast defaults for it; and the CPU threads each process may use."""

from __future__ import annotations

import os

import torch
from torch import nn

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


def configure_device(device: torch.device) -> None:
    """Fast defaults for CUDA: TF32 matmuls and convolutions on GPUs that have them (Ampere
    and later; ~10 bits of mantissa, plenty for training)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True


def wants_channels_last(model: nn.Module, device: torch.device, setting: bool | None) -> bool:
    """``trainer.channels_last``; null: conv nets on CUDA run faster with NHWC tensors
    (cuDNN's native layout for tensor cores), while on the CPU and for MLPs the default layout
    is as fast or faster."""
    if setting is not None:
        return setting
    return device.type == "cuda" and any(isinstance(m, nn.Conv2d) for m in model.modules())


def configure_threads(cpu_threads: int | None, parallel_jobs: int) -> int:
    """Give each process its share of the cores. ``parallel_jobs`` is how many training jobs
    run at once on this machine (joblib's ``n_jobs``); torchrun's ranks multiply it. Without
    this, every job starts one thread per core and they slow each other down. Returns the
    thread count now in use."""
    processes = parallel_jobs * int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if cpu_threads is None and processes > 1:
        cpu_threads = max(1, (os.cpu_count() or 1) // processes)
    if cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    return torch.get_num_threads()
