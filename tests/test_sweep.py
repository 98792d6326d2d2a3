"""Multirun sweeps through the real ``train.py -m``: a job per run dir and checkpoint folder, a
failed job recorded while the others finish, the summary table and files, mean ± std over
seeds, and a re-run that skips finished jobs and resumes unfinished ones."""

from __future__ import annotations

import csv
import json
import signal

import pytest
import torch
from conftest import run_train

from utils.errors import EXIT_USER_ERROR
from utils.run.sweep import EXIT_JOBS_FAILED
from utils.system.signals import EXIT_INTERRUPTED, StopRequest

TINY = ("trainer.max_epochs=1", "model.hidden_sizes=[32]")


def summary(cwd, run_name):
    folder = cwd / "runs" / run_name
    rows = list(csv.DictReader((folder / "summary.csv").read_text().splitlines()))
    return rows, json.loads((folder / "summary.json").read_text())


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("grid")
    result = run_train(cwd, "-m", "run_name=grid", "optim=sgd,adamw", "optim.lr=0.05,0.005", *TINY)
    return cwd, result


def test_a_grid_gives_every_job_its_run_dir_and_checkpoint_folder(grid):
    cwd, result = grid
    for job in range(4):
        assert (cwd / "runs" / "grid" / str(job) / "metrics.json").exists()
        assert (cwd / "checkpoints" / "grid" / str(job) / "last.pt").exists()
        events = list((cwd / "runs" / "grid" / str(job)).glob("events.out.tfevents.*"))
        assert events, f"job {job} wrote no TensorBoard run"
    assert "sweep runs/grid: 4 jobs" in result.stdout
    assert "starting fresh" not in result.stdout + result.stderr  # no resume was asked for


def test_the_summary_lists_every_job_best_first_with_its_overrides(grid):
    cwd, _ = grid
    rows, data = summary(cwd, "grid")
    assert len(rows) == 4 and len(data["jobs"]) == 4
    accuracies = [float(row["val/acc"]) for row in rows]
    assert accuracies == sorted(accuracies, reverse=True)
    assert {row["status"] for row in rows} == {"completed"}
    overrides = {row["overrides"] for row in rows}
    assert any("optim=sgd" in o and "optim.lr=0.005" in o for o in overrides)
    best = rows[0]
    assert best["best_checkpoint"].endswith("best.pt") and "test/acc" in best
    # Each job's metrics.json holds what the row shows.
    job = json.loads((cwd / "runs" / "grid" / best["job"] / "metrics.json").read_text())
    assert job["val/acc"] == pytest.approx(float(best["val/acc"]))


def test_rerunning_a_finished_sweep_skips_its_jobs(grid):
    cwd, _ = grid
    last = cwd / "checkpoints" / "grid" / "0" / "last.pt"
    written = last.stat().st_mtime_ns
    again = run_train(cwd, "-m", "run_name=grid", "optim=sgd,adamw", "optim.lr=0.05,0.005", *TINY)
    assert again.stdout.count("finished by an earlier run of this sweep; skipped") == 4
    assert last.stat().st_mtime_ns == written
    assert len(summary(cwd, "grid")[0]) == 4


def test_a_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    result = run_train(tmp_path, "-m", "run_name=bad", "optim.lr=0.01,-1,0.02", *TINY, ok=False)
    assert result.returncode == EXIT_JOBS_FAILED
    assert "1 of 3 jobs did not complete (jobs 1)" in result.stderr
    assert "Traceback" not in result.stderr
    rows, _ = summary(tmp_path, "bad")
    status = {row["job"]: row["status"] for row in rows}
    assert status == {"0": "completed", "1": "failed", "2": "completed"}
    failed = next(row for row in rows if row["status"] == "failed")
    assert "optim.lr=-1" in failed["error"] and "greater than 0" in failed["error"]
    assert rows[-1]["status"] == "failed"  # failures sort last
    assert (tmp_path / "checkpoints" / "bad" / "2" / "best.pt").exists()


def test_a_crashing_job_is_recorded_with_its_exception(tmp_path):
    # The second job's model raises inside training: a bug, not bad input.
    result = run_train(
        tmp_path,
        "-m",
        "run_name=crash",
        "model=mlp",
        "model._target_=models.mlp.mlp,signalling_model.crashing_mlp",
        *TINY,
        ok=False,
    )
    assert result.returncode == EXIT_JOBS_FAILED
    rows, _ = summary(tmp_path, "crash")
    failed = next(row for row in rows if row["status"] == "failed")
    assert failed["error"].startswith("RuntimeError: deliberate failure")
    job_log = (tmp_path / "runs" / "crash" / failed["job"] / "train.log").read_text()
    assert "Traceback" in job_log and "deliberate failure" in job_log  # a bug keeps its trace


def test_a_seed_sweep_shows_mean_and_std(tmp_path):
    result = run_train(tmp_path, "-m", "run_name=seeds", "seed=0,1,2", *TINY)
    _, data = summary(tmp_path, "seeds")
    (group,) = data["seed_groups"]
    assert group["jobs"] == group["completed"] == 3
    accuracies = [job["val/acc"] for job in data["jobs"]]
    assert group["val/acc"]["mean"] == pytest.approx(sum(accuracies) / 3)
    assert group["val/acc"]["std"] == pytest.approx(torch.tensor(accuracies).std().item())
    assert "over seeds: mean ± std" in result.stdout and "3/3" in result.stdout


def test_an_interrupted_sweep_job_resumes_when_the_sweep_is_run_again(tmp_path):
    sweep = (
        "-m",
        "run_name=requeue",
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "seed=0,1",
    )
    stopped = run_train(
        tmp_path, *sweep, "trainer.max_epochs=2", ok=False, env={"SIGNAL_AT_FORWARD": "5"}
    )
    assert stopped.returncode == EXIT_INTERRUPTED  # a signal stops the whole sweep
    assert (tmp_path / "checkpoints" / "requeue" / "0" / "last.pt").exists()
    assert not (tmp_path / "runs" / "requeue" / "1").exists()
    again = run_train(tmp_path, *sweep, "trainer.max_epochs=2")
    assert "resumed from checkpoints/requeue/0/last.pt: epoch 1, batch 5" in again.stdout
    rows, _ = summary(tmp_path, "requeue")
    assert [row["status"] for row in rows] == ["completed", "completed"]


def test_a_sweep_job_with_nothing_to_continue_starts_a_history_of_its_own(tmp_path):
    """A job stopped before its first checkpoint leaves its TensorBoard events alone; run again
    with the sweep, it starts afresh, and its history holds that run alone, not two."""
    sweep = ("-m", "run_name=fresh", "seed=0,1", *TINY)
    run_train(tmp_path, *sweep)
    for path in (tmp_path / "checkpoints" / "fresh" / "0").iterdir():
        path.unlink()  # as a kill before the first checkpoint leaves the job
    (tmp_path / "runs" / "fresh" / "0" / "metrics.json").unlink()
    run_train(tmp_path, *sweep)
    assert len(list((tmp_path / "runs" / "fresh" / "0").glob("events.out.tfevents.*"))) == 1
    assert [row["status"] for row in summary(tmp_path, "fresh")[0]] == ["completed"] * 2


def test_a_sweep_refuses_a_job_folder_that_holds_another_job(tmp_path):
    run_train(tmp_path, "-m", "run_name=taken", "optim.lr=0.01", *TINY)
    metrics = (tmp_path / "runs" / "taken" / "0" / "metrics.json").read_text()
    other = run_train(tmp_path, "-m", "run_name=taken", "optim.lr=0.02", *TINY, ok=False)
    assert other.returncode == EXIT_USER_ERROR  # the sweep's name is taken: it stops at once
    assert "optim.lr=0.01" in other.stderr and "not this one" in other.stderr
    assert "give the sweep a new run_name" in other.stderr
    assert (tmp_path / "runs" / "taken" / "0" / "metrics.json").read_text() == metrics


def test_the_time_limit_signal_is_handed_to_the_scheduler_after_the_checkpoint():
    # submitit installs a requeue handler for SIGUSR2; ours replaces it while training and
    # calls it once last.pt is safe.
    calls = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        with StopRequest() as stop:
            signal.raise_signal(signal.SIGUSR2)
            assert stop.requested and stop.name == "SIGUSR2" and calls == []
            stop.hand_on()
        assert calls == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)
