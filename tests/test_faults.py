"""A NaN loss and an out-of-memory in the middle of training: the run ends with one line that
names where and what to change, and the checkpoint already saved stays intact."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import read_metrics, run_train

from utils.checkpoint.load import load_checkpoint
from utils.fit.loss_sums import LossSums
from utils.fit.nonfinite import MIN_LOSS_SCALE, NonFinite, NonFiniteWatch

FAULTY = ("model=mlp", "model._target_=signalling_model.faulty_mlp", "trainer.max_epochs=3")
# 19 optimizer steps per epoch on digits: forward 30 is in epoch 2.


def test_a_nan_loss_stops_the_run_naming_step_and_parameter(tmp_path):
    result = run_train(
        tmp_path, *FAULTY, "run_name=nan", ok=False, env={"FAULT": "nan", "FAULT_AT": "30"}
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: non-finite loss at optimizer step 30 (lr ")
    assert "first parameter with non-finite gradients or values: inner." in error
    assert "checkpoints/nan/last.pt (epoch 1) is intact" in error
    saved = load_checkpoint(tmp_path / "checkpoints" / "nan" / "last.pt")
    assert saved["epoch"] == 1  # no checkpoint was written from the NaN weights
    assert all(torch.isfinite(w).all() for w in saved["model"].values())


def test_skip_steps_over_a_bad_batch_and_counts_it(tmp_path):
    run_train(
        tmp_path,
        *FAULTY,
        "trainer.nonfinite=skip",
        "run_name=skip",
        env={"FAULT": "nan", "FAULT_AT": "30"},
    )
    metrics = read_metrics(tmp_path / "runs" / "skip")
    assert metrics["train/skipped_steps"] == 1 and metrics["test/acc"] > 0.5
    assert math.isfinite(metrics["train/loss"])


def test_skip_gives_up_after_too_many_bad_steps_in_a_row(tmp_path):
    result = run_train(
        tmp_path,
        *FAULTY,
        "trainer.nonfinite=skip",
        "trainer.max_consecutive_skips=3",
        ok=False,
        env={"FAULT": "nan_from", "FAULT_AT": "30"},
    )
    assert result.returncode == 2
    assert "non-finite loss on 4 optimizer steps in a row" in result.stderr


def test_a_collapsed_fp16_loss_scale_is_an_error_not_a_stall():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=MIN_LOSS_SCALE / 2)
    losses = LossSums(torch.device("cpu"), accumulate=1)

    def parts(scaler):  # what the check reads of a step's parts (utils/fit/loop.py)
        return SimpleNamespace(
            model=model, optimizer=optimizer, precision=SimpleNamespace(scaler=scaler)
        )

    with pytest.raises(NonFinite, match="fp16 loss scale collapsed"):
        NonFiniteWatch("stop", 10, losses).check(0, parts(scaler), "no checkpoint")
    NonFiniteWatch("stop", 10, losses).check(0, parts(torch.amp.GradScaler("cpu")), "none")


def test_out_of_memory_names_the_batch_and_the_remedies_and_keeps_last_pt(tmp_path):
    result = run_train(
        tmp_path, *FAULTY, "run_name=oom", ok=False, env={"FAULT": "oom", "FAULT_AT": "30"}
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert "out of memory on cpu at data.batch_size=64" in error
    assert "data.batch_size=32 with trainer.accumulate_grad_batches=2" in error
    assert "precision=bf16" in error and "tune=batch_size" in error
    assert load_checkpoint(tmp_path / "checkpoints" / "oom" / "last.pt")["epoch"] == 1


def test_loss_sums_name_the_first_nonfinite_step_summed_or_pending():
    """Micro-batch losses, 2 per optimizer step: the NaN in the 6th is in step 3, whether the
    loop has summed it (a logging step) or not yet (a checkpoint between logging steps)."""
    losses = LossSums(torch.device("cpu"), accumulate=2)
    for value in [1.0, 2.0, 3.0, 4.0, 5.0, math.nan, 7.0, 8.0]:
        losses.add(torch.tensor(value))
    assert losses.first_nonfinite_step(step=4) == 3  # pending
    losses.window_mean(step=4)
    losses.add(torch.tensor(math.inf))
    losses.add(torch.tensor(1.0))
    assert losses.first_nonfinite_step(step=5) == 3  # summed; the first one is kept
    clean = LossSums(torch.device("cpu"), accumulate=2)
    clean.add(torch.tensor(1.0))
    clean.add(torch.tensor(2.0))
    assert clean.first_nonfinite_step(step=1) == -1
    assert clean.window_mean(step=1) == 1.5
    assert clean.epoch_mean(step=1, micro_batches=2) == 1.5
    opposite = LossSums(torch.device("cpu"), accumulate=1)  # inf + -inf sums to NaN
    for value in [1.0, math.inf, -math.inf]:
        opposite.add(torch.tensor(value))
    assert math.isnan(opposite.window_mean(step=3)) and opposite.first_nonfinite_step(3) == 2
