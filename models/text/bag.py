"""The bag of tokens (fastText-style, Joulin et al. 2017; ``model=text_bag``): the mean of the
texts' token embeddings and of hashed bigram embeddings, then one hidden layer. Fast, and
strong on sentence-length sets of a few thousand texts; what ``model=auto`` picks for text."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.text.layers import BIGRAM_PRIME, LR_SCALE, ScaledLinear, TextShape, held_tokens
from utils.config.arguments import DROPOUT, NON_NEGATIVE_INT, POSITIVE_INT, checked
from utils.errors import UserError


class TextBag(nn.Module):
    """Mean token and hashed-bigram embeddings → dropout → a hidden layer (none: ``hidden``
    0, a linear model of the embeddings) → the outputs."""

    def __init__(
        self, shape: TextShape, dim: int, hidden: int, dropout: float, buckets: int
    ) -> None:
        super().__init__()
        self.pad_id, self.buckets = shape.pad_id, buckets
        self.tokens = nn.Embedding(shape.vocab_size, dim)
        self.bigrams = nn.Embedding(buckets, dim) if buckets else None
        for table in filter(None, (self.tokens, self.bigrams)):  # N(0, 1) ÷ LR_SCALE
            nn.init.normal_(table.weight, std=1 / LR_SCALE)
        layers = [ScaledLinear(dim, hidden), nn.GELU(), nn.Dropout(dropout)] if hidden else []
        last = ScaledLinear(hidden or dim, shape.outputs)
        self.head = nn.Sequential(nn.Dropout(dropout), *layers, last)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        held = held_tokens(ids, mask, self.pad_id)
        weight = held.unsqueeze(-1).to(self.tokens.weight.dtype)
        summed = (self.tokens(ids) * weight).sum(1)
        count = weight.sum(1)
        if self.bigrams is not None and ids.shape[1] > 1:
            pairs = (ids[:, :-1] * BIGRAM_PRIME + ids[:, 1:]) % self.buckets
            both = weight[:, :-1] * weight[:, 1:]
            summed = summed + (self.bigrams(pairs) * both).sum(1)
            count = count + both.sum(1)
        return self.head(summed / count.clamp(min=1) * LR_SCALE)


@checked("model", dim=POSITIVE_INT, hidden=NON_NEGATIVE_INT, dropout=DROPOUT)
def text_bag(
    input_shape: Sequence[int],
    num_classes: int,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    dim: int = 128,
    hidden: int = 0,
    dropout: float = 0.5,
    bigram_buckets: int = 0,
) -> TextBag:
    """conf/model/text_bag.yaml."""
    shape = TextShape.of(input_shape, num_classes, vocab_size, pad_id, "text_bag")
    if not (isinstance(bigram_buckets, int) and 0 <= bigram_buckets <= 2**22):
        raise UserError(f"model.bigram_buckets={bigram_buckets!r} must be 0 (off) to 4,194,304")
    return TextBag(shape, dim, hidden, dropout, bigram_buckets)
