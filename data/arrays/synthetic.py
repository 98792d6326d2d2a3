"""Seeded synthetic images, for benchmarks and tests: any shape, any number of classes.

Each class has a random prototype image; a sample is its class's prototype plus noise, so
models can learn it and the loss falls, unlike pure noise.

    python train.py data=synthetic data.num_samples=20000 data.shape=[1,28,28] data.num_classes=10
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from data.batching.dataset import Batching, Data, Splits
from data.batching.splits import TensorSplit, holdout
from data.images.inputs import Pixels
from utils.errors import UserError
from utils.system.memory import check_fits


def make_samples(
    num_samples: int, shape: Sequence[int], num_classes: int, noise: float, seed: int
) -> TensorSplit:
    generator = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(num_classes, *shape, generator=generator) * 255
    labels = torch.randint(0, num_classes, (num_samples,), generator=generator)
    images = prototypes[labels] + noise * 255 * torch.randn(
        num_samples, *shape, generator=generator
    )
    return TensorSplit(images.clamp_(0, 255).round_().to(torch.uint8), labels)


def load_synthetic(
    num_samples: int, shape: Sequence[int], num_classes: int, noise: float, seed: int, **options
) -> Data:
    """conf/data/synthetic.yaml: ``num_samples`` training samples of ``shape``, plus
    ``options["val_size"]`` and ``options["test_size"]`` held out; the other ``options`` are
    the batching keys (data/batching/dataset.py Batching)."""
    val_size, test_size = options.pop("val_size"), options.pop("test_size")
    if len(shape) != 3 or min(shape) < 1:
        raise UserError(f"data.shape={list(shape)} must be [channels, height, width]")
    if num_classes < 2:
        raise UserError(f"data.num_classes={num_classes} must be 2 or more")
    total = num_samples + val_size + test_size
    # float32 prototypes and noise, then the uint8 images: 9 bytes a pixel while they are made
    check_fits(
        9 * (total + num_classes) * math.prod(shape),
        f"data.num_samples={num_samples} of shape {list(shape)}",
        "lower data.num_samples, val_size, test_size or data.shape",
    )
    samples = make_samples(total, shape, num_classes, noise, seed)
    train, val, test = holdout(samples, [val_size, test_size], seed)
    splits = Splits(train, val, test)
    return Data("synthetic", splits, num_classes, Batching(**options), inputs=Pixels())
