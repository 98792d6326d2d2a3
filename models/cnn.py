"""A small convolutional net for 8×8 to 32×32 images (digits, MNIST, CIFAR-10).

Each stage is conv-BN-ReLU twice, then 2×2 max-pooling while the image is larger than 4×4;
a global average pool makes the head independent of the input size.

    python train.py model=cnn data=cifar10 model.channels=[64,128,256]
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from models.init import SCHEME_NAMES, initialize
from utils.config.arguments import DROPOUT, POSITIVE_INTS, checked, one_of


def conv_bn_relu(in_channels: int, out_channels: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    ]


@checked("model", channels=POSITIVE_INTS, dropout=DROPOUT, init=one_of(*SCHEME_NAMES))
def cnn(
    input_shape: Sequence[int],
    num_classes: int,
    channels: Sequence[int],
    dropout: float,
    init: str,
) -> nn.Sequential:
    in_channels, height, width = input_shape
    layers: list[nn.Module] = []
    for out_channels in channels:
        layers += conv_bn_relu(in_channels, out_channels) + conv_bn_relu(out_channels, out_channels)
        if min(height, width) > 4:  # keep at least 4×4 for the last stage on 8×8 inputs
            layers.append(nn.MaxPool2d(2))
            height, width = height // 2, width // 2
        in_channels = out_channels
    layers += pooled_head(nn.AdaptiveAvgPool2d(1), in_channels, num_classes, dropout)
    return initialize(nn.Sequential(*layers), init)


def pooled_head(
    pool: nn.Module, channels: int, num_classes: int, dropout: float
) -> list[nn.Module]:
    """Global average ``pool``, then dropout and the linear classifier (models/cnn1d.py too)."""
    return [pool, nn.Flatten(), nn.Dropout(dropout), nn.Linear(channels, num_classes)]
