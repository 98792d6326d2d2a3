"""Image defaults that adapt to the images and the model: data.channels and data.mean/std
``auto`` from the train split (kept in the checkpoint's record for evaluate and predict),
random crops and flips only for a model that can use them, and the image cache built once
under torchrun."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import pytest
import torch
from conftest import (
    HELPERS,
    PREDICT,
    run_evaluate,
    run_python,
    run_train,
    slow,
    torchrun,
    write_imagefolder,
)
from PIL import Image

from data.batching.batches import Placement
from data.images.image_manifest import load_image_csv
from data.images.imagefolder import load_imagefolder
from utils.checkpoint.load import load_checkpoint

BATCHING = {
    "batch_size": 4,
    "eval_batch_size": 8,
    "num_workers": 0,
    "augment": {"spatial": "auto", "crop_padding": 4, "horizontal_flip": True},
}
AUTO = {"mean": "auto", "std": "auto"}


def grey_folder(root, per_class=6, size=(12, 10), colour_file=None):
    """Grey PNGs in class folders, train/val/test, each split a different brightness: the
    statistics show which split they came from. ``colour_file`` is an RGB image added to
    train/a."""
    rng = np.random.default_rng(0)
    for split, offset in (("train", 0), ("val", 120), ("test", 200)):
        for name in ("a", "b"):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(offset, offset + 50, size, dtype=np.uint8)
                Image.fromarray(pixels, "L").save(folder / f"{i}.png")
    if colour_file:
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(root / "train" / "a" / colour_file)
    return root


def hand_statistics(folder, mode):
    """Mean and std per channel over every image file under ``folder``, by PIL and numpy."""
    values = np.stack(
        [
            np.asarray(Image.open(p).convert(mode), dtype=np.float64) / 255
            for p in sorted(folder.rglob("*.png"))
        ]
    )
    values = values.reshape(len(values), -1, 1 if mode == "L" else 3).transpose(2, 0, 1)
    values = values.reshape(values.shape[0], -1)
    return values.mean(axis=1), values.std(axis=1, ddof=1)


@pytest.mark.parametrize("cache", ["memory", *slow("disk", "off")])
def test_auto_statistics_are_the_train_images_own(tmp_path, cache, caplog):
    root = grey_folder(tmp_path / "images")
    with caplog.at_level(logging.INFO, logger="torchloom"):
        data = load_imagefolder(str(root), [12, 10], "auto", cache=cache, **AUTO, **BATCHING)
    mean, std = hand_statistics(root / "train", "L")
    assert data.input_shape == (1, 12, 10)
    assert data.mean == pytest.approx(mean.tolist(), abs=1e-6)
    assert data.std == pytest.approx(std.tolist(), abs=1e-6)
    everything, _ = hand_statistics(root, "L")
    assert data.mean != pytest.approx(everything.tolist(), abs=1e-3)  # val and test not in it
    assert "data.channels=auto chose 1 (every training image is grey)" in caplog.text


def test_a_mixed_folder_reads_rgb_and_says_so_and_explicit_values_win(tmp_path, caplog):
    root = grey_folder(tmp_path / "images", colour_file="colour.png")
    with caplog.at_level(logging.INFO, logger="torchloom"):
        data = load_imagefolder(str(root), [12, 10], "auto", **AUTO, **BATCHING)
    assert data.input_shape == (3, 12, 10)
    assert "some training images are grey and some colour" in caplog.text
    assert "colour.png" in caplog.text
    mean, std = hand_statistics(root / "train", "RGB")
    assert data.mean == pytest.approx(mean.tolist(), abs=1e-6)
    assert data.std == pytest.approx(std.tolist(), abs=1e-6)
    given = load_imagefolder(str(root), [12, 10], 1, mean=[0.5], std="auto", **BATCHING)
    assert given.input_shape[0] == 1 and given.mean == [0.5] and given.std != [0.5]


def test_a_manifest_takes_auto_channels_and_statistics_from_its_train_rows(tmp_path):
    root = grey_folder(tmp_path / "images")
    rows = [[str(p.relative_to(root)), p.parent.name] for p in sorted(root.rglob("*.png"))]
    with open(tmp_path / "all.csv", "w", newline="") as f:
        csv.writer(f).writerows([["path", "label"], *rows])
    split = {"val_path": None, "test_path": None, "val": 0.25, "test": 0.25, "seed": 0}
    data = load_image_csv(
        str(root),
        str(tmp_path / "all.csv"),
        split,
        [12, 10],
        "auto",
        cache="memory",
        cache_max_gb=None,
        cache_dir=None,
        **AUTO,
        **BATCHING,
    )
    train = data.splits["train"].inputs.double() / 255
    assert data.input_shape[0] == 1
    assert data.mean == pytest.approx([train.mean().item()], abs=1e-6)
    assert data.std == pytest.approx([train.std().item()], abs=1e-6)


def test_evaluate_and_predict_normalise_with_the_stored_statistics(tmp_path):
    """A checkpoint trained with auto statistics, evaluated on a copy of its folder whose
    train images are all brighter: the stored statistics are used, not refitted, so the test
    split scores exactly as at the end of training."""
    import shutil

    root = grey_folder(tmp_path / "images", per_class=8)
    run = [
        "data=imagefolder",
        "data.root=images",
        "data.image_size=[12,10]",
        "model=cnn",
        "model.channels=[8]",
        "data.batch_size=4",
        "data.num_workers=0",
        "trainer.max_epochs=1",
        "run_name=auto",
    ]
    run_train(tmp_path, *run)
    stored = load_checkpoint(tmp_path / "checkpoints/auto/best.pt")["inputs"]
    mean, std = hand_statistics(root / "train", "L")
    assert stored["shape"] == [1, 12, 10]
    assert stored["mean"] == pytest.approx(mean.tolist(), abs=1e-6)
    assert stored["std"] == pytest.approx(std.tolist(), abs=1e-6)
    shutil.copytree(root, tmp_path / "brighter", ignore=shutil.ignore_patterns(".torchloom-cache"))
    for path in (tmp_path / "brighter" / "train").rglob("*.png"):
        Image.fromarray(np.asarray(Image.open(path)) + 150).save(path)
    evaluated = run_evaluate(
        tmp_path, "ckpt=checkpoints/auto/best.pt", "split=test", "data.root=brighter"
    )
    assert "data.mean/std=auto" not in evaluated.stdout  # nothing refitted
    trained = json.loads((tmp_path / "runs/auto/metrics.json").read_text())
    assert f"{trained['test/acc']:.4f}" in evaluated.stdout
    run_python(
        tmp_path,
        str(PREDICT),
        "ckpt=checkpoints/auto/best.pt",
        "input=brighter/test",
        "out=predicted.csv",
        "runs=predict-runs",
    )
    assert len((tmp_path / "predicted.csv").read_text().splitlines()) == 1 + 16


@pytest.mark.parametrize(
    ("flat", "spatial", "kept"),
    [
        (True, "auto", False),
        (False, "auto", True),
        (True, "on", True),
        (False, "off", False),
    ],
)
def test_crops_and_flips_fit_the_model(tmp_path, caplog, flat, spatial, kept):
    write_imagefolder(tmp_path / "images", per_class=4)
    augment = {**BATCHING["augment"], "spatial": spatial}
    data = load_imagefolder(
        str(tmp_path / "images"),
        [12, 10],
        3,
        mean=[0.5],
        std=[0.25],
        **{**BATCHING, "augment": augment},
    )
    with caplog.at_level(logging.INFO, logger="torchloom"):
        data.fit_augmentation(flat)
    transform = data.batches("train", Placement(torch.device("cpu")), seed=0).transform
    assert (transform.augment_with.crop_padding, transform.augment_with.horizontal_flip) == (
        (4, True) if kept else (0, False)
    )
    warned = "warning: data.augment.crop_padding=4 and data.augment.horizontal_flip=true train"
    assert (warned in caplog.text) == (flat and spatial == "on")
    assert ("spatial=auto: the model's first layer flattens" in caplog.text) == (
        flat and spatial == "auto"
    )


def test_the_default_mlp_on_an_image_folder_trains_without_crops_and_says_why(tmp_path):
    write_imagefolder(tmp_path / "images", per_class=4)
    result = run_train(
        tmp_path,
        "data=imagefolder",
        "data.root=images",
        "data.image_size=[12,10]",
        "model=mlp",
        "data.batch_size=4",
        "data.num_workers=0",
        "debug=fast_dev_run",
        "run_name=aug",
    )
    assert "data.augment.spatial=auto: the model's first layer flattens each image, so " in (
        result.stdout + result.stderr
    )
    assert "data.channels=auto chose 3 (RGB images)" in result.stdout + result.stderr


def test_a_linear_layer_on_the_flattened_sample_counts_as_flattening():
    from torch import nn

    from utils.model.checks import check_forward

    class ViewFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(3 * 8 * 8, 2)

        def forward(self, x):
            return self.head(x.view(len(x), -1))

    class Patches(nn.Module):  # a linear layer over patches keeps the image's layout
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Linear(3 * 4 * 4, 6), nn.Linear(6, 2)

        def forward(self, x):
            patches = x.unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 1, 4, 5)
            return self.head(self.embed(patches.reshape(len(x), 4, 48)).mean(1))

    assert check_forward(ViewFirst(), torch.zeros(2, 3, 8, 8), 2) is True
    assert check_forward(Patches(), torch.zeros(2, 3, 8, 8), 2) is False


IMAGES_DDP = (
    "data=imagefolder",
    "data.root=images",
    "data.image_size=[12,10]",
    "model=mlp",
    "model.hidden_sizes=[16]",
    "model.dropout=0",
    "data.num_workers=0",
    "trainer.max_epochs=2",
)


@pytest.mark.slow  # 12 s: torchrun with two processes
def test_under_torchrun_the_cache_is_built_once_and_both_ranks_train_on_it(tmp_path):
    write_imagefolder(tmp_path / "images", per_class=8)
    builds = tmp_path / "builds.txt"
    torchrun(
        tmp_path,
        *IMAGES_DDP,
        "data.batch_size=4",
        "run_name=two",
        env={"CACHE_BUILDS": str(builds)},
        script=HELPERS / "counting_cache.py",
    )
    lines = builds.read_text().splitlines()
    assert len(lines) == 3 and {line.split()[0] for line in lines} == {"0"}  # train, val, test
    files = sorted(p.name for p in (tmp_path / "images" / ".torchloom-cache").iterdir())
    assert len(files) == 3 and all(name.endswith(".u8") for name in files)
    run_train(tmp_path, *IMAGES_DDP, "data.batch_size=8", "run_name=one")  # one global batch
    one = load_checkpoint(tmp_path / "checkpoints/one/last.pt")["model"]
    two = load_checkpoint(tmp_path / "checkpoints/two/last.pt")["model"]
    for name in one:  # the same pixels in the same order: the parameters of one process
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_under_torchrun_a_failed_build_ends_every_rank_with_its_line(tmp_path):
    write_imagefolder(tmp_path / "images", per_class=8)
    (tmp_path / "images" / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG not really")
    result = torchrun(tmp_path, *IMAGES_DDP, "data.batch_size=4", "run_name=bad", ok=False)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 2 and lines[0] == lines[1] and "broken.png" in lines[0]
    assert result.returncode != 0
