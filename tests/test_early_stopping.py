"""trainer.early_stopping: patience counted in validations, min_delta in the monitor's
direction; a run stops at the same epoch with or without a resume in between, says why, and
metrics.json and the sweep summary record it."""

from __future__ import annotations

import csv

import pytest
import torch
from conftest import read_metrics, run_train

from utils.config.monitor import Monitor
from utils.errors import UserError
from utils.fit.early_stopping import EarlyStopping
from utils.fit.state import TrainState

# On digits the val loss never falls by 10: the first validation sets the best, the next two
# do not improve on it, so patience=2 stops the run after epoch 3.
NEVER_BY_10 = (
    "trainer.monitor=val/loss",
    "trainer.early_stopping.patience=2",
    "trainer.early_stopping.min_delta=10",
    "model.hidden_sizes=[16]",
)


@pytest.mark.parametrize(
    ("mode", "values", "stopped"),
    [
        ("max", [0.5, 0.6, 0.605, 0.61, 0.7], 4),  # +0.005 and +0.01 are not improvements by 0.02
        ("min", [1.0, 0.9, 0.95, 0.85, 0.84, 0.83], 6),  # 0.85 improves on 0.9; 0.84, 0.83 do not
    ],
)
def test_patience_counts_validations_without_an_improvement_by_min_delta(mode, values, stopped):
    state = TrainState()
    early = EarlyStopping(2, 0.02, Monitor("val/x", mode), state)
    for epoch, value in enumerate(values, 1):
        early.update(value, epoch)
        if early.done():
            break
    assert early.stopped_at == stopped and state.early_stopping["bad_validations"] == 2
    assert "did not improve by 0.02 for 2 validations" in early.reason
    off = EarlyStopping(None, 0.0, Monitor("val/x", mode), TrainState())
    for epoch, value in enumerate(values, 1):
        off.update(value, epoch)
    assert not off.done() and off.reason is None


def test_a_run_stops_early_says_why_and_still_tests_best(tmp_path):
    result = run_train(tmp_path, *NEVER_BY_10, "trainer.max_epochs=10", "run_name=early")
    metrics = read_metrics(tmp_path / "runs" / "early")
    assert metrics["epochs"] == 3 and metrics["stopped_early_at_epoch"] == 3
    assert metrics["early_stopping"].startswith("val/loss did not improve by 10 for 2 validations")
    assert "best" in metrics["early_stopping"] and metrics["best_epoch"] >= 1
    assert "early stopping after epoch 3: val/loss did not improve" in result.stdout
    assert "test/acc" in metrics and metrics["status"] == "completed"  # best.pt is tested


def test_a_resumed_run_stops_at_the_same_epoch_as_one_that_never_stopped(tmp_path):
    job = (*NEVER_BY_10, "scheduler=none")  # a constant LR: a longer max_epochs changes nothing
    run_train(tmp_path, *job, "trainer.max_epochs=10", "run_name=straight")
    run_train(tmp_path, *job, "trainer.max_epochs=2", "run_name=cut")  # one bad validation so far
    run_train(tmp_path, *job, "trainer.max_epochs=10", "run_name=cut", "resume=auto")
    straight, cut = (read_metrics(tmp_path / "runs" / n) for n in ("straight", "cut"))
    assert cut["stopped_early_at_epoch"] == straight["stopped_early_at_epoch"] == 3
    a, b = (
        torch.load(tmp_path / "checkpoints" / n / "last.pt", weights_only=True)
        for n in ("straight", "cut")
    )
    assert a["early_stopping"] == b["early_stopping"] and a["global_step"] == b["global_step"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # Resuming a run that stopped early trains no further.
    run_train(tmp_path, *job, "trainer.max_epochs=10", "run_name=cut", "resume=auto")
    assert read_metrics(tmp_path / "runs" / "cut")["epochs"] == 3


def test_the_sweep_summary_shows_where_each_job_stopped(tmp_path):
    run_train(tmp_path, "-m", *NEVER_BY_10, "trainer.max_epochs=10", "seed=0,1", "run_name=sw")
    with open(tmp_path / "runs" / "sw" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["stopped_early_at_epoch"] for row in rows] == ["3", "3"]


@pytest.mark.parametrize(
    "edit",
    [
        {"best": "0.9"},
        {"bad_validations": None},
        {"stopped_at": 2.5},
        {"stopped_at": True},
        {"bad_validations": False},
    ],
)
def test_an_edited_early_stopping_state_is_refused_naming_the_key(edit):
    state = TrainState()
    early = EarlyStopping(2, 0.0, Monitor("val/acc", "max"), state)
    early.update(0.5, 1)
    resumed = TrainState()
    resumed.load_state_dict({"early_stopping": {**state.early_stopping, **edit}})
    key = next(iter(edit))
    with pytest.raises(UserError, match=rf"early_stopping\.{key} is"):
        EarlyStopping(2, 0.0, Monitor("val/acc", "max"), resumed).done()


def test_the_count_lives_in_the_state_so_building_the_rule_before_a_resume_loses_nothing():
    # The rule reads the state at every question: built before or after the state is
    # resumed, it sees the resumed count (no line order in train.py matters).
    saved = TrainState()
    EarlyStopping(2, 0.0, Monitor("val/acc", "max"), saved).update(0.5, 1)
    state = TrainState()
    early = EarlyStopping(2, 0.0, Monitor("val/acc", "max"), state)
    state.load_state_dict(saved.state_dict())  # what Checkpointer.start does on a resume
    early.update(0.4, 2)
    assert not early.done() and state.early_stopping["bad_validations"] == 1
    early.update(0.45, 3)
    assert early.done() and early.stopped_at == 3
