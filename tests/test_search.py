"""torchloom's Optuna sweeper (utils/run/search.py, ``hparams_search=digits_optuna``) through
train.py: trials pruned from inside their jobs, the study on disk continued by the same
command, a kill -9 of the whole sweep mid-trial continued from the trial's own last.pt to the
weights an uninterrupted study's trial reaches, two workers on one study, and the bad inputs:
a space that does not parse, a direction against the monitor, a storage that cannot be opened
(its password written nowhere), a study of the same name with another space."""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import HELPERS, TRAIN, error_line, killed_at, run_train
from omegaconf import OmegaConf

from utils.run.search import heartbeat
from utils.run.study import pruner_name

optuna = pytest.importorskip("optuna")

# the searches run many short jobs: slow; .ci/run runs them
pytestmark = pytest.mark.slow

SEARCH = ["-m", "hparams_search=digits_optuna", "trainer.max_epochs=3"]


def rows(cwd: Path, run: str) -> list[dict]:
    return list(csv.DictReader((cwd / "runs" / run / "summary.csv").read_text().splitlines()))


def trials(cwd: Path, run: str, name: str = "digits") -> list:
    storage = f"sqlite:///{cwd / 'runs' / run / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage).get_trials()


def test_a_search_prunes_from_inside_its_jobs_and_the_same_command_continues_it(tmp_path):
    pruning = ["hydra.sweeper.pruner=percentile", "hydra.sweeper.percentile=90"]
    pruning += ["hydra.sweeper.n_startup_trials=2", "hydra.sweeper.n_warmup_epochs=1"]
    search = [*SEARCH, *pruning, "run_name=search"]
    result = run_train(tmp_path, *search, "hydra.sweeper.n_trials=6")
    states = optuna.trial.TrialState
    found = trials(tmp_path, "search")
    assert len(found) == 6 and all(t.state in (states.COMPLETE, states.PRUNED) for t in found)
    assert (tmp_path / "runs/search/study.db").is_file()
    pruned = [t for t in found if t.state == states.PRUNED]
    assert pruned, "a 90th-percentile pruner stopped no trial"
    table = {int(row["job"]): row for row in rows(tmp_path, "search")}
    for trial in found:  # the summary says how each ended and how long it trained
        row = table[trial.number]
        metrics = json.loads(
            (tmp_path / "runs/search" / str(trial.number) / "metrics.json").read_text()
        )
        if trial.state == states.PRUNED:
            epoch = trial.user_attrs["pruned_at_epoch"]
            assert row["state"] == "pruned" and int(row["epochs"]) == epoch < 3
            assert metrics["stopped_by"]["callback"] == "pruned"
            assert metrics["stopped_by"]["epoch"] == epoch
            assert (tmp_path / "checkpoints/search" / str(trial.number) / "last.pt").exists()
        else:
            assert row["state"] == "complete" and int(row["epochs"]) == 3
            assert trial.value == pytest.approx(float(row["val/acc"]))
    assert "pruned" in result.stdout
    best = OmegaConf.load(tmp_path / "runs/search/optimization_results.yaml")
    complete = [t for t in found if t.state == states.COMPLETE]
    assert best.best_value == pytest.approx(max(t.value for t in complete))
    # the same command: the study holds its trials already; nothing runs again
    run_train(tmp_path, *search, "hydra.sweeper.n_trials=6")
    assert [t.datetime_start for t in trials(tmp_path, "search")] == [
        t.datetime_start for t in found
    ]
    # more trials: the study goes on from the six it holds, with new points
    run_train(tmp_path, *search, "hydra.sweeper.n_trials=8")
    more = trials(tmp_path, "search")
    assert len(more) == 8 and [t.number for t in more] == list(range(8))
    seen = {tuple(sorted(t.params.items())) for t in found}
    assert all(tuple(sorted(t.params.items())) not in seen for t in more[6:])


def test_wilcoxon_ends_a_cross_validation_its_folds_show_worse_than_the_best_trials(tmp_path):
    """pruner=wilcoxon under cv=5: each fold's best val/acc reported as the trial's step (the
    fold's number); a trial whose folds a paired test finds worse than the best trial's same
    folds stops before its next fold, told pruned, its folds so far kept."""
    search = ["-m", "hparams_search=digits_optuna", "trainer.max_epochs=3", "cv=5"]
    search += ["hydra.sweeper.pruner=wilcoxon", "hydra.sweeper.n_trials=5", "run_name=wx"]
    run_train(tmp_path, *search)
    states = optuna.trial.TrialState
    found = trials(tmp_path, "wx")
    pruned = [t for t in found if t.state == states.PRUNED]
    assert len(found) == 5 and pruned, [t.state for t in found]
    table = {int(row["job"]): row for row in rows(tmp_path, "wx")}
    for trial in found:
        folder = tmp_path / "runs/wx" / str(trial.number)
        metrics = json.loads((folder / "metrics.json").read_text())
        trained = sorted(p.name for p in folder.glob("fold-*"))
        values = [trial.intermediate_values[k] for k in sorted(trial.intermediate_values)]
        assert values == pytest.approx(metrics["cv"]["values"])  # each fold's best, in order
        if trial.state == states.PRUNED:
            fold = trial.user_attrs["pruned_at_fold"]
            assert 2 <= fold < 4 and sorted(trial.intermediate_values) == list(range(fold + 1))
            assert trained == [f"fold-{k}" for k in range(fold + 1)]  # no fold after it
            assert metrics["stopped_by"]["callback"] == "pruned"
            assert metrics["stopped_by"]["fold"] == fold
            assert table[trial.number]["state"] == "pruned"
            assert int(table[trial.number]["epochs"]) == 3 * (fold + 1)
            assert not (folder / "oof.csv").exists()
        else:
            assert trial.state == states.COMPLETE and len(trained) == 5
            assert trial.value == pytest.approx(sum(values) / 5)  # the folds' mean
            assert int(table[trial.number]["epochs"]) == 15
    run_train(tmp_path, *search)  # the same command: every trial has ended; none runs again
    assert [t.datetime_start for t in trials(tmp_path, "wx")] == [t.datetime_start for t in found]
    # pruner=auto: wilcoxon under cv=K, none with several objectives, else Optuna's advice
    assert pruner_name({"pruner": "auto"}, cv=5) == "wilcoxon"
    assert pruner_name({"pruner": "auto", "directions": ["maximize"] * 2}, cv=5) == "none"
    assert pruner_name({"pruner": "auto", "sampler": "tpe"}, cv=None) == "hyperband"


def test_a_search_of_two_objectives_marks_its_pareto_front(tmp_path):
    objectives = ["hydra.sweeper.objectives=[val/acc,train/samples_per_second]"]
    objectives += ["hydra.sweeper.directions=[maximize,maximize]"]
    search = [*SEARCH, "trainer.max_epochs=1", "hydra.sweeper.n_trials=6", "run_name=two"]
    run_train(tmp_path, *search, *objectives, "report=true")
    found = trials(
        tmp_path,
        "two",
    )
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in found) and len(found) == 6
    for trial in found:  # each trial's values are its metrics.json's figures
        metrics = json.loads(
            (tmp_path / "runs/two" / str(trial.number) / "metrics.json").read_text()
        )
        assert trial.values == pytest.approx(
            [metrics["val/acc"], metrics["train/samples_per_second"]]
        )
    study = optuna.load_study(
        study_name="digits", storage=f"sqlite:///{tmp_path / 'runs/two/study.db'}"
    )
    front = {t.number for t in study.best_trials}
    marked = {int(r["job"]) for r in rows(tmp_path, "two") if r["pareto"] == "True"}
    results = OmegaConf.load(tmp_path / "runs/two/optimization_results.yaml")
    assert marked == front == {s.number for s in results.solutions}
    assert list(results.objectives) == ["val/acc", "train/samples_per_second"]
    for trial in found:  # off the front: another trial at least as good on both, better on one
        beaten = any(
            all(o >= v for o, v in zip(other.values, trial.values, strict=True))
            and other.values != trial.values
            for other in found
        )
        assert beaten == (trial.number not in front)
    assert "Pareto front" in (tmp_path / "runs/two/report.html").read_text()
    # the same study asked for other objectives: refused, its trials unchanged
    other = ["hydra.sweeper.objectives=[val/acc,val/acc_top5]", objectives[1]]
    result = run_train(tmp_path, *search, *other, ok=False)
    assert "was made for the objectives val/acc, train/samples_per_second" in error_line(result)
    assert len(trials(tmp_path, "two")) == 6


def test_a_kill_9_of_the_sweep_mid_trial_continues_that_trial_from_its_last_pt(tmp_path):
    search = [*SEARCH, "hydra.sweeper.pruner=none", "hydra.sweeper.n_trials=2"]
    search += ["model=mlp", "model._target_=signalling_model.mlp"]
    search += ["trainer.checkpoint_every_n_steps=3"]  # last.pt every 3 steps
    run_train(tmp_path, *search, "run_name=straight")
    killed = run_train(tmp_path, *search, "run_name=killed", ok=False, env=killed_at(8))
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    states = optuna.trial.TrialState
    assert [t.state for t in trials(tmp_path, "killed")] == [states.RUNNING]
    assert (tmp_path / "checkpoints/killed/0/last.pt").exists()  # at its step 6
    again = run_train(tmp_path, *search, "run_name=killed")
    assert "continuing it" in again.stdout + again.stderr
    continued = trials(tmp_path, "killed")
    assert [t.number for t in continued] == [0, 1]
    assert [t.state for t in continued] == [states.COMPLETE, states.COMPLETE]
    first = trials(tmp_path, "straight")[0]
    assert continued[0].params == first.params and continued[0].value == first.value
    a = torch.load(tmp_path / "checkpoints/straight/0/last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "checkpoints/killed/0/last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit


def test_two_workers_share_one_study_and_run_no_trial_twice(tmp_path):
    search = [*SEARCH, "trainer.max_epochs=2", "hydra.sweeper.n_trials=5", "run_name=shared"]
    search += ["hydra.sweeper.storage=journal", "hydra.sweeper.pruner=none"]
    command = [sys.executable, str(TRAIN), *search]
    env = {**os.environ, "PYTHONPATH": str(HELPERS)}
    workers = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "runs/shared/study.journal"))
    )
    found = optuna.load_study(study_name="digits", storage=storage).get_trials()
    numbers = [t.number for t in found]
    assert len(numbers) == len(set(numbers)) and len(found) >= 5
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in found)
    ran = [{int(n) for n in re.findall(r"run dir: \S*runs/shared/(\d+)", o)} for o in outputs]
    assert not ran[0] & ran[1]  # no trial ran in both workers
    assert sorted(ran[0] | ran[1]) == numbers  # and each ran in one


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("optim.lr=interval(0.5, 0.1)", "interval(0.5, 0.1) must rise"),
        ("optim.lr=tag(log, interval(0.0, 0.1))", "stay above 0 on a log scale"),
        ("hydra.sweeper.direction=minimize", "contradicts trainer.monitor_mode=max"),
        ("hydra.sweeper.sampler=annealing", "hydra.sweeper.sampler='annealing'"),
        ("hydra.sweeper.pruner=sometimes", "hydra.sweeper.pruner='sometimes'"),
        ("hydra.sweeper.pruner=wilcoxon", "it needs cv=K"),
        ("hydra.sweeper.directions=[maximize,maximize]", "needs hydra.sweeper.objectives"),
        (
            (
                "hydra.sweeper.objectives=[val/acc,val/loss]",
                "hydra.sweeper.directions=[maximize,maximize]",
            ),
            "directions (val/loss)=maximize contradicts val/loss, which is better lower",
        ),
        (
            (
                "hydra.sweeper.objectives=[val/acc,val/loss]",
                "hydra.sweeper.directions=[maximize,minimize]",
                "hydra.sweeper.pruner=median",
            ),
            "pruner=median and several hydra.sweeper.directions do not combine",
        ),
        (("cv=5", "hydra.sweeper.pruner=wilcoxon", "hydra.sweeper.p_threshold=2"), "a p-value"),
    ],
)
def test_a_search_that_cannot_run_is_one_line_and_exit_2(tmp_path, override, said):
    overrides = override if isinstance(override, tuple) else (override,)
    result = run_train(tmp_path, *SEARCH, "run_name=bad", *overrides, ok=False)
    assert said in error_line(result)


def test_a_storage_that_cannot_be_opened_names_it_without_its_password(tmp_path):
    url = "postgresql://searcher:hunter2secret@127.0.0.1:9/studies"
    result = run_train(tmp_path, *SEARCH, "run_name=db", f"hydra.sweeper.storage={url}", ok=False)
    line = error_line(result)
    assert "hydra.sweeper.storage=postgresql://searcher:" in line and "cannot be opened" in line
    assert "hunter2secret" not in result.stdout + result.stderr
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or b"hunter2secret" not in path.read_bytes(), path


def test_a_study_of_the_same_name_with_another_space_is_refused_and_kept(tmp_path):
    search = [*SEARCH, "trainer.max_epochs=1", "hydra.sweeper.n_trials=2", "run_name=space"]
    run_train(tmp_path, *search)
    before = trials(tmp_path, "space")
    other = run_train(tmp_path, *search, "optim.momentum=interval(0.5, 0.9)", ok=False)
    assert "searches another space" in error_line(other)
    assert [t.number for t in trials(tmp_path, "space")] == [t.number for t in before]


@pytest.mark.parametrize("beat_age", [3600, 10])
def test_a_trial_of_another_machine_is_continued_once_its_heartbeat_is_stale(tmp_path, beat_age):
    """A trial whose sweeper ran on another machine (its owner another host): continued here,
    under its number and with its parameters, once its heartbeat is 4 beats old (an hour,
    with beats of 30 s); left to that machine while the heartbeat is fresh (10 s)."""
    search = [*SEARCH, "trainer.max_epochs=1", "run_name=away"]
    run_train(tmp_path, *search, "hydra.sweeper.n_trials=1")
    storage = f"sqlite:///{tmp_path / 'runs/away/study.db'}"
    study = optuna.load_study(study_name="digits", storage=storage)
    away = study.ask(study.trials[0].distributions)  # trial 1, as the other machine asked it
    study._storage.set_trial_system_attr(away._trial_id, "torchloom:owner", "elsewhere:4242")
    beat = time.time() - beat_age
    study._storage.set_trial_system_attr(away._trial_id, "torchloom:heartbeat", beat)
    result = run_train(tmp_path, *search, "hydra.sweeper.n_trials=2")
    found = trials(tmp_path, "away")
    states = optuna.trial.TrialState
    assert len(found) == 2 and found[0].state == states.COMPLETE
    if beat_age > 4 * 30:
        assert "trial 1: its sweeper was stopped; continuing it" in result.stdout + result.stderr
        assert found[1].state == states.COMPLETE and found[1].params == away.params
        assert found[1].system_attrs["torchloom:owner"] != "elsewhere:4242"
        assert found[1].system_attrs["torchloom:heartbeat"] > beat
    else:
        assert found[1].state == states.RUNNING  # the other machine's, left to it
        assert found[1].system_attrs["torchloom:heartbeat"] == beat
        assert not (tmp_path / "runs/away/1").exists()


def test_a_running_trials_heartbeat_moves_on_while_it_runs_and_stops_after():
    study = optuna.create_study()
    trial = study.ask()

    def beat() -> float:
        return study._storage.get_trial(trial._trial_id).system_attrs["torchloom:heartbeat"]

    with heartbeat(study, [trial], seconds=0.01):
        first = beat()  # written on entry
        deadline = time.monotonic() + 30
        while beat() == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert beat() > first  # the thread wrote again
    last = beat()
    time.sleep(0.05)
    assert beat() == last  # and no more once the trial's jobs returned


def test_a_trial_another_worker_runs_is_left_to_it_and_is_no_failure(tmp_path):
    # another worker's trial, deterministically: running, owned by a live process of this
    # machine (this one), its folder begun
    run_dir = tmp_path / "runs" / "busy"
    (run_dir / "0").mkdir(parents=True)
    study = optuna.create_study(
        study_name="digits", storage=f"sqlite:///{run_dir / 'study.db'}", direction="maximize"
    )
    busy = study.ask()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    study._storage.set_trial_system_attr(busy._trial_id, "torchloom:owner", owner)
    search = [*SEARCH, "trainer.max_epochs=1", "hydra.sweeper.n_trials=3", "run_name=busy"]
    result = run_train(tmp_path, *search)  # exit 0: the running trial is not a failure
    assert "still running in another worker of the study: 1" in result.stdout + result.stderr
    found = trials(tmp_path, "busy")
    states = optuna.trial.TrialState
    assert [t.state for t in found] == [states.RUNNING, states.COMPLETE, states.COMPLETE]
