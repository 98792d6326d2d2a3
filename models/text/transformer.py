"""A small pre-norm Transformer encoder with learned positions, pooled by the mean of its
tokens or its first ([CLS]) token (``model=text_transformer``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.text.layers import TextShape, held_tokens, pooled
from utils.config.arguments import DROPOUT, POSITIVE_INT, checked, one_of
from utils.errors import UserError


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
        held = held_tokens(ids, mask, self.pad_id)
        at = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(at)
        x = self.norm(self.encoder(x, src_key_padding_mask=~held))
        return self.head(pooled(x, held, self.pooling))


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
