"""The network of PyTorch's examples/mnist/main.py, as a newcomer copies it: a plain
``nn.Module`` whose ``__init__`` takes no arguments and whose forward ends in log_softmax."""

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def three_outputs() -> nn.Module:
    """A builder function whose model gives 3 scores, whatever the dataset has."""
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(3))


def linear(input_shape, num_outputs) -> nn.Module:
    """A builder written for any task: it names the output width ``num_outputs``."""
    import math

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_outputs))
