"""How an image reaches the model's size (data.cache_size, data.crop_pct): evaluation sees
timm's resize and centre crop; the train split may be stored larger, for the random resized
crops to cut from; predict.py and the checkpoint's record see what evaluation saw."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from conftest import (
    PREDICT,
    checkpoint,
    error_line,
    run_evaluate,
    run_python,
    run_train,
    write_imagefolder,
)
from PIL import Image

from data.images.pixels import decoded


@pytest.mark.parametrize(("size", "crop_pct"), [((16, 16), 0.875), ((15, 20), 0.9), ((8, 8), 1.0)])
def test_the_evaluation_view_is_timms_resize_and_centre_crop(tmp_path, size, crop_pct):
    pixels = torch.randint(0, 256, (37, 29, 3), generator=torch.Generator().manual_seed(1))
    Image.fromarray(pixels.to(torch.uint8).numpy()).save(tmp_path / "a.png")
    outer = [math.floor(side / crop_pct) for side in size]
    theirs = T.Compose([T.Resize(outer, T.InterpolationMode.BILINEAR), T.CenterCrop(size)])
    image = theirs(Image.open(tmp_path / "a.png").convert("RGB"))
    expected = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
    assert torch.equal(decoded(str(tmp_path / "a.png"), size, 3, "a.png", crop_pct), expected)


VIEWS = (
    "data=imagefolder",
    "data.root=images",
    "data.image_size=[16,16]",
    "data.cache_size=[24,24]",
    "data.crop_pct=0.875",
    "data.augment.random_resized_crop=true",
    "data.augment.scale=[0.35,1.0]",
    "model=cnn",
    "trainer.max_epochs=2",
    "data.batch_size=12",
    "data.num_workers=0",
)


def test_a_larger_cache_feeds_the_crops_and_predict_sees_what_evaluation_saw(tmp_path):
    write_imagefolder(tmp_path / "images", per_class=12, size=(30, 30))
    run_train(tmp_path, *VIEWS, "data.cache=memory", "run_name=memory")
    stored = checkpoint(tmp_path, "memory")
    assert stored["inputs"]["shape"] == [3, 16, 16] and stored["inputs"]["crop_pct"] == 0.875
    # the DataLoader path decodes the same views and draws the same crops: the same weights
    run_train(tmp_path, *VIEWS, "data.cache=off", "run_name=off")
    other = checkpoint(tmp_path, "off")
    for key, value in stored["model"].items():
        torch.testing.assert_close(other["model"][key], value, rtol=0, atol=1e-5)
    result = run_python(
        tmp_path,
        str(PREDICT),
        "ckpt=checkpoints/memory/last.pt",
        "input=images/val",
        "out=val.csv",
        "runs=predict-runs",
    )
    assert result.returncode == 0
    with open(tmp_path / "val.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    truth = [r["input"].split("/")[0] for r in rows]
    accuracy = sum(r["class1"] == t for r, t in zip(rows, truth, strict=True)) / len(rows)
    run_evaluate(tmp_path, "ckpt=checkpoints/memory/last.pt", "split=val", "runs=eval-runs")
    (found,) = (tmp_path / "eval-runs" / "eval").glob("*/metrics.json")
    (metrics,) = json.loads(found.read_text()).values()
    assert accuracy == pytest.approx(metrics["val/acc"], abs=1e-6)
    # a record edited to ask for another view is refused in one line, as the rest of it is
    stored["inputs"]["crop_pct"] = 5.0
    torch.save(stored, tmp_path / "edited.pt")
    edited = run_python(
        tmp_path, str(PREDICT), "ckpt=edited.pt", "input=images/val", "out=e.csv", ok=False
    )
    assert edited.returncode == 2 and "crop_pct=5.0" in error_line(edited)


def test_cross_validation_caches_each_view_once(tmp_path):
    write_imagefolder(tmp_path / "images", per_class=8, size=(20, 20), test=False)
    said = run_train(tmp_path, *VIEWS, "data.split.folds=2", "data.cache=memory", "run_name=cv")
    assert said.returncode == 0
    assert checkpoint(tmp_path, "cv")["inputs"]["shape"] == [3, 16, 16]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("data.augment.random_resized_crop=false", "data.cache_size=[24, 24]"),
        ("data.cache_size=[12,24]", "data.cache_size=[12, 24] must be at least"),
        ("data.crop_pct=0", "data.crop_pct=0"),
    ],
)
def test_a_wrong_view_is_one_line(tmp_path, override, said):
    write_imagefolder(tmp_path / "images", per_class=4, size=(12, 12))
    result = run_train(tmp_path, *VIEWS, override, ok=False)
    assert result.returncode == 2 and said in error_line(result)
