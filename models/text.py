"""Models for texts (``data=text``): each takes token ids [N, L] (padded on the right with the
tokenizer's ``pad_id``) and, optionally, their mask [N, L] (1 for a token); without a mask it is
read from the ids.

- :func:`text_bag` (fastText-style, Joulin et al. 2017): the mean of the texts' token
  embeddings and of hashed bigram embeddings, then one hidden layer. Fast, and strong on
  sentence-length sets of a few thousand texts; what ``model=auto`` picks for text.
- :func:`text_transformer` (``model=text_transformer``): a small pre-norm Transformer encoder
  with learned positions, pooled by the mean of its tokens or its first ([CLS]) token.

    python train.py data=text data.path=reviews.csv model=text_transformer model.layers=4
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from utils.config.arguments import DROPOUT, NON_NEGATIVE_INT, POSITIVE_INT, checked, one_of
from utils.errors import UserError

BIGRAM_PRIME = 1_000_003  # a bigram (a, b) is hashed to (a · prime + b) mod buckets
# The bag's parameters are stored ÷5 and read ×5: under Adam, whose steps are about the LR
# whatever the gradient's size, the bag then trains as at 5× optim.lr (0.01 at the default
# 0.002), the rate a bag of embeddings wants (1,122 debate statements: 65.3% test accuracy at
# 0.002, 70.0% at 0.01; benchmarks/text_figures.py) while optim stays the one every model shares.
LR_SCALE = 5.0


class ScaledLinear(nn.Linear):
    """``nn.Linear`` read ×:data:`LR_SCALE` and initialised ÷ it: the same function at the
    start, trained as at that times the LR."""

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.weight.div_(LR_SCALE)
            if self.bias is not None:
                self.bias.div_(LR_SCALE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * LR_SCALE


@dataclass(frozen=True)
class TextShape:
    """What a text model takes from the data: the tokenizer's ``vocab_size`` and ``pad_id``,
    texts of at most ``max_length`` tokens, and ``outputs`` columns."""

    vocab_size: int
    pad_id: int
    max_length: int
    outputs: int

    @classmethod
    def of(cls, input_shape, num_classes, vocab_size, pad_id, name: str) -> TextShape:
        if vocab_size is None or len(input_shape) != 1:
            raise UserError(
                f"model={name} takes texts (data=text: token ids [L]), and the data gives "
                f"samples of shape {list(input_shape)}; use data=text, or another model"
            )
        return cls(vocab_size, pad_id or 0, input_shape[0], num_classes)


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
        held = (ids != self.pad_id) if mask is None else mask.bool()
        weight = held.unsqueeze(-1).to(self.tokens.weight.dtype)
        summed = (self.tokens(ids) * weight).sum(1)
        count = weight.sum(1)
        if self.bigrams is not None and ids.shape[1] > 1:
            pairs = (ids[:, :-1] * BIGRAM_PRIME + ids[:, 1:]) % self.buckets
            both = weight[:, :-1] * weight[:, 1:]
            summed = summed + (self.bigrams(pairs) * both).sum(1)
            count = count + both.sum(1)
        return self.head(summed / count.clamp(min=1) * LR_SCALE)


class TextTransformer(nn.Module):
    """Token and position embeddings → ``layers`` pre-norm encoder layers → a pooled vector →
    the outputs. Padding is masked out of attention and of the mean."""

    def __init__(
        self, shape: TextShape, width: int, layers: int, heads: int, dropout: float, pooling: str
    ) -> None:
        super().__init__()
        if width % heads:
            raise UserError(f"model.width={width} must be a multiple of model.heads={heads}")
        self.pad_id, self.pooling = shape.pad_id, pooling
        self.tokens = nn.Embedding(shape.vocab_size, width)
        self.positions = nn.Embedding(shape.max_length, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(width, shape.outputs))
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        held = (ids != self.pad_id) if mask is None else mask.bool()
        at = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(at)
        x = self.norm(self.encoder(x, src_key_padding_mask=~held))
        if self.pooling == "cls":
            pooled = x[:, 0]
        else:
            weight = held.unsqueeze(-1).to(x.dtype)
            pooled = (x * weight).sum(1) / weight.sum(1).clamp(min=1)
        return self.head(pooled)


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


@checked(
    "model",
    width=POSITIVE_INT,
    layers=POSITIVE_INT,
    heads=POSITIVE_INT,
    dropout=DROPOUT,
    pooling=one_of("mean", "cls"),
)
def text_transformer(
    input_shape: Sequence[int],
    num_classes: int,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    width: int = 256,
    layers: int = 4,
    heads: int = 4,
    dropout: float = 0.1,
    pooling: str = "mean",
) -> TextTransformer:
    """conf/model/text_transformer.yaml."""
    shape = TextShape.of(input_shape, num_classes, vocab_size, pad_id, "text_transformer")
    return TextTransformer(shape, width, layers, heads, dropout, pooling)
