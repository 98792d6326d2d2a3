"""MNIST and Fashion-MNIST, read from torchvision's on-disk format (IDX files) into memory.

Files live in ``<root>/MNIST/raw/`` or ``<root>/FashionMNIST/raw/``; they are downloaded when
absent and ``download`` is true.

    python train.py data=mnist model=cnn
    python train.py data=fashion_mnist data.root=/datasets
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from data.batching.dataset import Batching, Data, Splits
from data.batching.splits import TensorSplit, holdout
from data.images.inputs import Pixels
from utils.errors import UserError

VARIANTS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}


def read_split(root: str, variant: str, train: bool, download: bool) -> TensorSplit:
    from torchvision import datasets  # imported only when an MNIST-like dataset is chosen

    cls = getattr(datasets, VARIANTS[variant])
    raw = Path(root) / VARIANTS[variant] / "raw"
    try:
        dataset = cls(root, train=train, download=False)
    except RuntimeError:
        if not download:
            raise UserError(_missing(variant, raw, cls, "data.download=false")) from None
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # torchvision prints each mirror
                dataset = cls(root, train=train, download=True)
        except Exception as error:
            raise UserError(_missing(variant, raw, cls, f"download failed: {error}")) from None
    if len(dataset.data) != len(dataset.targets):
        raise UserError(
            f"{raw}: the {'train' if train else 'test'} images file holds "
            f"{len(dataset.data)} images and its labels file {len(dataset.targets)} "
            "labels; the files are truncated or mixed: download them again"
        )
    return TensorSplit(dataset.data.unsqueeze(1).contiguous(), dataset.targets.long())


def _missing(variant: str, raw: Path, cls, why: str) -> str:
    names = ", ".join(Path(url).stem for url, _ in cls.resources)
    return f"{variant} not found in {raw} ({why}); put {names} there"


def load_mnist(
    variant: str, root: str, download: bool, val_size: int, split_seed: int, **batching
) -> Data:
    """The official test split; ``val_size`` training images held out by ``split_seed``."""
    if variant not in VARIANTS:
        raise UserError(f"data.variant={variant!r} is unknown; use one of {list(VARIANTS)}")
    train, val = holdout(read_split(root, variant, True, download), [val_size], split_seed)
    test = read_split(root, variant, False, download)
    return Data(variant, Splits(train, val, test), 10, Batching(**batching), inputs=Pixels())
