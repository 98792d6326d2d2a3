"""Running out of memory: one message with the numbers and the remedies, in order."""

from __future__ import annotations

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


def free_memory() -> None:
    """Drop cached blocks after an out-of-memory, so the next try starts clean."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
