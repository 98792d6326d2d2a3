"""SIGKILL at the moments a tracked history could run ahead of, or fall behind, the checkpoint
— mid-step, half-way through a checkpoint write, after a checkpoint is written but before
MLflow and W&B get its points, after MLflow got them but W&B not, mid-evaluation — each
followed by ``resume=auto``: every backend ends with one run whose history equals an
uninterrupted run's, step for step, with no duplicates and no gaps."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from harness import ROOT, report, run

sys.path.insert(0, str(ROOT / "tests" / "helpers"))
import histories as read

pytestmark = pytest.mark.slow
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

LOGGERS = ("logger=[tensorboard,csv,mlflow,wandb]",)
ENV = {"WANDB_SILENT": "true"}
# Each resumed attempt counts its own events from 1 (3 epochs of 39 steps, a checkpoint each).
KILLS = (
    "train_step:50",
    "history_send:1",
    "mlflow_sent:1",
    "checkpoint_write:1",
    "mlflow_sent:2",
    "eval_batch:1",
)


def logged(cwd, name: str) -> dict:
    run_dir, store = cwd / "runs" / name, f"sqlite:///{cwd / 'runs' / 'mlflow.db'}"
    runs = read.mlflow_runs(store, name)
    ids = {a["id"] for a in read.wandb_attempts(run_dir)}
    assert len(runs) == 1 and len(ids) == 1, (len(runs), ids)
    return {
        "tensorboard": read.comparable(read.tensorboard_history(run_dir)),
        "csv": read.comparable(read.csv_history(run_dir)),
        "mlflow": read.comparable(read.mlflow_history(store, runs[0].info.run_id)),
        "wandb": read.comparable(read.wandb_history(run_dir, ids.pop())),
        "status": runs[0].info.status,
    }


def test_sigkill_around_checkpoints_leaves_every_history_as_an_uninterrupted_run(tmp_path):
    code, _, err = run(tmp_path, "run_name=straight", *LOGGERS, env=ENV)
    assert code == 0, err[-3000:]
    reference = logged(tmp_path, "straight")
    killed = 0
    for kill in KILLS:
        code, _, err = run(
            tmp_path, "run_name=chain", "resume=auto", *LOGGERS, env={**ENV, "KILL_AT": kill}
        )
        assert code in (0, -signal.SIGKILL), f"{kill}: exited {code}\n{err[-3000:]}"
        killed += code == -signal.SIGKILL
    code, _, err = run(tmp_path, "run_name=chain", "resume=auto", *LOGGERS, env=ENV)
    assert code == 0, err[-3000:]
    resumed = logged(tmp_path, "chain")
    rows = [(r["step"], r["tag"]) for r in read.csv_rows(tmp_path / "runs" / "chain")]
    equal = [b for b in ("tensorboard", "csv", "mlflow", "wandb") if resumed[b] == reference[b]]
    report(
        "tracked history",
        kills=killed,
        equal_backends=f"{len(equal)}/4",
        csv_duplicates=len(rows) - len(set(rows)),
    )
    assert killed == len(KILLS)
    assert resumed["status"] == "FINISHED"
    assert len(rows) == len(set(rows))
    for backend in ("tensorboard", "csv", "mlflow", "wandb"):
        assert resumed[backend] == reference[backend], backend


def alive_with(marker: str) -> list[int]:
    """The processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:  # it ended meanwhile
                pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tracker forks on Linux")
def test_the_trackers_process_ends_with_a_training_process_killed_by_sigkill(tmp_path):
    # The tracker's process is a fork of the training process (same command line). Its pipe
    # must end when the training process does, or it waits for ever, orphaned.
    marker = f"run_name=orphan-{tmp_path.name}"
    code, _, err = run(tmp_path, marker, "logger=mlflow", env={"KILL_AT": "train_step:3"})
    assert code == -signal.SIGKILL, err[-3000:]
    deadline = time.monotonic() + 60  # the fork sees the pipe's end at once; a bound, not a rate
    while alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive_with(marker) == []
