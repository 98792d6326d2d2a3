"""A split of a corpus as one stream of token ids, cut into windows of ``block_size + 1``
tokens (the inputs and, one token on, the targets), in an order torchloom owns.

Training (``data.windows``): with ``random`` (the default), "pass" ``p`` is as many windows as
the stream holds, each starting anywhere a whole window fits, drawn with replacement (as
nanoGPT's ``get_batch`` draws them: the same text is read at every position of a window over
the run); with ``passes``, pass ``p`` starts at an offset ``o`` in [0, block_size) and takes
the windows that start at o, o + T, o + 2T, ... (T = block_size) in a permutation, so every
target position past the offset is predicted once per pass. Either is a pure function of
(seed, p), so a resumed run, or one on another number of processes at the same global batch,
reads the same windows: global batch g holds
windows [g·B·P, (g+1)·B·P) of the order, process r its r-th B of them (B the batch per
process, P the processes). With ``steps_per_round`` (``trainer.val_every_n_steps``), the
loop's epoch is a round of that many steps, and round k's batches are the global batches
k·R, k·R + 1, ... of the passes laid end to end: validation and last.pt come every R steps.

Evaluation: consecutive windows from the first token, then the tail (fewer than T tokens) as
a last, shorter batch: every token of the split predicted once, the same figure every time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch

from data.batching.batches import batch_bounds
from data.batching.order import random_windows, window_order
from utils.errors import UserError

WINDOWS = ("random", "passes")  # how training windows are drawn (module docstring)
CHUNK_TOKENS = 1 << 16  # the stream's content is hashed in chunks of this many tokens


@dataclass(frozen=True)
class TokenStream:
    """``tokens`` (int64 [N], or a memory-mapped cache's uint16 or int32) cut into windows of
    ``window`` inputs; ``round_batches``: the micro-batches of a round
    (``trainer.val_every_n_steps`` × accumulation), 0 for a pass."""

    tokens: torch.Tensor
    window: int
    round_batches: int = 0
    windows: str = "random"  # data.windows: random | passes (module docstring)
    held: ClassVar[str] = "stream"

    def __post_init__(self) -> None:
        if self.windows not in WINDOWS:
            raise UserError(f"data.windows={self.windows!r} must be one of {', '.join(WINDOWS)}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.window,)

    def __len__(self) -> int:
        """Training windows a pass holds (whatever its offset)."""
        return max((len(self.tokens) - self.window) // self.window, 0)

    @cached_property
    def hashes(self) -> torch.Tensor:
        """The content of each chunk of :data:`CHUNK_TOKENS` tokens, as int64 (what a resumed
        run's data is compared by, data/batching/fingerprint.py)."""
        data = self.tokens.numpy()  # as int64 whatever the stored width: a cached stream's too
        digests = [
            hashlib.sha256(data[lo : lo + CHUNK_TOKENS].astype(np.int64).tobytes()).digest()[:8]
            for lo in range(0, len(data), CHUNK_TOKENS)
        ]
        return torch.tensor([int.from_bytes(d, "little", signed=True) for d in digests])

    def batches(self, plan: Any, transform: Any, workers: int = 0) -> StreamBatches:
        return StreamBatches(self, plan, transform, self.round_batches)


class StreamBatches:
    """(ids [B, T], next ids [B, T]) batches of a :class:`TokenStream` (module docstring)."""

    def __init__(self, stream: TokenStream, plan: Any, transform: Any, round_batches: int = 0):
        self.stream, self.plan, self.transform = stream, plan, transform
        self.global_batch = plan.batch_size * plan.world_size
        self.per_pass = len(stream) // self.global_batch
        if plan.train and self.per_pass == 0:
            raise UserError(
                f"the train split holds {len(stream):,} windows of {stream.window} tokens, "
                f"fewer than one global batch of {self.global_batch}; lower data.batch_size "
                "or data.block_size, or give more text"
            )
        self.round_batches = round_batches if plan.train else 0
        self.span = torch.arange(stream.window + 1)
        self._order: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        if not self.plan.train:
            full = (len(self.stream.tokens) - 1) // self.stream.window
            tail = (len(self.stream.tokens) - 1) % self.stream.window
            return -(-full // self.plan.batch_size) + (1 if tail else 0)
        return self.round_batches or self.per_pass

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.plan.train:
            yield from self._in_order()
            return
        first = epoch * len(self)  # the global batch this epoch (or round) starts with
        for index in range(start, len(self)):
            data_pass, at = divmod(first + index, self.per_pass)
            starts = self._starts(data_pass)
            lo, hi = batch_bounds(at, self.plan.batch_size, self.plan.rank, self.plan.world_size)
            yield self._pairs(starts[lo:hi])

    def _starts(self, data_pass: int) -> torch.Tensor:
        if self._order is None or self._order[0] != data_pass:
            stream, seed = self.stream, self.plan.seed
            if stream.windows == "random":  # anywhere a whole window fits
                starts = len(stream.tokens) - stream.window
                order = random_windows(len(stream), starts, seed, data_pass)
            else:
                order = window_order(len(stream), stream.window, seed, data_pass)
            self._order = (data_pass, order)
        return self._order[1]

    def _pairs(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        windows = self.stream.tokens[starts.unsqueeze(1) + self.span].long()  # one gather
        device = self.transform.device
        inputs = windows[:, :-1].to(device, non_blocking=True)
        return inputs, windows[:, 1:].to(device, non_blocking=True)

    def _in_order(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        tokens, t, size = self.stream.tokens, self.stream.window, self.plan.batch_size
        full = (len(tokens) - 1) // t
        starts = torch.arange(full) * t
        for lo in range(0, full, size):
            yield self._pairs(starts[lo : lo + size])
        tail = (len(tokens) - 1) % t
        if tail:
            rest = tokens[full * t :].long()
            device = self.transform.device
            yield rest[None, :-1].to(device), rest[None, 1:].to(device)
