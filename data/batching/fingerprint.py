"""What a run's data is, by content: a hash of each sample (its input and target as the run
reads them, after decoding and before normalisation), each split's membership (which samples
it holds, in any order) and each source's content, so a resume or an evaluation can tell
whether the data changed and which samples a checkpoint was trained on.

A file's metadata plays no part: ``touch`` changes nothing, an added image or an edited cell
does. The hashes are computed in one vectorised pass over the split tensors (exact integer sums
in float64 against fixed random weights, modulo three primes: about 60 bits per sample), or
read from the image cache, which computes them as it decodes.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from functools import cache
from typing import Any

import numpy as np
import torch

PRIMES = (1048573, 1048571, 1048559)  # below 2^20: three weighted sums, exact in float64
CHUNK_BYTES = 32 * 2**20  # rows hashed at a time: their bytes as float64 stay under 256 MiB
SEED = 20261203


@cache
def _weights(width: int) -> torch.Tensor:
    """[width, 3] fixed weights below 2^20: the same on every machine (torch's CPU generator)."""
    generator = torch.Generator().manual_seed(SEED + width)
    return torch.randint(0, PRIMES[-1], (width, len(PRIMES)), generator=generator).double()


def _row_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """[N, B] uint8: each row's bytes (of any dtype), contiguous, on the CPU."""
    flat = tensor.detach().reshape(len(tensor), -1).cpu().contiguous()
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8).reshape(len(tensor), -1)


def sample_hashes(inputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """[N] int64: a hash of each sample's input and target bytes. ``inputs`` is a tensor or
    an array (an image cache's memory map: read in chunks)."""
    count = len(labels)
    out = torch.empty(count, dtype=torch.int64)
    label_bytes = _row_bytes(labels)
    row = int(np.prod(inputs.shape[1:])) * inputs.dtype.itemsize if count else 1
    step = max(1, CHUNK_BYTES // max(1, row + label_bytes.shape[1]))
    for start in range(0, count, step):
        part = inputs[start : start + step]
        part = (
            torch.from_numpy(np.ascontiguousarray(part)) if isinstance(part, np.ndarray) else part
        )
        rows = torch.cat([_row_bytes(part), label_bytes[start : start + step]], dim=1)
        sums = rows.double() @ _weights(rows.shape[1])  # exact: below 2^53
        parts = [sums[:, i].remainder(p).long() for i, p in enumerate(PRIMES)]
        out[start : start + step] = parts[0] | (parts[1] << 20) | (parts[2] << 40)
    return out


def membership(hashes: torch.Tensor) -> str:
    """The sha256 of a split's samples as a set (sorted): the same whatever their order."""
    ordered = torch.sort(hashes.to(torch.int64)).values
    return hashlib.sha256(ordered.numpy().tobytes()).hexdigest()


def changes(before: torch.Tensor, after: torch.Tensor) -> tuple[int, int]:
    """(samples added, samples removed) from ``before`` to ``after``, counted as multisets: a
    changed sample is one of each."""
    old, new = Counter(before.tolist()), Counter(after.tolist())
    return sum((new - old).values()), sum((old - new).values())


def overlap(evaluated: torch.Tensor, trained: torch.Tensor) -> int:
    """How many of ``evaluated``'s samples are among ``trained``'s."""
    return int(torch.isin(evaluated, trained).sum())


def file_sha256(path: Any) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()
