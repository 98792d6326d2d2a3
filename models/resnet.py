"""torchvision's ResNet-18, fitted to the dataset's channels and classes.

``small_input_stem`` swaps the 7×7 stride-2 stem and its max-pool for one 3×3 stride-1
convolution, the usual choice for 32×32 images, which the ImageNet stem would shrink to 8×8 at
once.

    python train.py data=cifar10 model=resnet18 data.batch_size=256
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from models.init import SCHEME_NAMES, initialize
from utils.config.arguments import checked, one_of


@checked("model", small_input_stem=one_of(True, False), init=one_of(*SCHEME_NAMES))
def resnet18(
    input_shape: Sequence[int], num_classes: int, small_input_stem: bool, init: str
) -> nn.Module:
    from torchvision.models import resnet18 as torchvision_resnet18  # heavy; only when chosen

    model = torchvision_resnet18(weights=None, num_classes=num_classes)
    in_channels = input_shape[0]
    if small_input_stem:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return initialize(model, init)
