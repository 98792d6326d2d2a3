"""A small 1-D conv net for sequences: sensor traces, time series, audio features.

Inputs are [C, L] (C channels of L time steps), from ``data=tensors`` (``x`` of shape
[N, C, L]) or a table of ``data=csv`` whose features are one sequence's time steps in order
([L]: one channel). Each stage is conv-BN-ReLU twice, then 2× max-pooling while the sequence
is longer than 4 steps; a global average pool makes the head independent of the length.

    python train.py data=tensors data.path=traces.npz model=cnn1d
    python train.py data=tensors data.path=traces.npz model=cnn1d model.channels=[64,128] model.kernel_size=7
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from models.cnn import pooled_head
from models.init import SCHEME_NAMES, initialize
from utils.config.arguments import DROPOUT, POSITIVE_INTS, checked, one_of
from utils.errors import UserError


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int) -> list[nn.Module]:
    return [
        nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
        nn.BatchNorm1d(out_channels),
        nn.ReLU(inplace=True),
    ]


class OneChannel(nn.Module):
    """[N, L] → [N, 1, L]: a table's row of time steps as one channel."""

    def forward(self, x):
        return x.unsqueeze(1)


@checked(
    "model",
    channels=POSITIVE_INTS,
    dropout=DROPOUT,
    init=one_of(*SCHEME_NAMES),
    kernel_size=one_of(3, 5, 7, 9),
)
def cnn1d(
    input_shape: Sequence[int],
    num_classes: int,
    channels: Sequence[int],
    kernel_size: int,
    dropout: float,
    init: str,
) -> nn.Sequential:
    if len(input_shape) not in (1, 2):
        raise UserError(
            f"model=cnn1d takes sequences [C, L] (or a table's row [L]), and the "
            f"data gives {list(input_shape)}; use model=cnn for images, or save "
            "x as [N, C, L]"
        )
    layers: list[nn.Module] = [OneChannel()] if len(input_shape) == 1 else []
    in_channels, length = (1, input_shape[0]) if len(input_shape) == 1 else input_shape
    for out_channels in channels:
        layers += conv_bn_relu(in_channels, out_channels, kernel_size)
        layers += conv_bn_relu(out_channels, out_channels, kernel_size)
        if length > 4:
            layers.append(nn.MaxPool1d(2))
            length //= 2
        in_channels = out_channels
    layers += pooled_head(nn.AdaptiveAvgPool1d(1), in_channels, num_classes, dropout)
    return initialize(nn.Sequential(*layers), init)
