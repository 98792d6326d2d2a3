"""Seeding, determinism, and capturing every RNG state for checkpoints.

Two kinds of randomness, kept apart:
- the data order and each batch's augmentation come from their own generators seeded by
  :func:`mix_seed` of (seed, epoch, batch): the same on every process and after any resume;
- what the forward pass draws (dropout) comes from the global torch RNG, one stream per
  process: rank 0 keeps the stream of ``seed`` (a one-process run is unchanged), rank r > 0
  takes ``mix_seed(seed, r)``, so the processes of a torchrun draw different masks. Every
  rank's stream is saved in the checkpoint and restored on resume.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

MASK_64 = (1 << 64) - 1
_PRIME_1, _PRIME_2, _PRIME_5 = 11400714785074694791, 14029467366897019727, 2870177450012600261


def mix_seed(*values: int) -> int:
    """One 63-bit seed from several integers, without collisions between small integers.

    This is CPython's ``hash(tuple)`` (xxHash's mixing), so seeds and orders from before stay
    the same, but each integer enters as its own 64-bit lane: ``hash(-1) == hash(-2)`` in
    CPython, so seeds -1 and -2 once gave the same data order.
    """
    acc = _PRIME_5
    for value in values:
        acc = (acc + (int(value) & MASK_64) * _PRIME_2) & MASK_64
        acc = ((acc << 31) | (acc >> 33)) & MASK_64
        acc = (acc * _PRIME_1) & MASK_64
    acc = (acc + (len(values) ^ (_PRIME_5 ^ 3527539))) & MASK_64
    if acc == MASK_64:
        acc = 1546275796
    return acc & 0x7FFF_FFFF_FFFF_FFFF


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch on every device from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def configure_determinism(deterministic: bool) -> None:
    """Deterministic kernels when asked; otherwise let cuDNN pick the fastest ones."""
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; set before the first CUDA matmul.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic


def seed_rank_stream(seed: int, rank: int) -> None:
    """Give process ``rank`` its own stream for what the forward pass draws (rank 0 keeps the
    stream of ``seed``), once the model is built the same way on every process."""
    if rank > 0:
        seed_everything(mix_seed(seed, rank))


def rng_state() -> dict:
    """Every global RNG state as plain containers and tensors (loadable with weights_only)."""
    kind, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, cached_gaussian],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def all_rng_states() -> list[dict]:
    """Every process's :func:`rng_state`, rank by rank (a collective under torchrun)."""
    import torch.distributed as dist

    state = rng_state()
    if not dist.is_initialized():
        return [state]
    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


def restore_rng(checkpoint: dict, processes: Any) -> None:
    """This process's RNG from ``checkpoint``: its own rank's stream when the checkpoint was
    written by as many ``processes`` (utils/system/distributed.py), else rank 0's, re-split per rank at
    the saved step (another world size is not bit-exact anyway)."""
    rank, world = processes.rank, processes.world_size
    per_rank = checkpoint.get("rng_per_rank") or [checkpoint["rng"]]
    if len(per_rank) == world:
        set_rng_state(per_rank[rank])
        return
    set_rng_state(checkpoint["rng"])
    if rank > 0:
        seed_everything(mix_seed(checkpoint["config"]["seed"], rank, checkpoint["global_step"]))


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
