"""How far a classifier's probabilities can be trusted (utils/evaluation/metrics.py calibration,
utils/evaluation/calibration.py): ECE and MCE worked by hand with confidences of exactly 0 and 1,
evaluate.py's reliability table and diagram, ROC-AUC and AP with ties, F1-best thresholds and
temperatures, hostile calibration records, and calibrate=/threshold= through evaluate.py,
predict.py and the ONNX export."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    PREDICT,
    raw_columns,
    run_evaluate,
    run_python,
    run_train,
    write_imagefolder,
    write_rows,
    write_table,
)

from utils.errors import UserError
from utils.evaluation.metrics import calibration


def test_ece_and_mce_by_hand_with_confidences_of_exactly_0_and_1():
    confidence = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.07])
    correct = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])
    result = calibration(confidence, correct)
    # bins (lo, hi] of width 1/15: 0 -> bin 0, 0.07 -> bin 1, 0.5 -> bin 7, 1.0 -> bin 14
    assert [row["count"] for row in result["reliability"]] == [
        1,
        1,
        0,
        0,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        0,
        0,
        0,
        2,
    ]
    assert result["ece"] == pytest.approx((0 + 0.93 + 0.5 + 2 * 0.5) / 5)
    assert result["mce"] == pytest.approx(0.93)
    top = result["reliability"][14]
    assert (top["hi"], top["accuracy"], top["confidence"]) == (1.0, 0.5, 1.0)


def test_a_perfectly_calibrated_bin_has_no_gap():
    confidence = torch.full((8,), 0.75)  # exact in float32
    correct = torch.tensor([1.0] * 6 + [0.0] * 2)
    assert calibration(confidence, correct)["ece"] == pytest.approx(0.0, abs=1e-12)


def test_evaluate_reports_calibration_and_writes_the_reliability_table(tmp_path):
    run_train(tmp_path, "run_name=r", "trainer.max_epochs=2")
    result = run_evaluate(tmp_path, "ckpt=checkpoints/r/best.pt", "runs=out")
    (run_dir,) = list((tmp_path / "out" / "eval").iterdir())
    metrics = next(iter(json.loads((run_dir / "metrics.json").read_text()).values()))
    for name in ("nll", "brier", "ece", "mce"):
        assert 0 <= metrics[f"test/{name}"] < 2, name
    assert metrics["test/nll"] == metrics["test/loss"]
    with open(run_dir / "reliability.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 15 and sum(int(r["count"]) for r in rows) == 360  # every test sample
    ece = sum(int(r["count"]) / 360 * float(r["gap"]) for r in rows)
    assert ece == pytest.approx(metrics["test/ece"])
    assert (run_dir / "reliability.png").stat().st_size > 100
    assert "test/ece" in result.stdout


# --- Ranking figures, thresholds and temperatures (utils/evaluation/calibration.py) -------------------


def test_roc_auc_and_average_precision_by_hand_with_ties():
    from utils.evaluation.calibration import roc_aucs
    from utils.evaluation.metrics import average_precisions

    scores = torch.tensor([[0.9], [0.8], [0.8], [0.8], [0.1]])
    truth = torch.tensor([[1.0], [1.0], [0.0], [0.0], [0.0]])
    # positive 0.9 beats 3 negatives; 0.8 ties two (1/2 each) and beats 0.1: (3 + 2) / 6
    assert roc_aucs(scores, truth) == [pytest.approx(5 / 6)]
    # thresholds 0.9 (P 1, R 1/2) and 0.8 (P 2/4, R 1): 1/2 * 1 + 1/2 * 1/2
    assert average_precisions(scores, truth) == [pytest.approx(0.75)]
    assert math.isnan(roc_aucs(scores, torch.ones(5, 1))[0])  # no negative: undefined


def test_the_f1_best_threshold_by_hand_lies_between_scores_and_gives_its_f1():
    from utils.evaluation.calibration import f1_thresholds

    scores = torch.tensor([[0.9], [0.7], [0.7], [0.2]])
    truth = torch.tensor([[1.0], [1.0], [0.0], [0.0]])
    # p >= 0.9: F1 2/3; p >= 0.7: 4/5; p >= 0.2: 4/6. Halfway from 0.7 to the next, 0.2.
    thresholds, f1 = f1_thresholds(scores, truth, default=0.5)
    assert thresholds == [pytest.approx(0.45)] and f1 == [pytest.approx(0.8)]
    thresholds, f1 = f1_thresholds(scores, torch.zeros(4, 1), default=0.3)
    assert (thresholds, f1) == ([0.3], [0.0])  # no positive: the default stays


def test_a_temperature_of_one_reproduces_the_uncalibrated_figures_and_a_fit_lowers_nll():
    from utils.evaluation.calibration import Calibration, fit_temperature
    from utils.evaluation.metrics import ClassScores

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (400,), generator=generator)
    logits = torch.randn(400, 4, generator=generator) + 1.5 * torch.nn.functional.one_hot(labels, 4)
    logits = logits * 6  # overconfident

    def figures(calibrated):
        scores = ClassScores(4, confusion=True, calibrated=calibrated)
        scores.add(logits, labels)
        return scores.result(torch.device("cpu"))

    plain, one = figures(None), figures(Calibration(1.0))
    assert all(one[k] == plain[k] for k in ("loss", "acc", "brier", "ece", "mce"))
    temperature = fit_temperature(
        logits, lambda z: float(torch.nn.functional.cross_entropy(z, labels))
    )
    fitted = figures(Calibration(temperature))
    assert temperature > 1 and fitted["nll"] < plain["nll"] and fitted["acc"] == plain["acc"]


HOSTILE_RECORDS = [
    ({"temperature": 0}, "temperature 0 is not a number"),
    ({"temperature": -2.0}, "temperature -2.0 is not a number"),
    ({"temperature": float("nan")}, "temperature nan is not a number"),
    ({"temperature": True}, "temperature True is not a number"),
    ({"thresholds": [0.5, 1.0]}, "threshold 1.0 is not between 0 and 1"),
    ({"thresholds": [0.0, 0.5]}, "threshold 0.0 is not between 0 and 1"),
    ({"thresholds": [0.5]}, "holds 1 thresholds and the model decides 2"),
    ({"thresholds": "0.5"}, "holds no list of thresholds"),
    ({"weights": "teacher"}, "names weights 'teacher'"),
    ("cool", "is not a mapping"),
]


def test_a_temperature_that_runs_to_its_bound_on_a_separated_val_split_is_refused():
    from utils.evaluation.calibration import fit_temperature

    logits = torch.tensor([[3.0, -1.0], [-2.0, 1.0], [0.5, 0.0]])
    right = torch.tensor([0, 1, 0])  # every argmax right: a lower T always lowers the NLL

    with pytest.raises(UserError, match=r"val split's 3 outputs are all right.*T=0.001"):
        fit_temperature(logits, lambda z: float(F.cross_entropy(z, right)))
    wrong = torch.tensor([0, 1, 1])  # one mistake: a finite minimum, fitted
    assert 0.001 < fit_temperature(logits, lambda z: float(F.cross_entropy(z, wrong))) < 1000
    labels = (logits > 0).float()  # the variant: label sets, each decided right (or a tie)
    with pytest.raises(UserError, match="outputs are all right"):
        fit_temperature(logits, lambda z: float(F.binary_cross_entropy_with_logits(z, labels)))


@pytest.mark.parametrize(("record", "message"), HOSTILE_RECORDS)
def test_a_hostile_calibration_record_is_refused_in_one_line(record, message):
    from utils.errors import UserError
    from utils.evaluation.calibration import Calibration

    with pytest.raises(UserError, match=re.escape(message)):
        Calibration.read(record, 2, "best.pt")


# --- Through the entry points: fitted on val, stored, applied by predict.py and ONNX --------


def write_split_tables(root, rows=(360, 120, 120)):
    """A binary table in three files (train, val, test) so predict.py can score each split."""
    for name, count, seed in zip(("train", "val", "test"), rows, (0, 1, 2), strict=True):
        write_table(root / f"{name}.csv", rows=count, seed=seed)


BINARY = [
    "data=csv",
    "data.path=train.csv",
    "data.split.val_path=val.csv",
    "data.split.test_path=test.csv",
    "data.target=kind",
    "data.categorical=[colour]",
    "trainer.max_epochs=6",
    "run_name=b",
]


def predicted(cwd, name):
    with open(cwd / name, newline="") as f:
        return list(csv.DictReader(f))


def test_calibrate_fits_on_val_stores_the_record_and_predict_reproduces_every_figure(tmp_path):
    write_split_tables(tmp_path)
    run_train(tmp_path, *BINARY)
    best = tmp_path / "checkpoints/b/best.pt"
    weights = torch.load(best, weights_only=True)["model"]
    # Fitted on val, always; shown before and after on the test split by default.
    fitted = run_evaluate(
        tmp_path, "ckpt=checkpoints/b", "calibrate=temperature", "threshold=auto", "runs=fit"
    )
    assert "calibration fitted on val, shown on test: temperature" in fitted.stdout
    assert "threshold=auto picks the F1-best threshold, which can lower accuracy" in fitted.stdout
    stored = torch.load(best, weights_only=True)
    record = stored["inputs"]["calibration"]
    assert record["split"] == "val" and len(record["thresholds"]) == 1
    assert all(torch.equal(stored["model"][k], weights[k]) for k in weights)  # weights kept
    (fit_dir,) = (tmp_path / "fit/eval").iterdir()
    fit = next(iter(json.loads((fit_dir / "metrics.json").read_text()).values()))
    assert set(fit["before"]) >= {"test/nll", "test/acc"} and "val/nll" not in fit["before"]
    # Evaluating the calibrated checkpoint says what it applies, and records it.
    shown = run_evaluate(tmp_path, "ckpt=checkpoints/b", "runs=test")
    assert f"applying its stored calibration: temperature {record['temperature']:.4g}" in (
        shown.stdout
    )
    (test_dir,) = (tmp_path / "test/eval").iterdir()
    test = next(iter(json.loads((test_dir / "metrics.json").read_text()).values()))
    assert test["calibration"] == record
    assert test["test/nll"] == pytest.approx(fit["test/nll"])  # the same figures as the fit's
    # split=val shows the split it was fitted on, and says so.
    on_val = run_evaluate(
        tmp_path, "ckpt=checkpoints/b", "split=val", "calibrate=temperature", "runs=fit-val"
    )
    assert "shown on val, the split it was fitted on: optimistic" in on_val.stdout
    record = torch.load(best, weights_only=True)["inputs"]["calibration"]
    run_evaluate(
        tmp_path, "ckpt=checkpoints/b", "calibrate=temperature", "threshold=auto", "runs=fit-again"
    )
    record = torch.load(best, weights_only=True)["inputs"]["calibration"]
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/b", "input=test.csv", "out=p.csv")
    rows, truth = predicted(tmp_path, "p.csv"), [r["kind"] for r in predicted(tmp_path, "test.csv")]
    threshold = record["thresholds"][0]
    second = torch.tensor([float(r["p_small"]) for r in rows], dtype=torch.float64)
    assert [r["class"] for r in rows] == [
        "small" if p >= threshold else "big" for p in second.tolist()
    ]
    labels = torch.tensor([t == "small" for t in truth], dtype=torch.float64)
    accuracy = float(((second >= threshold).double() == labels).double().mean())
    nll = float(-torch.where(labels == 1, second, 1 - second).clamp(min=1e-300).log().mean())
    from utils.evaluation.calibration import roc_aucs

    assert test["test/acc"] == pytest.approx(accuracy, abs=1e-6)  # fp32 sums
    assert test["test/nll"] == pytest.approx(nll, rel=1e-4, abs=1e-6)
    assert test["test/auroc"] == pytest.approx(roc_aucs(second[:, None], labels[:, None])[0])
    probabilities = torch.stack([1 - second, second], dim=1)
    confidence, most = probabilities.max(dim=1)
    ece = calibration(confidence, (most.double() == labels).double())["ece"]
    assert test["test/ece"] == pytest.approx(ece, abs=1e-5)
    # The ONNX export decides as predict.py does.
    ort = pytest.importorskip("onnxruntime")
    run_evaluate(tmp_path, "ckpt=checkpoints/b", "export=b.onnx", "runs=export")
    session = ort.InferenceSession(str(tmp_path / "b.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits", "predicted"]
    features = raw_columns(tmp_path / "test.csv", stored["inputs"]["table"])  # the raw rows
    logits, decided = session.run(None, {"input": features.numpy()})
    assert decided.tolist() == [int(r["class"] == "small") for r in rows]  # predict's classes
    exported = torch.softmax(torch.from_numpy(logits).double(), dim=1)[:, 1]  # divided by T
    assert exported.tolist() == pytest.approx(second.tolist(), abs=1e-5)
    # So does the torch.export program, which folds in the same temperature and threshold.
    run_evaluate(tmp_path, "ckpt=checkpoints/b", "export=b.pt2", "runs=export")
    logits, decided = torch.export.load(tmp_path / "b.pt2").module()(features)
    assert decided.tolist() == [int(r["class"] == "small") for r in rows]
    exported = torch.softmax(logits.double(), dim=1)[:, 1]
    assert exported.tolist() == pytest.approx(second.tolist(), abs=1e-5)


def test_a_hostile_calibration_in_a_checkpoint_stops_predict_in_one_line(tmp_path):
    write_split_tables(tmp_path, rows=(120, 60, 60))
    run_train(tmp_path, *BINARY[:-2], "trainer.max_epochs=1", "run_name=h")
    best = tmp_path / "checkpoints/h/best.pt"
    checkpoint = torch.load(best, weights_only=True)
    checkpoint["inputs"]["calibration"] = {"temperature": 0.0, "thresholds": None}
    torch.save(checkpoint, best)
    result = run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/h", "input=test.csv", ok=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "temperature 0.0" in lines[0]
    assert not (tmp_path / "predictions.csv").exists()
    # The fix the line names works: calibrating again replaces the unreadable record.
    run_evaluate(tmp_path, "ckpt=checkpoints/h", "split=val", "calibrate=temperature", "runs=fit")
    replaced = torch.load(best, weights_only=True)["inputs"]["calibration"]
    assert replaced["temperature"] > 0
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/h", "input=test.csv")


def write_skewed_labels(path, rows, seed):
    """Three rare labels (about 6 %, 10 % and 15 % of rows), each noisily set by a feature."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, generator=generator)
    noisy = x + 0.8 * torch.randn(rows, 3, generator=generator)
    cuts = torch.tensor([1.55, 1.28, 1.04])
    tags = [
        ";".join(n for n, on in zip("abc", row, strict=True) if on)
        for row in (noisy > cuts).tolist()
    ]
    write_rows(
        path,
        ["f0", "f1", "f2", "tags"],
        [[*map(repr, v), t] for v, t in zip(x.tolist(), tags, strict=True)],
    )


def test_threshold_auto_beats_one_half_on_a_skewed_multilabel_set(tmp_path):
    for name, rows, seed in (("train", 600, 0), ("val", 300, 1), ("test", 300, 2)):
        write_skewed_labels(tmp_path / f"{name}.csv", rows, seed)
    run_train(
        tmp_path,
        "task=multilabel",
        "data=csv",
        "data.path=train.csv",
        "data.split.val_path=val.csv",
        "data.split.test_path=test.csv",
        "data.target=tags",
        "trainer.max_epochs=8",
        "model=mlp",  # the rare labels' thresholds below 1/2: a property of this model's fit
        "run_name=m",
    )
    run_evaluate(tmp_path, "ckpt=checkpoints/m", "split=val", "threshold=auto", "runs=fit")
    (fit_dir,) = (tmp_path / "fit/eval").iterdir()
    fit = next(iter(json.loads((fit_dir / "metrics.json").read_text()).values()))
    assert fit["val/f1_macro"] > fit["before"]["val/f1_macro"]
    thresholds = fit["calibration"]["thresholds"]
    assert len(thresholds) == 3 and all(0 < t < 0.5 for t in thresholds)  # rare: below 1/2
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/m", "input=val.csv", "out=v.csv")
    rows = predicted(tmp_path, "v.csv")
    for row in rows:  # the labels are those at each label's stored threshold
        chosen = {n for n, t in zip("abc", thresholds, strict=True) if float(row[f"p_{n}"]) >= t}
        assert set(filter(None, row["labels"].split(";"))) == chosen
    ort = pytest.importorskip("onnxruntime")  # and the ONNX export decides the same
    run_evaluate(tmp_path, "ckpt=checkpoints/m", "export=m.onnx", "runs=export")
    inputs = torch.load(tmp_path / "checkpoints/m/best.pt", weights_only=True)["inputs"]
    features = raw_columns(tmp_path / "val.csv", inputs["table"])  # the raw rows
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    _, decided = session.run(None, {"input": features.numpy()})
    assert decided.tolist() == [[int(n in r["labels"].split(";")) for n in "abc"] for r in rows]


def test_a_calibration_applies_to_the_weights_it_was_fitted_on_only(tmp_path):
    write_split_tables(tmp_path, rows=(120, 60, 60))
    run_train(tmp_path, *BINARY[:-2], "trainer.max_epochs=2", "trainer.ema.decay=0.9", "run_name=e")
    run_evaluate(tmp_path, "ckpt=checkpoints/e", "split=val", "threshold=auto", "runs=fit")
    record = torch.load(tmp_path / "checkpoints/e/best.pt", weights_only=True)["inputs"]
    assert record["calibration"]["weights"] == "ema"  # weights=auto: the EMA's
    ema = run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/e", "input=test.csv", "out=a.csv")
    raw = run_python(
        tmp_path, str(PREDICT), "ckpt=checkpoints/e", "input=test.csv", "out=r.csv", "weights=raw"
    )
    assert "class" in predicted(tmp_path, "a.csv")[0]  # decided at the stored threshold
    assert "class1" in predicted(tmp_path, "r.csv")[0]  # not applied: the top classes
    assert "fitted on the ema weights, so it is not applied to the raw" in raw.stdout + raw.stderr
    assert "not applied" not in ema.stdout + ema.stderr


def test_training_on_from_a_calibrated_checkpoint_drops_the_stale_calibration(tmp_path):
    write_split_tables(tmp_path, rows=(120, 60, 60))
    run_train(tmp_path, *BINARY[:-2], "trainer.max_epochs=1", "run_name=c")
    run_evaluate(
        tmp_path, "ckpt=checkpoints/c/last.pt", "split=val", "calibrate=temperature", "runs=fit"
    )
    last = tmp_path / "checkpoints/c/last.pt"
    assert "calibration" in torch.load(last, weights_only=True)["inputs"]
    run_train(
        tmp_path, *BINARY[:-2], "trainer.max_epochs=2", "run_name=c", "resume=checkpoints/c/last.pt"
    )
    resumed = torch.load(last, weights_only=True)
    assert resumed["epoch"] == 2 and "calibration" not in resumed["inputs"]


def test_a_run_without_a_test_split_is_never_calibrated_on_what_it_reported_as_its_test(tmp_path):
    # An image folder without test/: the run reported its val split as its test.
    write_imagefolder(tmp_path / "images", classes=("cat", "dog"), per_class=6, test=False)
    run_train(
        tmp_path,
        "data=imagefolder",
        "data.root=images",
        "data.num_workers=0",
        "data.batch_size=4",
        "model=cnn",
        "trainer.max_epochs=1",
        "run_name=n",
    )
    assert json.loads((tmp_path / "runs/n/metrics.json").read_text())["test_split"] == "val"
    best = tmp_path / "checkpoints/n/best.pt"
    before = best.read_bytes()
    for split in ("val", "train"):
        refused = run_evaluate(
            tmp_path, "ckpt=checkpoints/n", f"split={split}", "calibrate=temperature", ok=False
        )
        assert refused.returncode == 2 and "its run has no test split" in refused.stderr
    assert best.read_bytes() == before
