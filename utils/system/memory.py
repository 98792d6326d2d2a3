"""Memory: one message with the numbers and the remedies when it runs out, and Python's cycle
collector kept out of the training steps."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import torch

from utils.errors import UserError


def out_of_memory(device: torch.device, batch_size: int, accumulate: int, saved: str) -> UserError:
    """The error for an out-of-memory during training on ``device``."""
    if device.type == "cuda":
        allocated = torch.cuda.memory_allocated(device) / 2**30
        reserved = torch.cuda.memory_reserved(device) / 2**30
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        usage = f"{allocated:.1f} GiB allocated, {reserved:.1f} GiB reserved of {total:.1f} GiB"
    else:
        usage = "host memory"
    return UserError(
        f"out of memory on {device} at data.batch_size={batch_size} ({usage}); {saved}; in "
        f"order: data.batch_size={max(1, batch_size // 2)} with "
        f"trainer.accumulate_grad_batches={accumulate * 2} (same effective batch), "
        "precision=bf16, a smaller model; python train.py tune=batch_size finds the largest "
        "batch that fits"
    )


def available_memory() -> float:
    """Bytes of host memory available now (``MemAvailable``; else the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(needed: float, asked: str, fix: str) -> None:
    """Refuse, before anything is allocated, what would need ``needed`` bytes of host memory
    when the machine has fewer available: ``asked`` names the value, ``fix`` the remedy."""
    available = available_memory()
    if needed > available:
        raise UserError(
            f"{asked} needs {needed / 2**30:,.1f} GiB of memory, and "
            f"{available / 2**30:,.1f} GiB are available; {fix}"
        )


def free_memory() -> None:
    """Drop cached blocks after an out-of-memory, so the next try starts clean."""

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def cycle_collection_by_the_loop() -> Iterator[None]:
    """Python's automatic cycle collection off while training; the loop calls
    :func:`collect_cycles` at its logging steps and epoch ends instead. With torch, Hydra and TensorBoard
    loaded the collector tracks some 400,000 objects, and its automatic passes fall on random
    steps: a full pass took 80 ms on a 2-core CPU, as long as 40 steps of the default job.
    Only cycles wait for the next logging step; everything else is freed at once as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def collect_cycles() -> None:
    """The young generations only: what the steps since the last call left behind."""
    gc.collect(1)


# data.cache_max_gb=null: this share of the memory available now (and, on a machine with a
# GPU, of its free memory).
DEFAULT_MEMORY_SHARE = 0.5


def memory_budget(max_gb: float | None) -> float:
    """Bytes the memory path may hold: ``data.cache_max_gb``, or by default
    :data:`DEFAULT_MEMORY_SHARE` of the available memory (and of a GPU's free memory)."""
    if max_gb is not None:
        return max_gb * 2**30
    available = available_memory()
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        available = min(available, free)
    return DEFAULT_MEMORY_SHARE * available
