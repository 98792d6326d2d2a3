"""Test-only models. One sends a real signal to its own process at an exact training micro-batch, so
tests can interrupt ``train.py`` at a chosen point (an epoch boundary, mid-epoch, between
micro-batches of gradient accumulation) without racing the clock.

    SIGNAL_AT_FORWARD=7 SIGNAL_NAME=SIGINT python train.py model._target_=signalling_model.mlp
"""

from __future__ import annotations

import os
import signal

import torch
from torch import nn

from models.mlp import mlp as plain_mlp


class SignalAt(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.batch_members = getattr(inner, "batch_members", 1)  # the batches it trains on
        self.calls = 0
        self.at = int(os.environ.get("SIGNAL_AT_FORWARD", "0"))
        self.signum = getattr(signal, os.environ.get("SIGNAL_NAME", "SIGTERM"))
        self.repeat = int(os.environ.get("SIGNAL_REPEAT", "1"))  # 2: a second Ctrl-C
        # SIGNAL_TARGET=parent: rank 0 signals its launcher (torchrun), which passes it on.
        self.target = os.getppid if os.environ.get("SIGNAL_TARGET") == "parent" else os.getpid
        if os.environ.get("RANK", "0") != "0":
            self.at = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                for _ in range(self.repeat):
                    os.kill(self.target(), self.signum)
        return self.inner(x)


def mlp(input_shape, num_classes, hidden_sizes, dropout, init) -> nn.Module:
    return SignalAt(plain_mlp(input_shape, num_classes, hidden_sizes, dropout, init))


def auto(
    input_shape,
    num_classes,
    hidden_sizes,
    channels,
    kernel_size,
    dropout,
    table,
    embed_indicators,
    feature_quantiles,
    indicator_features,
    share_batches,
) -> nn.Module:
    """model=auto's choice (a table's: models/tabular/), signalling."""
    from models.auto import auto as plain_auto

    keys = (hidden_sizes, channels, kernel_size, dropout, table, feature_quantiles)
    fitted = {"embed_indicators": embed_indicators, "indicator_features": indicator_features}
    fitted["share_batches"] = share_batches
    return SignalAt(plain_auto(input_shape, num_classes, *keys, **fitted))


def timm_model(input_shape, num_classes, name, pretrained, drop_rate, drop_path_rate) -> nn.Module:
    from models.timm_models import timm_model as plain_timm

    inner = plain_timm(input_shape, num_classes, name, pretrained, drop_rate, drop_path_rate)
    return SignalAt(inner)


class CrashOnTraining(nn.Module):
    """Raises on its first training step: a bug inside a job, not bad input."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            raise RuntimeError("deliberate failure in forward")
        return self.inner(x)


def crashing_mlp(input_shape, num_classes, hidden_sizes, dropout, init) -> nn.Module:
    return CrashOnTraining(plain_mlp(input_shape, num_classes, hidden_sizes, dropout, init))


class Faulty(nn.Module):
    """Injects a fault into training forward number FAULT_AT (counting from 1): FAULT=nan makes
    that loss NaN, FAULT=nan_from makes every loss from there on NaN, FAULT=oom raises the
    error CUDA raises when memory runs out; FAULT=oom_above raises it for every batch larger
    than FAULT_AT samples (a simulated memory limit)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.batch_members = getattr(inner, "batch_members", 1)  # the batches it trains on
        self.calls = 0
        self.at = int(os.environ.get("FAULT_AT", "0"))
        self.fault = os.environ.get("FAULT", "nan")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fault == "oom_above" and len(x) > self.at:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated): batch of {len(x)}")
        out = self.inner(x)
        if self.fault == "oom_above" or not (self.training and torch.is_grad_enabled()):
            return out
        self.calls += 1
        hit = self.calls == self.at or (self.fault == "nan_from" and self.calls >= self.at > 0)
        if hit and self.fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return out * float("nan") if hit else out


def faulty_mlp(input_shape, num_classes, hidden_sizes, dropout, init) -> nn.Module:
    return Faulty(plain_mlp(input_shape, num_classes, hidden_sizes, dropout, init))


class ForgotSuperInit(nn.Module):
    """The classic slip: layers assigned before ``super().__init__()``."""

    def __init__(self, input_shape, num_classes) -> None:
        self.layer = nn.Linear(int(torch.tensor(input_shape).prod()), num_classes)
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.flatten(1))


def forgot_super_init(input_shape, num_classes, hidden_sizes, dropout, init) -> nn.Module:
    return ForgotSuperInit(input_shape, num_classes)


def constant(input_shape, num_classes, hidden_sizes, dropout, init) -> nn.Module:
    """A model whose output ignores its input: it cannot fit anything beyond the label mix."""
    return Constant(num_classes)


class Constant(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(len(x), -1)


def fixed_input(input_shape, num_classes, hidden_sizes, dropout, init) -> nn.Module:
    """A model written for 28×28 images only, whatever the data says."""
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, num_classes))


class DropoutProbe(nn.Module):
    """Saves the first dropout mask its training forward draws (from the global RNG, as every
    dropout layer does) to ``mask-rank<RANK>.pt`` in the working directory."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.saved = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not self.saved:
            mask = nn.functional.dropout(torch.ones(256), 0.5, training=True)
            torch.save(mask, f"mask-rank{os.environ.get('RANK', '0')}.pt")
            self.saved = True
        return self.inner(x)


def dropout_probe(input_shape, num_classes, hidden_sizes, dropout, init) -> nn.Module:
    return DropoutProbe(plain_mlp(input_shape, num_classes, hidden_sizes, dropout, init))


def cnn(input_shape, num_classes, channels, dropout, init, drop_path_rate=0.0) -> nn.Module:
    from models.cnn import cnn as plain_cnn

    return SignalAt(plain_cnn(input_shape, num_classes, channels, dropout, init, drop_path_rate))


def cnn1d(input_shape, num_classes, channels, kernel_size, dropout, init) -> nn.Module:
    from models.cnn1d import cnn1d as plain_cnn1d

    return SignalAt(plain_cnn1d(input_shape, num_classes, channels, kernel_size, dropout, init))


def text_bag(input_shape, num_classes, vocab_size, pad_id, dim, hidden, dropout, bigram_buckets):
    """model=text_bag (models/text/), signalling."""
    from models.text import text_bag as plain_text_bag

    keys = (dim, hidden, dropout, bigram_buckets)
    return SignalAt(plain_text_bag(input_shape, num_classes, vocab_size, pad_id, *keys))


def hf_model(
    input_shape, num_classes, path, architecture, tokenizer, vocab_size, pad_id, pooling, dropout
) -> nn.Module:
    """model=hf (models/text/), signalling."""
    from models.text import hf_model as plain_hf

    keys = (path, architecture, tokenizer, vocab_size, pad_id, pooling, dropout)
    return SignalAt(plain_hf(input_shape, num_classes, *keys))


def gpt(input_shape, num_classes, n_layer, n_head, n_embd, block_size, dropout, bias):
    """model=gpt (models/gpt.py), signalling."""
    from models.gpt import gpt as plain_gpt

    keys = (n_layer, n_head, n_embd, block_size, dropout, bias)
    return SignalAt(plain_gpt(input_shape, num_classes, *keys))
