"""Shared helpers: running the real entry points, and small datasets written in the real
on-disk formats (MNIST's IDX files, CIFAR-10's pickled batches, a folder of PNGs)."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "helpers"
TRAIN = ROOT / "train.py"
EVALUATE = ROOT / "evaluate.py"
CONF = ROOT / "conf"


def run_python(
    cwd: Path, *args: str, ok: bool = True, timeout: float = 600, env: dict | None = None
):
    """Run ``python ARGS`` in ``cwd``; ``env`` adds environment variables; tests/helpers is
    importable for test-only models. With ``ok``, a non-zero exit fails the test with the
    output."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(HELPERS), **(env or {})},
    )
    if ok:
        assert result.returncode == 0, (
            f"{args[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result


def run_train(
    cwd: Path, *overrides: str, ok: bool = True, timeout: float = 600, env: dict | None = None
):
    """Run ``python train.py OVERRIDES`` in ``cwd`` (outputs land in cwd/runs, cwd/checkpoints)."""
    return run_python(cwd, str(TRAIN), *overrides, ok=ok, timeout=timeout, env=env)


def read_events(run_dir: Path):
    """The TensorBoard events a run wrote, as TensorBoard's own reader sees them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = read_events(run_dir)
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX as MNIST stores it: magic (0, 0, dtype 0x08 = ubyte, ndim), big-endian int32 dims."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        f.write(struct.pack(f">{array.ndim}i", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str, train: int = 96, test: int = 32, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    for prefix, n in (("train", train), ("t10k", test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
    return root


def write_cifar10(root: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """The python-version batches: pickled dicts with ``data`` [N, 3072] uint8 and ``labels``."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, per_batch).tolist(),
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    return root


def write_imagefolder(
    root: Path, classes=("cat", "dog", "fox"), per_class: int = 6, size=(12, 10), test=True
) -> Path:
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val", "test") if test else ("train", "val"):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = torch.randint(0, 256, (*size, 3), dtype=torch.uint8, generator=generator)
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory) -> Path:
    return write_mnist(tmp_path_factory.mktemp("mnist"), "MNIST")


@pytest.fixture(scope="session")
def fashion_root(tmp_path_factory) -> Path:
    return write_mnist(tmp_path_factory.mktemp("fashion"), "FashionMNIST", seed=1)


@pytest.fixture(scope="session")
def cifar_root(tmp_path_factory) -> Path:
    return write_cifar10(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="session")
def imagefolder_root(tmp_path_factory) -> Path:
    return write_imagefolder(tmp_path_factory.mktemp("images"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
