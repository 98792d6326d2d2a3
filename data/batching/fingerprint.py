"""What a run's data is, by content: a hash of each sample (its input and target as the run
reads them, after decoding and before normalisation), each split's membership (which samples
it holds, in any order) and each source's content, so a resume or an evaluation can tell
whether the data changed and which samples a checkpoint was trained on.

A file's metadata plays no part: ``touch`` changes nothing, an added image or an edited cell
does. Only a split of image files read lazily (``data.cache=off``), whose content is never
hashed, is recorded by its files' listing instead (:func:`listing_sha256`). The hashes are computed in one vectorised pass over the split tensors (each row's bytes
as 64-bit words, weighted by fixed random odd numbers, summed modulo 2^64 and mixed by
splitmix64's finaliser), or read from the image cache, which computes them as it decodes.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections import Counter
from functools import cache
from typing import Any

import numpy as np
import torch

CHUNK_BYTES = 64 * 2**20  # the bytes hashed at a time
SEED = 20261203
MASK = (1 << 64) - 1


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# splitmix64's finaliser: every bit of a sum moves every bit of the hash
MIX = (_signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB))


@cache
def _weights(words: int, salt: int) -> torch.Tensor:
    """[words] fixed odd int64 weights: the same on every machine (torch's CPU generator)."""
    generator = torch.Generator().manual_seed(SEED + 7919 * words + salt)
    drawn = torch.randint(-(2**62), 2**62, (words,), generator=generator, dtype=torch.int64)
    return drawn | 1


def _shifted(z: torch.Tensor, bits: int) -> torch.Tensor:
    """``z >>> bits``: a logical shift of int64 values (torch's ``>>`` keeps the sign)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mixed(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shifted(z, 30)) * MIX[0]
    z = (z ^ _shifted(z, 27)) * MIX[1]
    return z ^ _shifted(z, 31)


def _row_words(tensor: torch.Tensor) -> torch.Tensor:
    """[N, W] int64: each row's bytes (of any dtype) as 8-byte words, zero-padded."""
    flat = tensor.detach().reshape(len(tensor), -1).cpu().contiguous()
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8).reshape(len(tensor), -1)
    if raw.shape[1] % 8:
        raw = torch.cat([raw, raw.new_zeros(len(raw), 8 - raw.shape[1] % 8)], dim=1)
    return raw.view(torch.int64)


def _words_hash(words: torch.Tensor, salt: int) -> torch.Tensor:
    """[N] int64: the rows' words weighted by fixed odd weights and summed (wrapping modulo
    2^64: a difference in one word always changes the sum), then mixed."""
    return _mixed((words * _weights(words.shape[1], salt)).sum(dim=1))


def sample_hashes(inputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """[N] int64: a hash of each sample's input bytes and target bytes. ``inputs`` is a tensor
    or an array (an image cache's memory map: read in chunks)."""
    count = len(labels)
    out = torch.empty(count, dtype=torch.int64)
    row = int(np.prod(inputs.shape[1:])) * inputs.dtype.itemsize if count else 1
    step = max(1, CHUNK_BYTES // max(1, row))
    targets = _words_hash(_row_words(labels), 1) if count else out
    for start in range(0, count, step):
        part = inputs[start : start + step]
        if isinstance(part, np.ndarray):
            with warnings.catch_warnings():  # a read-only memory map: read here, never written
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                part = torch.from_numpy(np.ascontiguousarray(part))
        sums = _words_hash(_row_words(part), 0)
        out[start : start + step] = _mixed(sums ^ targets[start : start + step])
    return out


def decoded_hashes(split: Any, chunk: int = 1024) -> torch.Tensor:
    """The hashes of a split read lazily (a Dataset of (uint8 image, target) with ``targets``),
    each image decoded once, ``chunk`` at a time."""
    parts = []
    for start in range(0, len(split), chunk):
        stop = min(start + chunk, len(split))
        images = torch.stack([split[index][0] for index in range(start, stop)])
        parts.append(sample_hashes(images, split.targets[start:stop]))
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


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


def listing_sha256(samples: list[tuple[str, Any]], root: str) -> str:
    """The sha256 of image files' listing: each file's path under ``root``, size, modification
    time and label, in order. What a split read lazily (``data.cache=off``, whose content is
    never hashed) is compared by on resume: a file edited, added, removed or touched changes
    it."""
    digest = hashlib.sha256()
    for path, label in samples:
        stat = os.stat(path)
        named = os.path.relpath(path, root)
        digest.update(f"{named}\0{stat.st_size}\0{stat.st_mtime_ns}\0{label}\n".encode())
    return digest.hexdigest()
