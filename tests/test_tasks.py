"""Tasks beyond single-label classification: ``task=regression`` (MSE/Huber/L1, targets
standardised and un-standardised, MAE/RMSE/R²) and ``task=multilabel`` (BCE, mAP, F1, subset
accuracy), through train.py, evaluate.py and predict.py on files the tests write; resumed runs
equal runs that never stopped; the metrics equal their definitions."""

from __future__ import annotations

import csv
import json
import math
import random
import runpy
from pathlib import Path

import pytest
import torch
from conftest import (
    EVALUATE,
    ROOT,
    interrupt_and_resume,
    raw_columns,
    read_metrics,
    run_python,
    run_train,
    scalars,
    user_conf,
)
from PIL import Image

from utils.checkpoint.load import load_checkpoint

PREDICT = ROOT / "predict.py"


# The Tasks figures of docs/tasks.md use the same table (benchmarks/task_figures.py).
write_houses = runpy.run_path(str(ROOT / "benchmarks" / "task_figures.py"))["write_houses"]


FEATURES = "data.features=[rooms,area,age,floor]"
REGRESSION = [
    "task=regression",
    "data=csv",
    "data.path=houses.csv",
    "data.target=[price,rent]",
    FEATURES,
    "data.split.test_path=test.csv",
    "data.batch_size=16",
    "model.hidden_sizes=[32]",
    "optim.lr=0.01",
    "trainer.max_epochs=6",
]


def evaluated(cwd: Path, *args: str) -> dict:
    run_python(cwd, str(EVALUATE), *args, "runs=eval-runs")
    found = sorted((cwd / "eval-runs" / "eval").glob("*/metrics.json"))[-1]
    (result,) = json.loads(found.read_text()).values()
    return result


def table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("regression")
    write_houses(cwd / "houses.csv")
    write_houses(cwd / "test.csv", rows=80, seed=5)
    run_train(cwd, *REGRESSION, "run_name=reg")
    return cwd


def test_regression_learns_in_the_targets_units_and_evaluate_and_predict_agree(regression_run):
    cwd = regression_run
    metrics = read_metrics(cwd / "runs" / "reg")
    assert metrics["monitor"] == "val/mae"  # the task's default monitor, lower is better
    assert metrics["test/r2"] > 0.9 and metrics["test/mae"] < 20  # price's spread is 60
    checkpoint = load_checkpoint(cwd / "checkpoints" / "reg" / "best.pt")
    scale = checkpoint["inputs"]["target_scale"]
    train_rows = table(cwd / "houses.csv")  # the train split is what is not held out
    assert 250 < scale["mean"][0] < 350 and 0.9 < scale["mean"][1] < 1.5
    assert 40 < scale["std"][0] < 80 and 0.2 < scale["std"][1] < 0.5
    assert checkpoint["inputs"]["targets"] == {
        "kind": "values",
        "count": 2,
        "names": ["price", "rent"],
    }
    assert len(train_rows) == 300

    result = evaluated(cwd, "ckpt=checkpoints/reg")
    for key in ("test/mae", "test/rmse", "test/r2", "test/loss"):
        assert result[key] == pytest.approx(metrics[key], rel=1e-6), key
    per_target = result["per_target"]
    assert per_target["names"] == ["price", "rent"]
    # The average over targets of each target's error, in its own units.
    assert sum(per_target["mae"]) / 2 == pytest.approx(result["test/mae"], rel=1e-6)
    assert per_target["mae"][0] > 20 * per_target["mae"][1]  # price's units, not standardised

    run_python(
        cwd,
        str(PREDICT),
        "ckpt=checkpoints/reg",
        "input=test.csv",
        "out=p.csv",
        "runs=predict-runs",
    )
    predicted, truth = table(cwd / "p.csv"), table(cwd / "test.csv")
    assert list(predicted[0]) == ["input", "price", "rent"] and len(predicted) == 80
    errors = [
        [abs(float(p[name]) - float(t[name])) for p, t in zip(predicted, truth, strict=True)]
        for name in ("price", "rent")
    ]
    mae = sum(sum(e) / len(e) for e in errors) / 2
    assert mae == pytest.approx(result["test/mae"], rel=1e-4)  # predict writes 6 digits


def straight_and_resumed(cwd: Path, run: list[str], at: int, tags: tuple[str, ...]):
    """A run straight through, and one SIGTERMed at training micro-batch ``at`` then resumed
    (test_resume.py's helper): their last.pt files, after checking that the parameters and the
    logged ``tags`` are bit-identical."""
    run_train(cwd, *run, "run_name=straight")
    interrupt_and_resume(cwd, run, "cut", at)
    a = load_checkpoint(cwd / "checkpoints" / "straight" / "last.pt")
    b = load_checkpoint(cwd / "checkpoints" / "cut" / "last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    logged_a, logged_b = scalars(cwd / "runs" / "straight"), scalars(cwd / "runs" / "cut")
    for tag in tags:
        assert logged_a[tag] == logged_b[tag], tag
    return a, b


def test_an_interrupted_regression_run_resumes_bit_identically(regression_run):
    run = [
        *REGRESSION,
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "task.loss=huber",
        "model.dropout=0.2",
        "trainer.max_epochs=3",
        "trainer.log_every_n_steps=4",
    ]
    tags = ("train/loss", "val/loss", "val/mae", "val/r2")
    a, b = straight_and_resumed(regression_run, run, at=20, tags=tags)
    assert (
        a["global_step"] == b["global_step"] == 3 * math.ceil(255 / 16)
    )  # 45 rows held out for val
    assert a["inputs"]["target_scale"] == b["inputs"]["target_scale"]


def test_a_resume_keeps_the_target_scale_it_started_with(regression_run):
    cwd = regression_run
    write_houses(cwd / "moved.csv", rows=300, seed=9)  # the data moved, and is not the same
    run = [*REGRESSION, "scheduler=none"]
    run_train(cwd, *run, "trainer.max_epochs=1", "run_name=scale")
    started = load_checkpoint(cwd / "checkpoints" / "scale" / "last.pt")["inputs"]
    result = run_train(
        cwd,
        *[o.replace("houses.csv", "moved.csv") for o in run],
        "trainer.max_epochs=2",
        "run_name=scale",
        "resume=auto",
        "resume_allow_changes=true",  # other data: refused without (docs/provenance.md)
    )
    assert "data.path: houses.csv -> moved.csv" in result.stdout + result.stderr
    resumed = load_checkpoint(cwd / "checkpoints" / "scale" / "last.pt")
    assert resumed["epoch"] == 2
    assert resumed["inputs"]["target_scale"] == started["target_scale"]


def test_standardised_and_raw_targets_are_scored_in_the_same_units(regression_run):
    cwd = regression_run
    run_train(cwd, *REGRESSION, "task.standardize_targets=false", "run_name=raw")
    raw, scaled = read_metrics(cwd / "runs" / "raw"), read_metrics(cwd / "runs" / "reg")
    checkpoint = load_checkpoint(cwd / "checkpoints" / "raw" / "best.pt")
    assert checkpoint["inputs"]["target_scale"]["std"] == [1.0, 1.0]
    # Both in price's units; raw targets of 300 ± 60 train far worse in 6 epochs.
    assert raw["test/mae"] > 2 * scaled["test/mae"]
    result = evaluated(cwd, "ckpt=checkpoints/raw")
    assert result["test/mae"] == pytest.approx(raw["test/mae"], rel=1e-6)


def test_exports_carry_the_target_scale(regression_run):
    """The ONNX graph's and the .pt2 program's ``values`` are in the targets' units, equal to predict.py's; a
    .safetensors export is evaluated with its stored scale, not one refitted to other data."""
    import onnxruntime

    cwd = regression_run
    run_python(cwd, str(EVALUATE), "ckpt=checkpoints/reg", "export=reg.onnx", "runs=export-runs")
    run_python(cwd, str(EVALUATE), "ckpt=checkpoints/reg", "export=reg.pt2", "runs=export-runs")
    run_python(
        cwd, str(EVALUATE), "ckpt=checkpoints/reg", "export=reg.safetensors", "runs=export-runs"
    )
    run_python(
        cwd,
        str(PREDICT),
        "ckpt=checkpoints/reg",
        "input=test.csv",
        "out=onnx-p.csv",
        "runs=predict-runs",
    )
    inputs = load_checkpoint(cwd / "checkpoints" / "reg" / "best.pt")["inputs"]
    features = raw_columns(cwd / "test.csv", inputs["table"])  # the raw rows
    session = onnxruntime.InferenceSession(
        str(cwd / "reg.onnx"), providers=["CPUExecutionProvider"]
    )
    (values,) = session.run(["values"], {"input": features.numpy()})
    predicted = [
        v for r in table(cwd / "onnx-p.csv") for v in (float(r["price"]), float(r["rent"]))
    ]
    assert values.flatten().tolist() == pytest.approx(predicted, rel=1e-5, abs=1e-4)
    program = torch.export.load(cwd / "reg.pt2").module()  # the same, from torch.export
    assert program(features).flatten().tolist() == pytest.approx(predicted, rel=1e-5, abs=1e-4)

    write_houses(cwd / "other.csv", rows=300, seed=11)  # another train split: another scale
    exported = evaluated(cwd, "ckpt=reg.safetensors", "data.path=other.csv")
    original = evaluated(cwd, "ckpt=checkpoints/reg")
    assert exported["test/mae"] == pytest.approx(original["test/mae"], rel=1e-6)


def test_an_inputs_record_that_disagrees_with_the_stored_task_is_refused(regression_run, tmp_path):
    checkpoint = load_checkpoint(regression_run / "checkpoints" / "reg" / "best.pt")
    checkpoint["inputs"]["targets"]["kind"] = "label_sets"  # the config still says regression
    torch.save(checkpoint, tmp_path / "edited.pt")
    result = run_python(
        regression_run,
        str(EVALUATE),
        f"ckpt={tmp_path / 'edited.pt'}",
        f"runs={tmp_path / 'runs'}",
        ok=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "was trained on targets (kind, count) ('label_sets', 2), and csv houses.csv holds "
        "other ones"
    ) in result.stderr


def test_an_edited_target_scale_is_refused_in_one_line(regression_run, tmp_path):
    checkpoint = load_checkpoint(regression_run / "checkpoints" / "reg" / "best.pt")
    checkpoint["inputs"]["target_scale"]["std"] = [-1.0, 1.0]
    torch.save(checkpoint, tmp_path / "edited.pt")
    predict = [str(PREDICT), "input=test.csv", f"out={tmp_path / 'p.csv'}"]
    for script, *args in ([str(EVALUATE)], predict):
        result = run_python(
            regression_run,
            script,
            f"ckpt={tmp_path / 'edited.pt'}",
            *args,
            f"runs={tmp_path / 'runs'}",
            ok=False,
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "target scale is not what torchloom writes" in result.stderr
    assert not (tmp_path / "p.csv").exists()


def write_tagged_images(root: Path, folder: str, count: int, seed: int) -> Path:
    """8×8 RGB images in ``root/folder`` with a red square (label red), a blue bar (label
    blue), both or neither, and a manifest ``root/<folder>.csv`` of path,label rows with a;b
    label sets."""
    rng = random.Random(seed)
    (root / folder).mkdir(parents=True)
    lines = ["path,label"]
    for index in range(count):
        red, blue = rng.random() < 0.5, rng.random() < 0.4
        pixels = [
            [(rng.randrange(40), rng.randrange(40), rng.randrange(40)) for _ in range(8)]
            for _ in range(8)
        ]
        if red:
            for y in range(4):
                for x in range(4):
                    pixels[y][x] = (230, 20, 20)
        if blue:
            for y in range(8):
                pixels[y][6] = pixels[y][7] = (20, 20, 230)
        image = Image.new("RGB", (8, 8))
        image.putdata([p for row in pixels for p in row])
        image.save(root / folder / f"{index}.png")
        labels = ";".join(name for name, on in (("red", red), ("blue", blue)) if on)
        lines.append(f"{folder}/{index}.png,{labels}")
    manifest = root / f"{folder}.csv"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


MULTILABEL = [
    "task=multilabel",
    "data=image_csv",
    "data.root=photos",
    "data.manifest=photos/img.csv",
    "data.split.test_path=photos/test.csv",
    "data.image_size=[8,8]",
    "data.batch_size=8",
    "data.num_workers=0",
    "model=cnn",
    "data.augment.crop_padding=0",
    "data.augment.horizontal_flip=false",
    "optim.lr=0.01",
    "trainer.max_epochs=6",
]


def label_set_of(text: str) -> set[str]:
    return set(filter(None, text.split(";")))


def test_multilabel_images_train_evaluate_and_predict_label_sets(tmp_path):
    write_tagged_images(tmp_path / "photos", "img", count=72, seed=0)
    test_manifest = write_tagged_images(tmp_path / "photos", "test", count=24, seed=1)
    run_train(tmp_path, *MULTILABEL, "task.pos_weight=auto", "run_name=tags")
    metrics = read_metrics(tmp_path / "runs" / "tags")
    assert metrics["monitor"] == "val/map"
    assert metrics["test/map"] > 0.9 and metrics["test/subset_acc"] > 0.7
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "tags" / "best.pt")
    assert checkpoint["classes"] == ["blue", "red"]
    assert checkpoint["inputs"]["threshold"] == 0.5

    result = evaluated(tmp_path, "ckpt=checkpoints/tags")
    for key in ("test/map", "test/f1_micro", "test/f1_macro", "test/subset_acc", "test/loss"):
        assert result[key] == pytest.approx(metrics[key], rel=1e-6), key
    assert result["per_label"]["names"] == ["blue", "red"]
    ap = result["per_label"]["ap"]
    assert sum(ap) / 2 == pytest.approx(result["test/map"], rel=1e-6)

    # predict.py on the test images: its sets score exactly what evaluate.py measured.
    run_python(
        tmp_path,
        str(PREDICT),
        "ckpt=checkpoints/tags",
        "input=photos/test",
        "out=p.csv",
        "runs=predict-runs",
    )
    rows = table(tmp_path / "p.csv")
    assert list(rows[0]) == ["input", "labels", "p_blue", "p_red"] and len(rows) == 24
    truth = {
        line.split(",")[0].removeprefix("test/"): label_set_of(line.split(",")[1])
        for line in test_manifest.read_text().splitlines()[1:]
    }
    predicted = {r["input"]: label_set_of(r["labels"]) for r in rows}
    subset = sum(predicted[name] == labels for name, labels in truth.items()) / len(truth)
    assert subset == pytest.approx(result["test/subset_acc"], abs=1e-9)
    hits = sum(len(predicted[n] & t) for n, t in truth.items())
    wrong = sum(len(predicted[n] ^ t) for n, t in truth.items())
    assert 2 * hits / (2 * hits + wrong) == pytest.approx(result["test/f1_micro"], abs=1e-9)
    for r in rows:  # the set is the labels at the threshold
        assert label_set_of(r["labels"]) == {
            n for n in ("blue", "red") if float(r[f"p_{n}"]) >= 0.5
        }
    run_python(
        tmp_path,
        str(PREDICT),
        "ckpt=checkpoints/tags",
        "input=photos/test",
        "out=strict.csv",
        "threshold=0.99",
        "runs=predict-runs",
    )
    for r in table(tmp_path / "strict.csv"):
        assert label_set_of(r["labels"]) == {
            n for n in ("blue", "red") if float(r[f"p_{n}"]) >= 0.99
        }
        assert label_set_of(r["labels"]) <= predicted[r["input"]]

    for manifest in (tmp_path / "photos" / "img.csv", test_manifest):  # relabelled since
        manifest.write_text(manifest.read_text().replace("red", "crimson"))
    refused = run_python(
        tmp_path, str(EVALUATE), "ckpt=checkpoints/tags", "runs=eval-runs", ok=False
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        "was trained on classes ['blue', 'red'], and image_csv img.csv holds other ones"
    ) in refused.stderr


def test_an_interrupted_multilabel_run_resumes_bit_identically(tmp_path):
    write_houses(tmp_path / "houses.csv", rows=160)
    run = [
        "task=multilabel",
        "data=csv",
        "data.path=houses.csv",
        "data.target=tags",
        FEATURES,
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "model.hidden_sizes=[16]",
        "model.dropout=0.2",
        "data.batch_size=8",
        "data.augment.mixup_alpha=0.4",
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=4",
    ]
    tags = ("train/loss", "val/loss", "val/map", "val/f1_macro")
    a, b = straight_and_resumed(tmp_path, run, at=17, tags=tags)
    assert a["global_step"] == b["global_step"] > 17
    assert a["classes"] == ["big", "quiet", "sunny"]


def test_a_builder_naming_num_outputs_gets_the_number_of_values(tmp_path):

    search = user_conf(tmp_path, {"model/linear.yaml": "_target_: examples_net.linear\n"})
    x = torch.randn(400, 3, generator=torch.Generator().manual_seed(0))
    torch.save(
        {"x": x, "y": torch.stack([x.sum(1), x[:, 0] - x[:, 2]], dim=1)}, tmp_path / "values.pt"
    )
    run_train(
        tmp_path,
        search,
        "model=linear",
        "task=regression",
        "data=tensors",
        "data.path=values.pt",
        "data.batch_size=16",
        "optim.lr=0.05",
        "trainer.max_epochs=10",
        "run_name=lin",
    )
    metrics = read_metrics(tmp_path / "runs" / "lin")
    assert metrics["test/r2"] > 0.99  # both targets are linear in x
    weights = load_checkpoint(tmp_path / "checkpoints" / "lin" / "best.pt")["model"]
    assert weights["1.weight"].shape == (2, 3)


# One rule, every task: a model whose output width is wrong is refused at start-up, naming
# the builder, what it outputs and what the task needs; nothing is saved.
@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ([], "expected [10] class scores (the dataset's classes)"),
        (REGRESSION[:5], "expected [2] values (the dataset's targets)"),
        (
            ["task=multilabel", "data=tensors", "data.path=labels.pt"],
            "expected [5] label scores (the dataset's labels)",
        ),
    ],
    ids=["classification", "regression", "multilabel"],
)
def test_a_wrong_output_width_names_the_builder_and_what_the_task_needs(tmp_path, task, expected):
    search = user_conf(tmp_path, {"model/three.yaml": "_target_: examples_net.three_outputs\n"})
    write_houses(tmp_path / "houses.csv", rows=60)
    generator = torch.Generator().manual_seed(0)
    torch.save(
        {
            "x": torch.randn(60, 4, generator=generator),
            "y": (torch.rand(60, 5, generator=generator) > 0.5).float(),
        },
        tmp_path / "labels.pt",
    )
    result = run_train(
        tmp_path,
        search,
        "model=three",
        *task,
        "data.batch_size=8",
        "trainer.max_epochs=1",
        ok=False,
    )
    assert result.returncode == 2
    assert f"examples_net.three_outputs outputs [3] per sample, {expected}" in result.stderr
    assert not list((tmp_path / "checkpoints").rglob("*.pt"))  # nothing saved


def test_a_lazy_model_of_the_right_width_trains_saves_and_evaluates(tmp_path):
    # nn.LazyLinear takes its shape in the start-up check's dummy forward: its weights must
    # be ordinary parameters afterwards (under inference_mode they could not even be checked
    # for NaN before the first checkpoint).
    search = user_conf(tmp_path, {"model/three.yaml": "_target_: examples_net.three_outputs\n"})
    write_houses(tmp_path / "houses.csv", rows=60)
    run_train(
        tmp_path,
        search,
        "model=three",
        "task=multilabel",
        "data=csv",
        "data.path=houses.csv",
        "data.target=tags",
        FEATURES,
        "data.batch_size=8",
        "trainer.max_epochs=2",
        "run_name=lazy",
    )
    weights = load_checkpoint(tmp_path / "checkpoints" / "lazy" / "best.pt")["model"]
    assert weights["1.weight"].shape == (3, 4)  # the 4 features, the 3 labels
    assert "test/map" in read_metrics(tmp_path / "runs" / "lazy")


def test_zero_one_columns_are_label_sets_and_tensors_hold_every_kind(tmp_path):
    from data.arrays.tensors import load_tensors
    from data.tables.tabular import load_csv

    write_houses(tmp_path / "houses.csv", rows=100)
    split = {"val_path": None, "test_path": None, "val": 0.2, "test": 0.2, "seed": 0}
    batching = {
        "batch_size": 8,
        "eval_batch_size": 64,
        "augment": {"crop_padding": 0, "horizontal_flip": False},
    }
    data = load_csv(
        str(tmp_path / "houses.csv"),
        ["sunny", "quiet"],
        ["rooms", "area", "age", "floor"],
        [],
        split,
        targets="label_sets",
        **batching,
    )
    rows = table(tmp_path / "houses.csv")
    every = torch.cat([data.splits[s].labels for s in ("train", "val", "test")])
    assert data.targets.kind == "label_sets" and data.classes == ["sunny", "quiet"]
    assert every.sum(dim=0).tolist() == [sum(int(r[c]) for r in rows) for c in ("sunny", "quiet")]

    x = torch.randn(50, 3)
    torch.save({"x": x, "y": x.sum(dim=1)}, tmp_path / "values.pt")
    torch.save({"x": x, "y": (x > 0).long()}, tmp_path / "sets.pt")
    values = load_tensors(
        str(tmp_path / "values.pt"), None, split, None, None, targets="values", **batching
    )
    sets = load_tensors(
        str(tmp_path / "sets.pt"), None, split, None, None, targets="label_sets", **batching
    )
    assert values.targets.count == 1 and values.splits["train"].labels.shape[1] == 1
    assert sets.targets.count == 3 and sets.splits["train"].labels.dtype == torch.float32
    torch.save({"x": x, "y": x}, tmp_path / "bad.pt")  # floats are not label sets
    with pytest.raises(Exception, match="label sets must be 0/1, and sample 0 has"):
        load_tensors(
            str(tmp_path / "bad.pt"), None, split, None, None, targets="label_sets", **batching
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task=regression"],
            "task=regression learns numbers (data=csv, data=tensors or "
            "data=image_csv), and data.images.digits.load_digits reads class labels only",
        ),
        (
            ["task=regression", "data=csv", "data.path=houses.csv", "data.target=tags"],
            "houses.csv line 2, column 'tags': ",
        ),
        (
            ["task=multilabel", "data=csv", "data.path=houses.csv", "data.target=[price]"],
            "column 'price': '",
        ),
        (
            [
                "task=regression",
                "data=csv",
                "data.path=houses.csv",
                "data.target=price",
                "data.augment.mixup_alpha=0.2",
            ],
            "targets are values (task=regression): set both to 0",
        ),
        (
            [
                "task=regression",
                "data=csv",
                "data.path=houses.csv",
                "data.target=price",
                "trainer.monitor=val/acc",
            ],
            "trainer.monitor='val/acc' is not measured; use one of "
            "['val/loss', 'val/mae', 'val/rmse', 'val/r2']",
        ),
        (
            [
                "task=multilabel",
                "task.pos_weight=[1,2]",
                "data=csv",
                "data.path=houses.csv",
                "data.target=tags",
            ],
            "task.pos_weight has 2 values; csv houses.csv has 3 labels",
        ),
        (["task=regression", "task.loss=hinge"], "task.loss="),
    ],
)
def test_data_the_task_cannot_learn_is_refused_in_one_line(tmp_path, overrides, message):
    write_houses(tmp_path / "houses.csv", rows=60)
    result = run_train(
        tmp_path,
        *overrides,
        FEATURES if "data=csv" in overrides else "seed=0",
        "data.batch_size=8",
        "trainer.max_epochs=1",
        ok=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr.strip().splitlines()[-1]
    assert not list(tmp_path.rglob("*.pt"))


def test_average_precision_is_the_step_sum_with_ties_as_one_threshold():
    from utils.evaluation.metrics import average_precisions

    scores = torch.tensor([[0.9, 0.9], [0.8, 0.5], [0.7, 0.5], [0.6, 0.1]])
    truth = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    first, tied = average_precisions(scores, truth)
    assert first == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)  # positives at ranks 1 and 3
    assert tied == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)  # 0.5 twice: 2 of 3 right at once
    (none,) = average_precisions(scores[:, :1], torch.zeros(4, 1))
    assert math.isnan(none)


def test_label_set_and_value_scores_equal_their_definitions_over_any_batching():
    from utils.evaluation.metrics import LabelSetScores, ValueScores
    from utils.tasks import RegressionLoss, TargetScale

    generator = torch.Generator().manual_seed(0)
    logits, truth = torch.randn(40, 3, generator=generator), torch.rand(40, 3, generator=generator)
    truth = (truth > 0.6).float()
    truth[:, 2] = 0  # a label that never occurs: F1 0, left out of mAP
    whole, cut = LabelSetScores(3, 0.5), LabelSetScores(3, 0.5)
    whole.add(logits, truth)
    for lo in range(0, 40, 7):
        cut.add(logits[lo : lo + 7], truth[lo : lo + 7])
    a, b = whole.result(torch.device("cpu")), cut.result(torch.device("cpu"))
    assert a == pytest.approx(b)
    predicted = logits >= 0
    tp = (predicted & (truth > 0)).sum(0).double()
    fp, fn = (predicted & (truth == 0)).sum(0).double(), (~predicted & (truth > 0)).sum(0).double()
    assert a["f1_micro"] == pytest.approx(
        float(2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()))
    )
    f1 = [
        float(2 * t / (2 * t + p + n)) if t + p + n else 0.0
        for t, p, n in zip(tp, fp, fn, strict=True)
    ]
    assert a["f1_macro"] == pytest.approx(sum(f1) / 3)
    assert a["subset_acc"] == pytest.approx(float((predicted == (truth > 0)).all(1).float().mean()))
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, truth)
    assert a["loss"] == pytest.approx(float(bce), rel=1e-5)

    targets = torch.randn(30, 2, generator=generator) * torch.tensor([50.0, 0.5]) + 100
    outputs = torch.randn(30, 2, generator=generator)
    scale = TargetScale([100.0, 100.0], [50.0, 0.5], [100.0, 100.0], torch.device("cpu"))
    scores = ValueScores(RegressionLoss("mse", 1.0, scale), scale, detailed=True)
    for lo in range(0, 30, 8):
        scores.add(outputs[lo : lo + 8], targets[lo : lo + 8])
    metrics = scores.result(torch.device("cpu"))
    predicted = outputs * torch.tensor([50.0, 0.5]) + 100
    error = (predicted - targets).double()
    r2 = 1 - error.square().sum(0) / (targets.double() - targets.double().mean(0)).square().sum(0)
    assert metrics["mae"] == pytest.approx(float(error.abs().mean(0).mean()), rel=1e-6)
    assert metrics["rmse"] == pytest.approx(float(error.square().mean(0).sqrt().mean()), rel=1e-6)
    assert metrics["per_target"]["r2"] == pytest.approx(r2.tolist(), rel=1e-6)
    standardised = (targets - 100) / torch.tensor([50.0, 0.5])
    assert metrics["loss"] == pytest.approx(float(((outputs - standardised) ** 2).mean()), rel=1e-5)
    assert metrics["per_target"]["max_abs_error"] == pytest.approx(
        error.abs().max(0).values.tolist()
    )


def test_each_regression_criterion_is_torchs_on_the_scaled_targets():
    from utils.tasks import RegressionLoss, TargetScale

    generator = torch.Generator().manual_seed(3)
    outputs, targets = torch.randn(16, 2, generator=generator), torch.randn(16, 2) * 40 + 300
    scale = TargetScale([300.0, 300.0], [40.0, 40.0], [300.0, 300.0], torch.device("cpu"))
    scaled = (targets - 300) / 40
    F = torch.nn.functional
    assert RegressionLoss("mse", 1.0, scale)(outputs, targets) == pytest.approx(
        float(F.mse_loss(outputs, scaled)), rel=1e-6
    )
    assert RegressionLoss("l1", 1.0, scale)(outputs, targets) == pytest.approx(
        float(F.l1_loss(outputs, scaled)), rel=1e-6
    )
    assert RegressionLoss("huber", 0.3, scale)(outputs, targets) == pytest.approx(
        float(F.huber_loss(outputs, scaled, delta=0.3)), rel=1e-6
    )
    assert RegressionLoss("huber", 0.3, scale)(outputs, targets) != pytest.approx(
        float(F.huber_loss(outputs, scaled, delta=1.0)), rel=1e-3
    )


def test_a_record_written_before_tasks_existed_is_a_classifiers():
    from utils.checkpoint.record import InputRecord

    record = {
        "shape": [1, 8, 8],
        "mean": [0.5],
        "std": [0.2],
        "num_classes": 10,
        "classes": None,
        "table": None,
    }
    read = InputRecord.read(record, Path("old.pt"))
    assert read.targets.kind == "classes" and read.class_names[:2] == ["0", "1"]
    record["targets"] = {"kind": "values", "count": 3, "names": None}
    with pytest.raises(Exception, match="targets record is not what torchloom writes"):
        InputRecord.read(record, Path("edited.pt"))
