"""Dataset loaders on small files in the real on-disk formats, and the batching they feed."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest
import torch
from conftest import write_cifar10, write_imagefolder, write_mnist

from data.arrays.synthetic import load_synthetic
from data.augmentation.images import Draws
from data.batching.batches import Placement, random_crop
from data.batching.splits import TensorSplit
from data.images.cifar10 import load_cifar10
from data.images.digits import load_digits
from data.images.imagefolder import load_imagefolder
from data.images.inputs import Pixels
from data.images.mnist import load_mnist
from utils.errors import UserError

BATCHING = dict(
    batch_size=8,
    eval_batch_size=16,
    mean=[0.5],
    std=[0.25],
    augment={"crop_padding": 0, "horizontal_flip": False},
)
RGB = {**BATCHING, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
CPU = torch.device("cpu")


def test_digits_has_a_fixed_train_val_test_split():
    first = load_digits(None, val_size=180, test_size=360, split_seed=0, **BATCHING)
    again = load_digits(None, val_size=180, test_size=360, split_seed=0, **BATCHING)
    assert first.sizes() == {"train": 1257, "val": 180, "test": 360}
    assert first.input_shape == (1, 8, 8) and first.num_classes == 10
    for split in ("train", "val", "test"):
        assert torch.equal(first.splits[split].inputs, again.splits[split].inputs)
    # 17 grey levels 0..16 spread over the uint8 range, all classes present in every split.
    assert first.splits["train"].inputs.max() == 255
    assert set(first.splits["test"].labels.tolist()) == set(range(10))


def test_mnist_reads_idx_files(tmp_path):
    write_mnist(tmp_path, "MNIST", train=40, test=12)
    data = load_mnist("mnist", str(tmp_path), False, val_size=10, split_seed=0, **BATCHING)
    assert data.sizes() == {"train": 30, "val": 10, "test": 12}
    assert data.input_shape == (1, 28, 28)
    assert data.splits["train"].inputs.dtype == torch.uint8


def test_fashion_mnist_reads_its_own_folder(tmp_path):
    write_mnist(tmp_path, "FashionMNIST", train=20, test=10)
    data = load_mnist("fashion_mnist", str(tmp_path), False, val_size=5, split_seed=0, **BATCHING)
    assert data.sizes()["test"] == 10


def test_missing_mnist_names_the_folder_and_files(tmp_path):
    with pytest.raises(UserError, match=r"MNIST/raw.*train-images-idx3-ubyte"):
        load_mnist("mnist", str(tmp_path), False, val_size=5, split_seed=0, **BATCHING)


def test_failed_download_says_where_to_put_the_files(tmp_path, monkeypatch):
    from torchvision.datasets import MNIST

    def offline(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(MNIST, "download", offline)
    with pytest.raises(UserError, match=r"download failed.*put train-images-idx3-ubyte"):
        load_mnist("mnist", str(tmp_path), True, val_size=5, split_seed=0, **BATCHING)


def test_cifar10_reads_pickled_batches(tmp_path):
    write_cifar10(tmp_path, per_batch=10)
    data = load_cifar10(str(tmp_path), False, val_size=10, split_seed=0, **RGB)
    assert data.sizes() == {"train": 40, "val": 10, "test": 10}
    assert data.input_shape == (3, 32, 32)


def test_cifar10_refuses_a_pickle_that_would_run_code(tmp_path):
    write_cifar10(tmp_path, per_batch=10)
    marker = tmp_path / "pwned"

    class Hostile:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": Hostile(), b"labels": [0]}, f)
    with pytest.raises(UserError, match=r"not a CIFAR batch file: .*test_batch.*io.open|builtins"):
        load_cifar10(str(tmp_path), False, val_size=10, split_seed=0, **RGB)
    assert not marker.exists()


def test_missing_cifar10_without_download_lists_the_files(tmp_path):
    with pytest.raises(UserError, match=r"cifar-10-batches-py.*data_batch_1"):
        load_cifar10(str(tmp_path), False, val_size=10, split_seed=0, **RGB)


def test_imagefolder_reads_pngs_and_resizes(tmp_path):
    write_imagefolder(tmp_path, per_class=3, size=(12, 10))
    data = load_imagefolder(str(tmp_path), [16, 16], 3, num_workers=0, **RGB)
    assert data.num_classes == 3 and data.sizes() == {"train": 9, "val": 9, "test": 9}
    assert data.input_shape == (3, 16, 16)
    images, labels = next(data.batches("train", Placement(CPU), seed=0).epoch(0))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.float32
    assert labels.tolist() and max(labels.tolist()) < 3


def test_imagefolder_without_test_split_has_none(tmp_path):
    write_imagefolder(tmp_path, per_class=3, test=False)
    assert load_imagefolder(str(tmp_path), [8, 8], 3, num_workers=0, **RGB).splits["test"] is None


@pytest.mark.parametrize(
    "layout, message",
    [
        ("no_root", r"image folder root not found: .*missing"),
        ("no_val", r"image folder split not found: .*val"),
        ("empty_class", r"empty class folder: .*train/dog"),
    ],
)
def test_imagefolder_problems_name_the_path(tmp_path, layout, message):
    root = tmp_path / ("missing" if layout == "no_root" else "images")
    if layout != "no_root":
        write_imagefolder(root, per_class=2, test=False)
    if layout == "no_val":
        for file in sorted((root / "val").rglob("*"), reverse=True):
            file.unlink() if file.is_file() else file.rmdir()
        (root / "val").rmdir()
    if layout == "empty_class":
        for file in (root / "train" / "dog").iterdir():
            file.unlink()
    with pytest.raises(UserError, match=message):
        load_imagefolder(str(root), [8, 8], 3, num_workers=0, **RGB)


@pytest.mark.parametrize("cache", ["auto", "off"])
def test_corrupt_image_names_the_file(tmp_path, cache):
    write_imagefolder(tmp_path, per_class=4, test=False)
    (tmp_path / "val" / "cat" / "0.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match=r"cannot decode image .*cat/0.png"):
        # With a cache, found while it is built; without, when the batch is read.
        data = load_imagefolder(str(tmp_path), [8, 8], 3, cache=cache, num_workers=0, **RGB)
        list(data.batches("val", Placement(CPU), seed=0).epoch(0))


@pytest.mark.parametrize(
    "bad, message", [("10", r"label 10 .*outside \[0, 10\)"), ("2.5", "not an integer")]
)
def test_bad_labels_name_the_dataset_and_value(tmp_path, bad, message):
    path = tmp_path / "digits.csv.gz"
    rows = [",".join(["0"] * 64 + [str(i % 10)]) for i in range(60)] + [
        ",".join(["0"] * 64 + [bad])
    ]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    with pytest.raises(UserError, match=message):
        load_digits(str(path), val_size=10, test_size=10, split_seed=0, **BATCHING)


def test_synthetic_is_seeded_and_shaped():
    def make(seed):
        return load_synthetic(64, [3, 8, 8], 4, 0.2, seed, val_size=16, test_size=16, **RGB)

    a, b, c = make(0), make(0), make(1)
    assert a.input_shape == (3, 8, 8) and a.num_classes == 4
    assert torch.equal(a.splits["train"].inputs, b.splits["train"].inputs)
    assert not torch.equal(a.splits["train"].inputs, c.splits["train"].inputs)


def synthetic_data(**augment):
    batching = {**BATCHING, "augment": {"crop_padding": 0, "horizontal_flip": False, **augment}}
    return load_synthetic(100, [1, 6, 6], 3, 0.3, 0, val_size=10, test_size=10, **batching)


def test_training_batches_cover_each_sample_once_per_epoch_in_a_new_order():
    data = synthetic_data()
    batches = data.batches("train", Placement(CPU), seed=0)
    assert len(batches) == 13  # 12 of 8, and the last, partial one of 4
    orders = []
    for epoch in (0, 1):
        labels = torch.cat([y for _, y in batches.epoch(epoch)])
        assert len(labels) == 100
        orders.append(labels)
    assert not torch.equal(orders[0], orders[1])
    evaluation = data.batches("val", Placement(CPU), seed=0)
    assert sum(len(y) for _, y in evaluation.epoch(0)) == 10  # evaluation keeps every sample


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_processes_shares_of_a_training_epoch_make_up_one_processs_epoch(world_size):
    """Under torchrun each process takes its rows of every global batch: side by side, the
    shares are the batches one process cuts with the global batch size, from any batch on."""
    from data.batching.batches import BatchPlan, BatchTransform, TensorBatches

    data = synthetic_data()
    split, transform = data.splits["train"], BatchTransform([0.5], [0.25], CPU)

    def epoch(start: int, batch_size: int, rank: int = 0, world_size: int = 1) -> list:
        plan = BatchPlan(
            batch_size=batch_size,
            train=True,
            seed=3,
            rank=rank,
            world_size=world_size,
            keep_partial=False,
        )
        return list(TensorBatches(split, plan, transform).epoch(1, start))

    for start in (0, 2):
        expected = epoch(start, 3 * world_size)
        shares = [epoch(start, 3, rank, world_size) for rank in range(world_size)]
        assert [len(share) for share in shares] == [len(expected)] * world_size
        for index, (x, y) in enumerate(expected):
            assert torch.equal(torch.cat([share[index][1] for share in shares]), y)
            assert torch.equal(torch.cat([share[index][0] for share in shares]), x)


def test_an_epoch_can_start_at_any_batch_with_the_same_data():
    data = synthetic_data(crop_padding=1, horizontal_flip=True)
    batches = data.batches("train", Placement(CPU), seed=3)
    full = list(batches.epoch(2))
    tail = list(batches.epoch(2, start=5))
    assert len(tail) == len(full) - 5
    for (x1, y1), (x2, y2) in zip(full[5:], tail, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_augmentation_is_seeded_and_off_for_evaluation():
    data = synthetic_data(crop_padding=2, horizontal_flip=True)
    x_train = next(data.batches("train", Placement(CPU), seed=0).epoch(0))[0]
    x_plain = next(synthetic_data().batches("train", Placement(CPU), seed=0).epoch(0))[0]
    assert not torch.equal(x_train, x_plain)  # same samples, augmented
    assert torch.equal(x_train, next(data.batches("train", Placement(CPU), seed=0).epoch(0))[0])
    val_a = next(data.batches("val", Placement(CPU), seed=0).epoch(0))[0]
    val_b = next(synthetic_data().batches("val", Placement(CPU), seed=0).epoch(0))[0]
    assert torch.equal(val_a, val_b)


def test_random_crop_shifts_each_image_within_the_padding():
    image = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4).repeat(64, 1, 1, 1)
    cropped = random_crop(image, 1, Draws.of(0, 0, torch.arange(64)))
    assert cropped.shape == image.shape
    padded = np.pad(image[0, 0].numpy(), 1)
    windows = {padded[dy : dy + 4, dx : dx + 4].tobytes() for dy in range(3) for dx in range(3)}
    seen = {c[0].numpy().tobytes() for c in cropped}
    assert seen <= windows and len(seen) > 1


def test_normalisation_uses_the_configured_mean_and_std():
    split = TensorSplit(
        torch.full((8, 1, 2, 2), 255, dtype=torch.uint8), torch.zeros(8, dtype=torch.long)
    )
    from data.batching.dataset import Batching, Data, Splits

    augment = {"crop_padding": 0, "horizontal_flip": False}
    batching = Batching(4, 4, [0.5], [0.25], augment)
    data = Data("white", Splits(split, split), 2, batching, inputs=Pixels())
    images, _ = next(data.batches("val", Placement(CPU), seed=0).epoch(0))
    assert torch.allclose(images, torch.full_like(images, 2.0))  # (1 - 0.5) / 0.25
