"""torchvision's classification datasets, read from their own on-disk formats and held in
memory like MNIST (``data=torchvision``).

    python train.py data=torchvision data.name=cifar100 model=resnet18
    python train.py data=torchvision data.name=kmnist model=cnn
    python train.py data=torchvision data.name=emnist_balanced model=cnn
    python train.py data=torchvision data.name=svhn        # pip install -e ".[svhn]" (scipy)

Each is read where torchvision keeps it under ``data.root`` and downloaded when absent and
``data.download`` is true:

- ``kmnist``, ``emnist_<split>`` (byclass, bymerge, balanced, letters, digits, mnist): IDX files
  in ``<root>/KMNIST/raw/`` and ``<root>/EMNIST/raw/``, parsed by torchvision's IDX reader
  (no pickle). EMNIST's images are stored transposed; they are turned upright here.
- ``cifar100``: ``<root>/cifar-100-python/{train,test,meta}``, pickles read with the same
  arrays-only unpickler as CIFAR-10 (data/images/cifar10.py), so a tampered file cannot run code; the
  100 fine labels and their names.
- ``svhn``: ``<root>/{train,test}_32x32.mat``, read by scipy (the ``svhn`` extra); label 10 is
  digit 0, as torchvision maps it.

The official test split is the test split; ``val_size`` training images are held out by
``split_seed``. ``mean: null`` and ``std: null`` (the default) normalise with the train split's
statistics, per channel. Class names are kept (in checkpoints too).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import torch

from data.batching.dataset import Batching, Data, Splits
from data.batching.splits import TensorSplit, channel_statistics, holdout
from data.images.cifar10 import read_batch, read_pickle
from data.images.inputs import Pixels
from utils.errors import UserError

EMNIST_SPLITS = ("byclass", "bymerge", "balanced", "letters", "digits", "mnist")
NAMES = ("cifar100", "kmnist", *(f"emnist_{s}" for s in EMNIST_SPLITS), "svhn")


def load_torchvision(
    name: str, root: str, download: bool, val_size: int, split_seed: int, **batching
) -> Data:
    """conf/data/torchvision.yaml."""
    readers = {"cifar100": read_cifar100, "svhn": read_svhn}
    if name not in NAMES:
        raise UserError(f"data.name={name!r} is not one of {', '.join(NAMES)}")
    read = readers.get(name, read_idx)
    (train, classes), (test, _) = (
        read(name, Path(root), split, download) for split in ("train", "test")
    )
    train, val = holdout(train, [val_size], split_seed)
    if batching["mean"] is None or batching["std"] is None:
        batching["mean"], batching["std"] = channel_statistics(train.inputs)
    splits = Splits(train, val, test)
    return Data(name, splits, len(classes), Batching(**batching), classes, inputs=Pixels())


def read_idx(name: str, root: Path, split: str, download: bool) -> tuple[TensorSplit, list[str]]:
    from torchvision import datasets

    cls, options = (
        (datasets.KMNIST, {})
        if name == "kmnist"
        else (datasets.EMNIST, {"split": name.removeprefix("emnist_")})
    )
    raw = root / cls.__name__ / "raw"
    try:
        dataset = cls(str(root), train=split == "train", download=False, **options)
    except RuntimeError:
        if not download:
            raise UserError(
                f"{name} not found in {raw} (data.download=false); put its "
                "IDX files there or pass data.download=true"
            ) from None
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                dataset = cls(str(root), train=split == "train", download=True, **options)
        except Exception as error:
            raise UserError(
                f"{name} not found in {raw} and the download failed ({error}); "
                "put its IDX files there"
            ) from None
    images = dataset.data
    if cls is datasets.EMNIST:
        images = images.transpose(1, 2)  # stored column by column
    return TensorSplit(images.unsqueeze(1).contiguous(), dataset.targets.long()), list(
        dataset.classes
    )


def read_cifar100(
    name: str, root: Path, split: str, download: bool
) -> tuple[TensorSplit, list[str]]:
    from torchvision.datasets import CIFAR100

    folder = root / CIFAR100.base_folder
    needed = ["train", "test", "meta"]
    missing = [n for n in needed if not (folder / n).is_file()]
    if missing and download:
        from torchvision.datasets.utils import download_and_extract_archive

        try:
            download_and_extract_archive(
                CIFAR100.url, str(root), filename=CIFAR100.filename, md5=CIFAR100.tgz_md5
            )
        except Exception as error:
            raise UserError(
                f"cifar100 not found in {folder} and the download failed "
                f"({error}); put {', '.join(needed)} there"
            ) from None
    elif missing:
        raise UserError(
            f"cifar100 not found in {folder} (data.download=false); put {', '.join(missing)} there"
        )
    try:
        meta = read_pickle(folder / "meta")
        names = meta.get("fine_label_names", meta.get(b"fine_label_names"))
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    except Exception:
        raise UserError(f"not a CIFAR-100 meta file: {folder / 'meta'}") from None
    return read_batch(folder / split, label_key="fine_labels"), classes


def read_svhn(name: str, root: Path, split: str, download: bool) -> tuple[TensorSplit, list[str]]:
    try:
        from scipy.io import loadmat
    except ImportError:
        raise UserError('data.name=svhn needs the extra: pip install -e ".[svhn]"') from None
    path = root / f"{split}_32x32.mat"
    if not path.is_file() and download:
        from torchvision.datasets import SVHN

        try:
            with contextlib.redirect_stdout(io.StringIO()):
                SVHN(str(root), split=split, download=True)
        except Exception as error:
            raise UserError(f"svhn not found at {path} and the download failed ({error})") from None
    if not path.is_file():
        raise UserError(f"svhn not found at {path} (data.download=false); put it there")
    try:
        mat = loadmat(str(path))
        images = np.ascontiguousarray(np.transpose(mat["X"], (3, 2, 0, 1)), dtype=np.uint8)
        labels = mat["y"].astype(np.int64).reshape(-1)
    except Exception:
        raise UserError(f"not an SVHN .mat file: {path}") from None
    labels[labels == 10] = 0
    if len(labels) != len(images):
        raise UserError(f"{path}: {len(images)} images but {len(labels)} labels")
    return TensorSplit(torch.from_numpy(images), torch.from_numpy(labels)), [
        str(d) for d in range(10)
    ]
