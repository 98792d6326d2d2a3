"""What the text models share: the token mask read from the ids, pooling over tokens, the
shape every builder takes, and linear layers trained at a scaled rate."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

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


def held_tokens(ids: torch.Tensor, mask: torch.Tensor | None, pad_id: int) -> torch.Tensor:
    """Where the texts' tokens are (bool [N, L]): the mask given, or the ids that do not pad."""
    return (ids != pad_id) if mask is None else mask.bool()


def pooled(hidden: torch.Tensor, held: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per text from its tokens' [N, L, D]: the first token's (``cls``), or the mean
    of the held tokens (``mean``)."""
    if pooling == "cls":
        return hidden[:, 0]
    weight = held.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weight).sum(1) / weight.sum(1).clamp(min=1)
