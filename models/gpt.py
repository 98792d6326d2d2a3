"""A GPT (``model=gpt``): a decoder-only Transformer that predicts each next token.

Token and position embeddings, ``n_layer`` pre-norm blocks of causal self-attention (through
``scaled_dot_product_attention``, so the fused kernels run where the device has them) and an
MLP, a final LayerNorm and a head that shares the token embedding's weights. Initialised as
GPT-2 was: normal(0, 0.02) everywhere, the residual projections scaled by 1/√(2·n_layer).
Each :class:`Block` is the unit ``trainer.compile``, ``trainer.activation_checkpointing`` and
FSDP2's sharding act on (``repeated_blocks``).

Inputs: token ids [B, T] with T ≤ ``block_size``. Outputs: logits [B, T, vocab_size].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from utils.errors import UserError


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.proj.residual = True  # scaled at initialisation (GPT-2)
        self.n_head, self.dropout = n_head, dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KeyValues | None = None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        causal = True
        if cache is not None:  # sampling: the keys and values of the tokens before these
            k, v = cache.extended(self, k, v)
            causal = t > 1  # one new token attends to everything before it
            if causal and k.shape[2] != t:
                raise AssertionError("a cache is filled by the whole prompt at once")
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.proj.residual = True
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """One pre-norm Transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor, cache: KeyValues | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class KeyValues:
    """Each layer's keys and values of the tokens seen so far, for sampling one token at a time
    (a step then costs one token's attention, not the whole context's)."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def extended(self, layer: nn.Module, k: torch.Tensor, v: torch.Tensor) -> tuple:
        key = id(layer)
        if key in self.held:
            old_k, old_v = self.held[key]
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.held[key] = (k, v)
        return k, v

    @property
    def length(self) -> int:
        return next(iter(self.held.values()))[0].shape[2] if self.held else 0


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        dropout: float,
        bias: bool,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)  # first: utils/model/checks.py takes_ids
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied: one matrix reads and writes tokens
        self.apply(self._initialise)
        residual_std = 0.02 / math.sqrt(2 * n_layer)
        for module in self.modules():
            if getattr(module, "residual", False):
                nn.init.normal_(module.weight, mean=0.0, std=residual_std)

    @staticmethod
    def _initialise(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def new_cache(self) -> KeyValues:
        """An empty key-value cache for sampling (utils/evaluation/sampling.py)."""
        return KeyValues()

    def repeated_blocks(self) -> list[nn.Module]:
        """The units compiled, recomputed in the backward and sharded one by one."""
        return list(self.blocks)

    def forward(self, ids: torch.Tensor, cache: KeyValues | None = None) -> torch.Tensor:
        start = cache.length if cache is not None else 0
        t = ids.shape[1]
        positions = torch.arange(start, start + t, device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(positions))
        for block in self.blocks:
            x = block(x, cache)
        return self.head(self.ln_f(x))


def gpt(
    input_shape: Sequence[int],
    num_classes: int,
    n_layer: int,
    n_head: int,
    n_embd: int,
    block_size: int,
    dropout: float,
    bias: bool,
) -> GPT:
    """conf/model/gpt.yaml. ``num_classes``: the tokenizer's vocabulary; ``input_shape``:
    [the data's window], which must fit ``block_size`` positions."""
    if n_embd % n_head:
        raise UserError(
            f"model.n_embd={n_embd} is not a multiple of model.n_head={n_head}: each head "
            "takes an equal share of the width; choose n_embd = n_head × head width"
        )
    window = int(input_shape[-1])
    if window > block_size:
        raise UserError(
            f"the data's windows hold {window} tokens, more than model.block_size="
            f"{block_size} positions; set data.block_size ≤ {block_size} or raise model.block_size"
        )
    return GPT(num_classes, block_size, n_layer, n_head, n_embd, dropout, bias)
