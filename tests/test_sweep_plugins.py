"""Hydra's search and launcher plugins with train.py (the ``[sweep]`` extra): an Optuna search,
parallel jobs through joblib, jobs through submitit's local executor, the SLURM launcher
config, and the experiment presets."""

from __future__ import annotations

import csv
import json
import os

import pytest
from conftest import CONF, run_train
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import utils.config  # noqa: F401  (registers the schema and resolvers)

# the launcher plugins: slow; .ci/run runs them, `pytest -m "not slow"` leaves them out
pytestmark = pytest.mark.slow

TINY = ("trainer.max_epochs=1",)


def rows(cwd, run_name):
    return list(csv.DictReader((cwd / "runs" / run_name / "summary.csv").read_text().splitlines()))


def test_an_optuna_search_runs_its_trials_and_reports_the_best(tmp_path):
    result = run_train(
        tmp_path,
        "-m",
        "hparams_search=digits_optuna",
        "hydra.sweeper.n_trials=3",
        "run_name=search",
        *TINY,
    )
    assert "best trial" in result.stdout + result.stderr
    found = OmegaConf.load(tmp_path / "runs" / "search" / "optimization_results.yaml")
    assert set(found.best_params) == {
        "optim.lr",
        "optim.weight_decay",
        "data.batch_size",
        "model.hidden_sizes",
    }
    trials = rows(tmp_path, "search")
    assert len(trials) == 3 and {t["status"] for t in trials} == {"completed"}
    # What train.py returns is what the sweeper optimised: the best val/acc of the trials.
    assert found.best_value == pytest.approx(max(float(t["val/acc"]) for t in trials))
    assert 1e-4 <= found.best_params["optim.lr"] <= 3e-2


def test_the_joblib_launcher_runs_jobs_in_parallel_with_a_share_of_the_cores(tmp_path):
    run_train(
        tmp_path,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "run_name=parallel",
        "optim.lr=0.01,0.001",
        *TINY,
    )
    share = max(1, (os.cpu_count() or 1) // 2)
    logs = [(tmp_path / "runs" / "parallel" / str(j) / "train.log").read_text() for j in (0, 1)]
    assert all(f"{share} CPU threads" in log for log in logs)
    assert len(rows(tmp_path, "parallel")) == 2


@pytest.mark.parametrize("attempt", [1, 2])  # a fresh store each time: the race is at creation
def test_parallel_jobs_on_a_fresh_mlflow_store_create_it_once_and_all_finish(tmp_path, attempt):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    # Its own process: joblib's workers outlive a call, and keep the first call's folder.
    run_train(
        tmp_path,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "run_name=tracked",
        "logger=mlflow",
        "optim.lr=0.01,0.001",
        *TINY,
        process=True,
    )
    assert {r["status"] for r in rows(tmp_path, "tracked")} == {"completed"}
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.info.status for r in found) == ["FINISHED", "FINISHED"]


def test_the_submitit_local_launcher_runs_jobs_that_share_one_run_name(tmp_path):
    # No run_name given: the jobs run in other processes and still land in one sweep folder.
    run_train(tmp_path, "-m", "hydra/launcher=submitit_local", "optim.lr=0.01,0.001", *TINY)
    (sweep,) = (tmp_path / "runs").iterdir()
    assert len(rows(tmp_path, sweep.name)) == 2
    assert {p.name for p in (tmp_path / "checkpoints" / sweep.name).iterdir()} == {"0", "1"}


def compose_train(*overrides):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_the_slurm_launcher_config_warns_before_the_time_limit_and_requeues():
    cfg = compose_train("hydra/launcher=slurm")
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.signal_delay_s >= 60 and launcher.max_num_timeout > 0
    assert launcher.gpus_per_node == 1 and launcher.timeout_min > 0


@pytest.mark.parametrize(
    ("experiment", "model", "data"),
    [
        ("digits_mlp", "models.mlp.mlp", "data.images.digits.load_digits"),
        ("digits_cnn", "models.cnn.cnn", "data.images.digits.load_digits"),
        ("mnist_cnn", "models.cnn.cnn", "data.images.mnist.load_mnist"),
        ("cifar10_resnet18", "models.resnet.resnet18", "data.images.cifar10.load_cifar10"),
    ],
)
def test_each_experiment_preset_composes_and_overrides_still_apply(experiment, model, data):
    cfg = compose_train(f"experiment={experiment}", "trainer.max_epochs=3")
    assert cfg.model._target_ == model and cfg.data._target_ == data
    assert cfg.trainer.max_epochs == 3


def test_the_digits_cnn_preset_trains(tmp_path):
    run_train(tmp_path, "experiment=digits_cnn", "trainer.max_epochs=1", "run_name=preset")
    metrics = json.loads((tmp_path / "runs" / "preset" / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["test/acc"] > 0.2  # chance is 0.1
