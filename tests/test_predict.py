"""predict.py: predictions from the checkpoint alone, equal to what evaluate.py measures on the
same files; one line for an input the checkpoint's data cannot read."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from conftest import EVALUATE, PREDICT, run_python, run_train, write_imagefolder, write_table

IMAGES = [
    "data=imagefolder",
    "data.root=images",
    "data.image_size=[12,10]",
    "model=cnn",
    "data.batch_size=8",
    "data.num_workers=0",
    "trainer.ema.decay=0.9",
    "trainer.max_epochs=3",
]


def predictions(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def evaluated(cwd: Path, *args: str) -> dict:
    run_python(cwd, str(EVALUATE), *args, "runs=eval-runs")
    (found,) = (cwd / "eval-runs" / "eval").glob("*/metrics.json")
    (result,) = json.loads(found.read_text()).values()
    return result


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("predict")
    write_imagefolder(cwd / "images", per_class=8)
    run_train(cwd, *IMAGES, "run_name=img")
    return cwd


def test_predictions_on_an_image_folder_equal_evaluate_on_it(image_run):
    cwd = image_run
    result = run_python(
        cwd,
        str(PREDICT),
        "ckpt=checkpoints/img",
        "input=images/val",
        "out=val.csv",
        "topk=3",
        "runs=predict-runs",
    )
    assert "24 predictions from checkpoints/img/best.pt (auto weights)" in result.stdout
    rows = predictions(cwd / "val.csv")
    assert [r["input"] for r in rows[:2]] == ["cat/0.png", "cat/1.png"] and len(rows) == 24
    truth = [r["input"].split("/")[0] for r in rows]
    accuracy = sum(r["class1"] == t for r, t in zip(rows, truth, strict=True)) / len(rows)
    true_p = [
        next(float(r[f"p{i}"]) for i in (1, 2, 3) if r[f"class{i}"] == t)
        for r, t in zip(rows, truth, strict=True)
    ]
    loss = -sum(math.log(p) for p in true_p) / len(rows)
    metrics = evaluated(cwd, "ckpt=checkpoints/img", "split=val")
    assert accuracy == pytest.approx(metrics["val/acc"], abs=1e-6)
    assert loss == pytest.approx(metrics["val/loss"], abs=1e-4)  # EMA weights, both by default
    for r in rows:
        assert sum(float(r[f"p{i}"]) for i in (1, 2, 3)) == pytest.approx(1.0, abs=1e-5)


def test_one_image_file_and_the_raw_weights(image_run):
    cwd = image_run
    run_python(
        cwd,
        str(PREDICT),
        "ckpt=checkpoints/img/best.pt",
        "input=images/val/dog/3.png",
        "out=one.csv",
        "topk=1",
        "weights=raw",
        "runs=predict-runs",
    )
    (row,) = predictions(cwd / "one.csv")
    assert row["input"] == "3.png" and row["class1"] in ("cat", "dog", "fox") and "p2" not in row


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda cwd: (cwd / "bad").mkdir() or (cwd / "bad" / "x.png").write_bytes(b"not a png"),
            "cannot decode image bad/x.png",
        ),
        (
            lambda cwd: write_table(cwd / "bad.csv"),
            "is a table, but the checkpoint's model takes images",
        ),
    ],
)
def test_an_input_the_checkpoint_cannot_read_is_one_line(image_run, tmp_path, make, message):
    make(tmp_path)
    target = "bad" if "decode" in message else "bad.csv"
    result = run_python(
        tmp_path,
        str(PREDICT),
        f"ckpt={image_run / 'checkpoints' / 'img'}",
        f"input={target}",
        "runs=predict-runs",
        ok=False,
    )
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "predictions.csv").exists()


def test_predictions_on_a_table_equal_evaluate_on_it(tmp_path):
    write_table(tmp_path / "train.csv", seed=0)
    write_table(tmp_path / "test.csv", rows=60, seed=3)
    run_train(
        tmp_path,
        "data=csv",
        "data.path=train.csv",
        "data.split.test_path=test.csv",
        "data.target=kind",
        "data.categorical=[colour]",
        "trainer.max_epochs=3",
        "run_name=table",
    )
    no_target = tmp_path / "rows.csv"
    lines = (tmp_path / "test.csv").read_text().splitlines()
    no_target.write_text("\n".join(",".join(line.split(",")[:3]) for line in lines) + "\n")
    run_python(
        tmp_path,
        str(PREDICT),
        "ckpt=checkpoints/table",
        "input=rows.csv",
        "topk=1",
        "runs=predict-runs",
    )
    rows = predictions(tmp_path / "predictions.csv")
    assert [r["input"] for r in rows[:3]] == ["1", "2", "3"] and len(rows) == 60
    truth = [line.split(",")[3] for line in lines[1:]]
    accuracy = sum(r["class1"] == t for r, t in zip(rows, truth, strict=True)) / len(rows)
    metrics = evaluated(tmp_path, "ckpt=checkpoints/table", "split=test")
    assert accuracy == pytest.approx(metrics["test/acc"], abs=1e-6)
    assert "unseen" not in rows[0]  # every category was seen: no flag column


def test_a_category_training_never_saw_is_named_flagged_or_refused(tmp_path):
    write_table(tmp_path / "train.csv", seed=0)  # colour: r, g or b
    lines = write_table(tmp_path / "val.csv", rows=40, seed=3).read_text().splitlines()
    lines[2] = (
        lines[2].replace(",r,", ",purple,").replace(",g,", ",purple,").replace(",b,", ",purple,")
    )
    (tmp_path / "val.csv").write_text("\n".join(lines) + "\n")
    trained = run_train(
        tmp_path,
        "data=csv",
        "data.path=train.csv",
        "data.split.val_path=val.csv",
        "data.target=kind",
        "data.categorical=[colour]",
        "trainer.max_epochs=1",
        "run_name=t",
    )
    assert (
        "val.csv: 1 row holds a category the train file never held ('colour=purple' in 1 "
        "row)" in trained.stdout + trained.stderr
    )
    rows = [["0.1", "480", "crew"], ["0.2", "520", "r"], ["0.3", "500", "crew"]]
    (tmp_path / "new.csv").write_text("size,weight,colour\n" + "\n".join(map(",".join, rows)))
    result = run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/t", "input=new.csv", "runs=p")
    assert (
        "new.csv: 2 rows hold a category the train file never held ('colour=crew' in 2 "
        "rows)" in result.stdout + result.stderr
    )
    assert [r["unseen"] for r in predictions(tmp_path / "predictions.csv")] == [
        "colour=crew",
        "",
        "colour=crew",
    ]
    refused = run_python(
        tmp_path,
        str(PREDICT),
        "ckpt=checkpoints/t",
        "input=new.csv",
        "unseen=error",
        "out=refused.csv",
        "runs=p",
        ok=False,
    )
    assert refused.returncode == 2 and "new.csv line 2: colour=crew is a category" in (
        refused.stderr
    )
    assert not (tmp_path / "refused.csv").exists()


def test_the_onnx_export_runs_in_onnxruntime_with_any_batch_size(image_run):
    import numpy as np
    import onnxruntime
    import torch
    from omegaconf import OmegaConf

    from models.cnn import cnn
    from utils.checkpoint.load import load_checkpoint

    cwd = image_run
    result = run_python(
        cwd,
        str(EVALUATE),
        "ckpt=checkpoints/img/best.pt",
        "export=model.onnx",
        "weights=raw",
        "runs=eval-export",
    )
    shown = " ".join(result.stdout.split())  # the console wraps long lines
    assert "onnxruntime on batches of 1, 2 and 8 differs from PyTorch by at most" in shown
    checkpoint = load_checkpoint(cwd / "checkpoints" / "img" / "best.pt")
    node = OmegaConf.create(checkpoint["config"]["model"])
    model = cnn((3, 12, 10), 3, list(node.channels), node.dropout, node.init).eval()
    model.load_state_dict(checkpoint["model"])  # weights=raw: the trained weights
    session = onnxruntime.InferenceSession(str(cwd / "model.onnx"))
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (5, 3, 12, 10), generator=generator, dtype=torch.uint8)
    mean, std = (torch.tensor(checkpoint["inputs"][k]).view(1, 3, 1, 1) for k in ("mean", "std"))
    inputs = (pixels / 255 - mean) / std  # the export takes the pixels and does this inside
    (got,) = session.run(None, {"input": pixels.numpy()})
    assert got.shape == (5, 3)
    assert np.abs(got - model(inputs).detach().numpy()).max() <= 1e-4
    bad = run_python(
        cwd,
        str(EVALUATE),
        "ckpt=checkpoints/img/best.pt",
        "export=model.bin",
        "runs=eval-export",
        ok=False,
    )
    assert bad.returncode == 2 and "name a .pt2 or a .onnx or a .safetensors file" in bad.stderr


# predict.py takes its shapes from the checkpoint's inputs record, evaluate.py from the stored
# data config; both build the stored model config.
@pytest.mark.parametrize(
    ("edit", "message", "scripts"),
    [
        (
            lambda c: c["inputs"].update(
                num_classes=10**8,
                classes=None,
                targets={"kind": "classes", "count": 10**8, "names": None},
            ),
            "gives 100,000,000 classes, more than the 1,048,576 a model output may have",
            [PREDICT],
        ),
        (
            lambda c: c["inputs"].update(num_classes=10**8, classes=None),  # counts that disagree
            "its targets record is not what torchloom writes",
            [PREDICT],
        ),
        (
            lambda c: c["config"]["model"].update(channels=[10**6, 10**6]),
            "the checkpoint's weights do not fit the model",
            [PREDICT, EVALUATE],
        ),
        (
            lambda c: c["inputs"].update(shape=[3, 50000, 50000]),
            "more than 67,108,864 values each; refusing",
            [PREDICT],
        ),
        (
            lambda c: c["config"]["data"].update(image_size=[50000, 50000]),
            "data.image_size=[50000, 50000] is out of range",
            [EVALUATE],
        ),
    ],
)
def test_an_edited_checkpoint_asking_for_vast_sizes_is_refused_before_allocating(
    image_run, tmp_path, edit, message, scripts
):
    import torch

    checkpoint = torch.load(image_run / "checkpoints" / "img" / "best.pt", weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, tmp_path / "edited.pt")
    for script in scripts:
        where = (
            f"input={image_run / 'images' / 'val'}"
            if script == PREDICT
            else f"data.root={image_run / 'images'}"
        )
        result = run_python(tmp_path, str(script), "ckpt=edited.pt", where, "runs=r", ok=False)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-600:]


def test_an_export_predicts_exactly_what_its_checkpoint_predicts_in_the_targets_units(tmp_path):
    # predict.py reads checkpoints as evaluate.py does, a .safetensors export included: the
    # export carries the inputs record and the target scale, so its rows are the same.
    pytest.importorskip("safetensors")
    import random

    from conftest import write_rows

    rng = random.Random(0)
    rows = [
        [x, z, 500 + 80 * x - 30 * z + rng.gauss(0, 1)]
        for x, z in ((rng.gauss(0, 1), rng.gauss(0, 1)) for _ in range(200))
    ]
    write_rows(tmp_path / "prices.csv", ["x", "z", "price"], rows)
    write_rows(tmp_path / "new.csv", ["x", "z"], [r[:2] for r in rows[:5]])
    run_train(
        tmp_path,
        "task=regression",
        "data=csv",
        "data.path=prices.csv",
        "data.target=price",
        "trainer.max_epochs=3",
        "run_name=prices",
    )
    run_python(
        tmp_path, str(EVALUATE), "ckpt=checkpoints/prices", "export=prices.safetensors", "runs=r"
    )
    for ckpt, out in (("checkpoints/prices", "a.csv"), ("prices.safetensors", "b.csv")):
        run_python(tmp_path, str(PREDICT), f"ckpt={ckpt}", "input=new.csv", f"out={out}", "runs=r")
    a, b = ((tmp_path / name).read_text() for name in ("a.csv", "b.csv"))
    assert a == b and a.startswith("input,price\n")
    values = [float(line.split(",")[1]) for line in a.splitlines()[1:]]
    assert all(200 < v < 800 for v in values)  # in dollars, not standardised units
