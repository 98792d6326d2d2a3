"""How far a classifier's probabilities can be trusted (utils/evaluation.py calibration):
ECE and MCE worked by hand with confidences of exactly 0 and 1, and evaluate.py's
reliability table and diagram."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from conftest import run_evaluate, run_train

from utils.evaluation import calibration


def test_ece_and_mce_by_hand_with_confidences_of_exactly_0_and_1():
    confidence = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.07])
    correct = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])
    result = calibration(confidence, correct)
    # bins (lo, hi] of width 1/15: 0 -> bin 0, 0.07 -> bin 1, 0.5 -> bin 7, 1.0 -> bin 14
    assert [row["count"] for row in result["reliability"]] == [1, 1, 0, 0, 0, 0, 0, 1,
                                                               0, 0, 0, 0, 0, 0, 2]  # fmt: skip
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
