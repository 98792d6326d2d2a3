"""CIFAR-10, read from its "python version" on-disk format into memory.

Files live in ``<root>/cifar-10-batches-py/`` (``data_batch_1`` … ``data_batch_5``,
``test_batch``); the archive is downloaded when absent and ``download`` is true. The batches are
pickles, so they are read with an unpickler that can only rebuild NumPy arrays: a tampered file
cannot run code.

    python train.py data=cifar10 model=resnet18 data.batch_size=256
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from data.batching.dataset import Batching, Data, Splits
from data.batching.splits import TensorSplit, holdout
from data.images.inputs import Pixels
from utils.errors import UserError

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILES = ["test_batch"]

# What CIFAR's pickles need: NumPy arrays (written by NumPy 1 or 2) and bytes.
ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module == "numpy.core.multiarray":
            module = "numpy._core.multiarray"
        return super().find_class(module, name)


def read_pickle(path: Path):
    """A CIFAR pickle, rebuilt with nothing but NumPy arrays, lists, numbers and strings."""
    with open(path, "rb") as f:
        return _ArrayUnpickler(f, encoding="latin1").load()


def read_batch(path: Path, label_key: str = "labels") -> TensorSplit:
    """A CIFAR batch file (``label_key``: CIFAR-100's are ``fine_labels``)."""
    try:
        batch = read_pickle(path)
        data = batch.get(b"data", batch.get("data"))
        labels = batch.get(label_key.encode(), batch.get(label_key))
        images = np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32)
    except (OSError, pickle.UnpicklingError, ValueError, AttributeError, EOFError) as error:
        raise UserError(f"not a CIFAR batch file: {path} ({error})") from None
    if labels is None or len(labels) != len(images):
        count = "no" if labels is None else len(labels)
        raise UserError(
            f"not a CIFAR batch file: {path} has {len(images)} images but {count} labels"
        )
    return TensorSplit(torch.from_numpy(images.copy()), torch.as_tensor(labels, dtype=torch.long))


def read_files(folder: Path, names: list[str]) -> TensorSplit:
    parts = [read_batch(folder / name) for name in names]
    return TensorSplit(torch.cat([p.inputs for p in parts]), torch.cat([p.labels for p in parts]))


def download_archive(root: Path) -> None:
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import download_and_extract_archive

    download_and_extract_archive(
        CIFAR10.url, str(root), filename=CIFAR10.filename, md5=CIFAR10.tgz_md5
    )


def load_cifar10(root: str, download: bool, val_size: int, split_seed: int, **batching) -> Data:
    """The official test batch; ``val_size`` training images held out by ``split_seed``."""
    folder = Path(root) / FOLDER
    missing = [n for n in TRAIN_FILES + TEST_FILES if not (folder / n).is_file()]
    if missing and download:
        try:
            download_archive(Path(root))
        except Exception as error:
            raise UserError(
                f"cifar10 not found in {folder} and the download failed ({error}); "
                f"put {', '.join(TRAIN_FILES + TEST_FILES)} there"
            ) from None
    elif missing:
        raise UserError(
            f"cifar10 not found in {folder} (data.download=false); put {', '.join(missing)} there"
        )
    train, val = holdout(read_files(folder, TRAIN_FILES), [val_size], split_seed)
    test = read_files(folder, TEST_FILES)
    return Data("cifar10", Splits(train, val, test), 10, Batching(**batching), inputs=Pixels())
