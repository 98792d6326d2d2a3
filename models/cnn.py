"""A small convolutional net for 8×8 to 32×32 images (digits, MNIST, CIFAR-10).

Each stage is conv-BN-ReLU twice, then 2×2 max-pooling while the image is larger than 4×4;
a global average pool makes the head independent of the input size.

``drop_path_rate`` above 0 is stochastic depth (as models/resnet.py's): each stage's second
conv-BN-ReLU becomes a residual branch (stochastic depth drops a branch, and needs the skip
around it), dropped per sample in training with a chance rising from 0 at the first stage to
the rate at the last, the survivors scaled by 1 / (1 − p); evaluation keeps every branch. The
weights' names stay those of the plain net.

    python train.py model=cnn data=cifar10 model.channels=[64,128,256] model.drop_path_rate=0.1
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchvision.ops import stochastic_depth

from models.init import SCHEME_NAMES, initialize
from utils.config.arguments import DROPOUT, POSITIVE_INTS, checked, one_of


def conv_bn_relu(in_channels: int, out_channels: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    ]


@checked(
    "model",
    channels=POSITIVE_INTS,
    dropout=DROPOUT,
    init=one_of(*SCHEME_NAMES),
    drop_path_rate=DROPOUT,
)
def cnn(
    input_shape: Sequence[int],
    num_classes: int,
    channels: Sequence[int],
    dropout: float,
    init: str,
    drop_path_rate: float = 0.0,
) -> nn.Sequential:
    in_channels, height, width = input_shape
    layers: list[nn.Module] = []
    branches = {}  # the index of each stage's second conv → its drop chance
    for stage, out_channels in enumerate(channels):
        layers += conv_bn_relu(in_channels, out_channels)
        branches[len(layers)] = drop_path_rate * stage / max(len(channels) - 1, 1)
        layers += conv_bn_relu(out_channels, out_channels)
        if min(height, width) > 4:  # keep at least 4×4 for the last stage on 8×8 inputs
            layers.append(nn.MaxPool2d(2))
            height, width = height // 2, width // 2
        in_channels = out_channels
    layers += pooled_head(nn.AdaptiveAvgPool2d(1), in_channels, num_classes, dropout)
    if drop_path_rate:
        return initialize(DropPathCNN(branches, *layers), init)
    return initialize(nn.Sequential(*layers), init)


class DropPathCNN(nn.Sequential):
    """The plain net's layers (and names), each stage's second conv-BN-ReLU a residual branch
    dropped per sample in training (torchvision's ``stochastic_depth``, mode ``row``)."""

    def __init__(self, branches: dict[int, float], *layers: nn.Module) -> None:
        super().__init__(*layers)
        self.branches = branches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers, index = list(self), 0
        while index < len(layers):
            if index in self.branches:
                conv, norm, relu = layers[index : index + 3]
                branch = relu(norm(conv(x)))
                x = x + stochastic_depth(branch, self.branches[index], "row", self.training)
                index += 3
            else:
                x = layers[index](x)
                index += 1
        return x


def pooled_head(
    pool: nn.Module, channels: int, num_classes: int, dropout: float
) -> list[nn.Module]:
    """Global average ``pool``, then dropout and the linear classifier (models/cnn1d.py too)."""
    return [pool, nn.Flatten(), nn.Dropout(dropout), nn.Linear(channels, num_classes)]
