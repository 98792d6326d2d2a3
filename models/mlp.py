"""A multilayer perceptron on flattened images.

python train.py model=mlp model.hidden_sizes=[512,256] model.dropout=0.2
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from models.init import SCHEME_NAMES, initialize
from utils.config.arguments import DROPOUT, POSITIVE_INTS, checked, one_of


@checked("model", hidden_sizes=POSITIVE_INTS, dropout=DROPOUT, init=one_of(*SCHEME_NAMES))
def mlp(
    input_shape: Sequence[int],
    num_classes: int,
    hidden_sizes: Sequence[int],
    dropout: float,
    init: str,
) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return initialize(nn.Sequential(*layers), init)
