"""torchvision's ResNet-18, fitted to the dataset's channels and classes.

``drop_path_rate`` is stochastic depth (Huang et al. 2016, as timm's ResNets use it): in
training, each residual block's branch is dropped for a sample with a chance rising linearly
from 0 at the first block to ``drop_path_rate`` at the last (the survivors scaled by
1 / (1 − p)); evaluation keeps every branch. The weights' names stay torchvision's.

``small_input_stem`` swaps the 7×7 stride-2 stem and its max-pool for one 3×3 stride-1
convolution, the usual choice for 32×32 images, which the ImageNet stem would shrink to 8×8 at
once.

    python train.py data=cifar10 model=resnet18 data.batch_size=256
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock
from torchvision.ops import stochastic_depth

from models.init import SCHEME_NAMES, initialize
from utils.config.arguments import DROPOUT, checked, one_of


@checked(
    "model",
    small_input_stem=one_of(True, False),
    init=one_of(*SCHEME_NAMES),
    drop_path_rate=DROPOUT,
)
def resnet18(
    input_shape: Sequence[int],
    num_classes: int,
    small_input_stem: bool,
    init: str,
    drop_path_rate: float = 0.0,
) -> nn.Module:
    from torchvision.models import resnet18 as torchvision_resnet18  # heavy; only when chosen

    model = torchvision_resnet18(weights=None, num_classes=num_classes)
    in_channels = input_shape[0]
    if small_input_stem:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if drop_path_rate:
        blocks = [m for m in model.modules() if isinstance(m, BasicBlock)]
        for index, block in enumerate(blocks):
            block.__class__ = DropPathBlock  # the same weights and names, another forward
            block.drop_path = drop_path_rate * index / max(len(blocks) - 1, 1)
    return initialize(model, init)


class DropPathBlock(BasicBlock):
    """torchvision's BasicBlock whose residual branch is dropped per sample in training with
    chance ``drop_path`` (torchvision's ``stochastic_depth``, mode ``row``)."""

    drop_path: float = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.downsample(x) if self.downsample is not None else x
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        out = stochastic_depth(out, self.drop_path, "row", self.training)
        return self.relu(out + identity)
