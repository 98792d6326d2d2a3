"""The objects train.py is a recipe over: the training state round-trips through a checkpoint
(older checkpoints included), the monitor ranks in its direction, and the checkpointer keeps
last, best and the top k on disk as the state says; train() returns or raises in-process; who
writes is decided once; one rule picks the file in a run's folder."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import compose_train, read_metrics, run_train

from utils.checkpoint.load import TO_EVALUATE, find_checkpoints, load_checkpoint
from utils.config.monitor import Monitor
from utils.errors import UserError
from utils.fit.checkpointer import Checkpointer
from utils.fit.loop import Parts
from utils.fit.loss_sums import LossSums
from utils.fit.nonfinite import NonFiniteWatch
from utils.fit.state import TrainState
from utils.precision import Precision
from utils.run.outputs import Outputs
from utils.run.start import RunContext, RunRecord
from utils.schedulers import StepCounts, none
from utils.system.distributed import Processes
from utils.system.signals import _hold
from utils.tracking.tracker import Tracker

# The top-level keys every checkpoint so far has held for the training state.
STATE_KEYS = {
    "epoch",
    "batch_in_epoch",
    "global_step",
    "best_metric",
    "best_epoch",
    "top_k",
    "metrics",
}


def test_train_state_round_trips_and_reads_older_checkpoints():
    state = TrainState(
        epoch=3,
        batch_in_epoch=5,
        global_step=40,
        best_metric=0.9,
        best_epoch=2,
        top_k=[[0.9, "epoch=002-val_acc=0.9000.pt"]],
        metrics={"val/acc": 0.9},
        skipped_steps=1,
    )
    saved = state.state_dict()
    later = {"skipped_steps", "early_stopping", "elapsed_seconds", "stopped_by", "global_batch"}
    assert set(saved) == STATE_KEYS | later
    assert saved["elapsed_seconds"] > 0  # this segment's time so far
    again = TrainState()
    again.load_state_dict({**saved, "model": {}, "optimizer": {}})
    assert again.elapsed_seconds == saved["elapsed_seconds"]
    again.elapsed_seconds = state.elapsed_seconds
    assert again == state
    older = TrainState()
    older.load_state_dict({key: saved[key] for key in STATE_KEYS})  # before skipped_steps
    assert older.skipped_steps == 0 and older.global_step == 40 and older.elapsed_seconds == 0
    older.next_epoch()
    assert (older.epoch, older.batch_in_epoch) == (4, 0)


def test_the_monitor_ranks_in_its_direction():
    accuracy, loss = Monitor.from_config("val/acc", "auto"), Monitor.from_config("val/loss", "auto")
    assert accuracy.mode == "max" and loss.mode == "min"
    assert accuracy.at_least_as_good(0.5, None) and accuracy.at_least_as_good(0.5, 0.5)
    assert accuracy.better(0.6, 0.5) and not accuracy.better(0.5, 0.5)
    assert loss.better(0.1, 0.2) and not loss.at_least_as_good(0.3, 0.2)
    assert accuracy.worst == -float("inf") and loss.worst == float("inf")


def checkpointer(folder, monitor: str, keep_top_k: int) -> tuple[Checkpointer, TrainState]:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cpu = torch.device("cpu")
    watch = NonFiniteWatch("stop", 0, LossSums(cpu, 1))
    schedule = none(0)(optimizer, StepCounts(1, 10))
    parts = Parts(model, optimizer, schedule, Precision("float32", cpu), watch, F.cross_entropy)
    run = SimpleNamespace(checkpoint_dir=folder, record=RunRecord({"seed": 0}, []), resumed=None)
    context = RunContext(Processes(), cpu, threads=1, writes=True)
    trainer = SimpleNamespace(keep_top_k=keep_top_k, accumulate_grad_batches=1, strategy="auto")
    state = TrainState()
    monitor_ = Monitor.from_config(monitor, "auto")
    return Checkpointer(run, context, parts, state, monitor_, trainer), state


@pytest.mark.parametrize(
    ("monitor", "values", "best_epoch", "kept"),
    [
        (
            "val/acc",
            [0.5, 0.7, 0.6, 0.7],
            4,
            ["epoch=002-val_acc=0.7000.pt", "epoch=004-val_acc=0.7000.pt"],
        ),
        (
            "val/loss",
            [0.9, 0.4, 0.5, None, 0.3],
            5,
            ["epoch=002-val_loss=0.4000.pt", "epoch=005-val_loss=0.3000.pt"],
        ),
    ],
)
def test_the_checkpointer_keeps_last_best_and_the_top_k(
    tmp_path, monitor, values, best_epoch, kept
):
    saver, state = checkpointer(tmp_path, monitor, keep_top_k=2)
    for value in values:  # None: an epoch without validation
        state.next_epoch()
        saver.save_epoch(value)
    assert sorted(p.name for p in tmp_path.glob("epoch=*.pt")) == kept
    assert sorted(name for _, name in state.top_k) == kept
    assert load_checkpoint(tmp_path / "best.pt")["epoch"] == best_epoch == state.best_epoch
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["epoch"] == len(values) and last["monitor"] == monitor
    assert saver.describe() == f"{tmp_path / 'last.pt'} (epoch {len(values)}) is intact"


def test_train_returns_its_best_value_and_raises_bad_input_in_process(tmp_path):
    value = compose_train(
        tmp_path, "trainer.max_epochs=2", "model.hidden_sizes=[16]", "run_name=direct"
    )
    metrics = read_metrics(tmp_path / "runs" / "direct")
    assert value == metrics["best_metric"] and metrics["epochs"] == 2
    assert (tmp_path / "checkpoints" / "direct" / "best.pt").is_file()
    with pytest.raises(UserError, match=r"trainer\.monitor='val/f1' is not measured"):
        compose_train(
            tmp_path, "trainer.monitor=val/f1", "trainer.monitor_mode=max", "run_name=unmeasured"
        )
    assert signal.getsignal(signal.SIGTERM) is not _hold  # stop signals act as before


def test_zero_epochs_sets_everything_up_and_tests_the_initial_weights(tmp_path):
    # What benchmarks/loop_speed.py times as the start-up: every exit of the recipe must hold.
    result = run_train(tmp_path, "trainer.max_epochs=0", "run_name=zero")
    metrics = read_metrics(tmp_path / "runs" / "zero")
    assert result.returncode == 0 and metrics["epochs"] == 0 and "test/acc" in metrics
    assert "train/loss" not in metrics and metrics["best_metric"] is None


@pytest.mark.parametrize(
    "rank, write_outputs, prints, events",
    [
        (0, True, True, True),
        (0, False, True, False),
        (1, True, False, False),
    ],
)
def test_outputs_decide_once_who_prints_and_who_writes_events(
    tmp_path, rank, write_outputs, prints, events
):
    tensorboard = {"tensorboard": {"_target_": "utils.tracking.local.TensorBoard"}}
    out = Outputs(tmp_path, rank == 0, Tracker.of(tensorboard, rank == 0 and write_outputs))
    out.track()
    out.scalars("val", {"acc": 0.5}, 1)
    out.write_json("metrics.json", {"a": 1})
    out.close()
    assert (tmp_path / "metrics.json").exists() == prints
    assert bool(list(tmp_path.glob("events.out.tfevents.*"))) == events
    assert out.console.quiet == (not prints)


def test_one_rule_picks_the_file_in_a_run_folder_for_resume_and_for_evaluation(tmp_path):
    for index, name in enumerate(
        ["epoch=001-val_acc=0.5000.pt", "best.pt", "last.pt", "epoch=002-val_acc=0.6000.pt"]
    ):
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (1000 + index, 1000 + index))
    names = [p.name for p in find_checkpoints(tmp_path)]
    assert names == [
        "last.pt",
        "epoch=002-val_acc=0.6000.pt",
        "best.pt",
        "epoch=001-val_acc=0.5000.pt",
    ]
    assert find_checkpoints(tmp_path, prefer=TO_EVALUATE)[0].name == "best.pt"
    (tmp_path / "best.pt").unlink()
    (tmp_path / "last.pt").unlink()
    assert find_checkpoints(tmp_path, prefer=TO_EVALUATE)[0].name == "epoch=002-val_acc=0.6000.pt"
