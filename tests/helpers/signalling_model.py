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


def mlp(input_shape, num_classes, hidden_sizes, dropout) -> nn.Module:
    return SignalAt(plain_mlp(input_shape, num_classes, hidden_sizes, dropout))


class CrashOnTraining(nn.Module):
    """Raises on its first training step: a bug inside a job, not bad input."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            raise RuntimeError("deliberate failure in forward")
        return self.inner(x)


def crashing_mlp(input_shape, num_classes, hidden_sizes, dropout) -> nn.Module:
    return CrashOnTraining(plain_mlp(input_shape, num_classes, hidden_sizes, dropout))
