"""Experiment tracking through the real ``train.py`` and ``evaluate.py`` (conf/logger/), read
back with each backend's own reader (tests/helpers/histories.py): MLflow on a local sqlite
store, W&B in offline mode, TensorBoard, the CSV file. A history never runs ahead of
``last.pt``: a stopped or killed run resumed with ``resume=auto`` is one tracked run whose
history equals an uninterrupted run's."""

from __future__ import annotations

import importlib.abc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
import urllib.request

import pytest
import torch
from conftest import (
    EXIT_INTERRUPTED,
    HELPERS,
    ROOT,
    free_port,
    run_evaluate,
    run_train,
    scalars,
    torchrun,
)

sys.path.insert(0, str(HELPERS))
from histories import (
    comparable,
    csv_history,
    csv_rows,
    mlflow_history,
    mlflow_runs,
    tensorboard_history,
    wandb_attempts,
    wandb_history,
)
from process_probe import Probe

from utils.tracking.process import in_own_process

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

# 20 optimizer steps an epoch on the digits (19 of 64, the last of 41), a point every 5 steps,
# 3 epochs.
JOB = (
    "model.hidden_sizes=[32]",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=5",
    "logger=[tensorboard,csv,mlflow,wandb]",
)
ENV = {"WANDB_SILENT": "true"}  # and no WANDB_API_KEY: offline


def store(cwd) -> str:
    return f"sqlite:///{cwd / 'runs' / 'mlflow.db'}"


def histories(cwd, run_name: str) -> dict[str, dict]:
    """Every backend's history of one run, comparable across runs."""
    run_dir = cwd / "runs" / run_name
    (run,) = mlflow_runs(store(cwd), run_name)
    (wandb_id,) = {a["id"] for a in wandb_attempts(run_dir)}
    return {
        "tensorboard": comparable(tensorboard_history(run_dir)),
        "csv": comparable(csv_history(run_dir)),
        "mlflow": comparable(mlflow_history(store(cwd), run.info.run_id)),
        "wandb": comparable(wandb_history(run_dir, wandb_id)),
    }


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("tracked")
    run_train(cwd, *JOB, "run_name=straight", env=ENV)
    return cwd, histories(cwd, "straight")


def test_every_logger_holds_the_same_history_and_marks_the_run_finished(straight):
    cwd, logged = straight
    train_loss = logged["tensorboard"]["train/loss"]
    assert [step for step, _ in train_loss] == list(range(5, 61, 5))
    for backend in ("csv", "mlflow"):  # every tag at the same steps with the same values
        assert logged[backend] == logged["tensorboard"], backend
    wandb = logged["wandb"]  # the test's figures are the W&B run's summary, not its history
    assert wandb == {t: v for t, v in logged["tensorboard"].items() if not t.startswith("test/")}
    (run,) = mlflow_runs(store(cwd), "straight")
    assert run.info.status == "FINISHED"
    assert run.data.params["optim.lr"] == "0.002" and run.data.params["logger.csv._target_"]
    assert run.data.tags["torchloom.best_checkpoint"] == "checkpoints/straight/best.pt"
    (attempt,) = wandb_attempts(cwd / "runs" / "straight")
    assert attempt["exit_code"] == 0 and "test/acc" in attempt["summary"]
    checkpoint = torch.load(cwd / "checkpoints" / "straight" / "last.pt", weights_only=True)
    assert checkpoint["tracking"]["backends"]["mlflow"]["run_id"] == run.info.run_id
    assert checkpoint["tracking"]["backends"]["wandb"]["id"] == attempt["id"]


def test_a_trackers_process_is_a_fresh_interpreter_even_beside_busy_threads(tmp_path):
    """MLflow's process is never a fork of the training process: a fork copied what the
    training process's other threads were half-way through making, and the copy's garbage
    collector crashed on it (seen in the quick suite, where runs share a process with
    threads). Here a thread makes cyclic garbage throughout; the backend's process holds
    nothing of this process (not its modules, not torch), runs in a session of its own (the
    terminal's Ctrl-C is the training process's to handle) and ends once closed."""
    busy = threading.Event()

    def churn() -> None:
        while not busy.is_set():
            ring = [[] for _ in range(100)]
            for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
                a.append(b)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    sys.modules["torchloom_parent_only"] = types.ModuleType("torchloom_parent_only")
    try:
        backend = in_own_process(Probe(), tmp_path)
        seen = backend.position()
        backend.close("FINISHED")
    finally:
        busy.set()
        thread.join()
        del sys.modules["torchloom_parent_only"]
    assert "torchloom_parent_only" not in seen["modules"] and "process_probe" in seen["modules"]
    assert "torch" not in seen["modules"]  # its imports are the tracker's, not the training's
    assert seen["pid"] != os.getpid() and seen["session"] == seen["pid"]
    assert backend.process.wait(timeout=10) == 0


def test_the_csv_is_long_form_and_stays_valid_when_a_tag_appears_mid_run(tmp_path):
    # val/ tags first appear at epoch 2; per-layer gradient norms from the first point on
    run_train(
        tmp_path,
        "model.hidden_sizes=[32]",
        "trainer.max_epochs=2",
        "logger=csv",
        "trainer.val_every_n_epochs=2",
        "trainer.log_every_n_steps=5",
        "trainer.log_grad_norms=per_layer",
        "run_name=longform",
    )
    rows = csv_rows(tmp_path / "runs" / "longform")
    text = (tmp_path / "runs" / "longform" / "metrics.csv").read_text()
    assert text.startswith("step,epoch,tag,value\n")
    assert all(len(row) == 4 and None not in row.values() for row in rows)
    first_val = next(i for i, row in enumerate(rows) if row["tag"].startswith("val/"))
    assert rows[first_val]["epoch"] == "2" and first_val > 10
    tags = {row["tag"] for row in rows}
    assert "train/loss" in tags and any(tag.startswith("grad_norm/") for tag in tags)
    # 20 steps an epoch, a point every 5: steps 5-20 in epoch 1, 25-40 in epoch 2
    assert [int(r["epoch"]) for r in rows if r["tag"] == "train/loss"] == [1, 1, 1, 1, 2, 2, 2, 2]


def test_tensorboard_holds_every_point_the_csv_holds_the_last_steps_too(tmp_path):
    # TensorBoard gets a step's points as one event (utils/tracking/local.py): none may be lost
    # where the step changes, at a checkpoint, or at the end (the test's points, the last step)
    run_train(
        tmp_path,
        "model.hidden_sizes=[32]",
        "trainer.max_epochs=2",
        "logger=[tensorboard,csv]",
        "trainer.log_every_n_steps=3",
        "trainer.log_grad_norms=per_layer",
        "run_name=both",
    )
    run_dir = tmp_path / "runs" / "both"
    in_csv = {(int(r["step"]), r["tag"], float(r["value"])) for r in csv_rows(run_dir)}
    in_tensorboard = {
        (step, tag, value) for tag, points in scalars(run_dir).items() for step, value in points
    }
    as_float32 = {(step, tag, float(torch.tensor(value))) for step, tag, value in in_csv}
    assert as_float32 == in_tensorboard  # TensorBoard keeps float32, the CSV the float itself
    steps = {step for step, _, _ in in_csv}
    assert len(steps) > 10 and any(tag.startswith("test/") for _, tag, _ in in_csv)


@pytest.mark.slow  # a stop needs its own process: 20 s
def test_a_stopped_run_is_killed_then_the_same_run_finishes_with_the_same_history(
    tmp_path, straight
):
    _, reference = straight
    stopped = run_train(
        tmp_path,
        *JOB,
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "run_name=stopped",
        ok=False,
        env={**ENV, "SIGNAL_AT_FORWARD": "30"},
    )
    assert stopped.returncode == EXIT_INTERRUPTED, stopped.stderr[-2000:]
    (run,) = mlflow_runs(store(tmp_path), "stopped")
    assert run.info.status == "KILLED"
    (attempt,) = wandb_attempts(tmp_path / "runs" / "stopped")
    assert attempt["exit_code"] == 3
    run_train(
        tmp_path,
        *JOB,
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "run_name=stopped",
        "resume=auto",
        env=ENV,
    )
    (run,) = mlflow_runs(store(tmp_path), "stopped")  # one MLflow run, reattached
    assert run.info.status == "FINISHED"
    assert len({a["id"] for a in wandb_attempts(tmp_path / "runs" / "stopped")}) == 1
    resumed = histories(tmp_path, "stopped")
    for backend in ("tensorboard", "csv", "mlflow", "wandb"):
        assert resumed[backend] == reference[backend], backend


def test_a_failed_run_is_marked_failed(tmp_path):
    failed = run_train(
        tmp_path,
        "model=mlp",
        "model._target_=signalling_model.crashing_mlp",
        "trainer.max_epochs=1",
        "logger=[mlflow,wandb]",
        "run_name=crash",
        ok=False,
        env=ENV,
    )
    assert failed.returncode != 0
    (run,) = mlflow_runs(store(tmp_path), "crash")
    assert run.info.status == "FAILED" and run.data.params["run_name"] == "crash"
    (attempt,) = wandb_attempts(tmp_path / "runs" / "crash")
    assert attempt["exit_code"] not in (0, None)


def test_a_three_job_sweep_is_three_tracked_runs_grouped_by_the_sweep(tmp_path):
    run_train(
        tmp_path,
        "-m",
        "run_name=grid/seeds",
        "seed=0,1,2",
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=1",
        "logger=[mlflow,wandb]",
        env=ENV,
    )
    runs = mlflow_runs(store(tmp_path), "grid/seeds")
    assert sorted(r.data.tags["torchloom.job"] for r in runs) == ["0", "1", "2"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.params["seed"] for r in runs} == {"0", "1", "2"}
    from mlflow import MlflowClient

    experiment = MlflowClient(store(tmp_path)).get_experiment(runs[0].info.experiment_id)
    assert experiment.name == "grid"  # the run name's first part
    attempts = [a for job in "012" for a in wandb_attempts(tmp_path / "runs" / "grid/seeds" / job)]
    assert len({a["id"] for a in attempts}) == 3
    assert {a["group"] for a in attempts} == {"grid/seeds"} and {
        a["exit_code"] for a in attempts
    } == {0}


def test_a_config_value_of_10000_characters_is_shortened_with_one_warning(tmp_path):
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    long = "x" * 10_000  # a table's target column of that name: data.target holds it
    rows = [f"{i % 5},{'ab'[i % 2]}" for i in range(120)]
    (tmp_path / "t.csv").write_text(f"f,{long}\n" + "\n".join(rows) + "\n")
    result = run_train(
        tmp_path,
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=1",
        "data=csv",
        "data.path=t.csv",
        f"data.target={long}",
        "data.batch_size=16",
        "logger=mlflow",
        "run_name=long",
        "trainer.refit=false",  # a refit is a tracked run of its own, with its own warning
    )
    (run,) = mlflow_runs(store(tmp_path), "long")
    assert len(run.data.params["data.target"]) == MAX_PARAM_VAL_LENGTH
    assert run.data.params["data.target"].endswith("…") and run.info.status == "FINISHED"
    assert (result.stdout + result.stderr).count("shortened in its params") == 1


def test_config_keys_mlflow_refuses_are_mapped_at_start_up_and_the_run_holds_its_params(tmp_path):
    # A table's column named growth% in data.na_columns: a config key MLflow refuses.
    rows = [[f"{i % 7}" if i % 5 else "", str(i % 3), "yes" if i % 2 else "no"] for i in range(90)]
    (tmp_path / "t.csv").write_text("growth%,(b+c),y\n" + "\n".join(",".join(r) for r in rows))
    result = run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.na_columns={growth%: median}",
        "data.batch_size=16",
        "model.hidden_sizes=[8]",
        "trainer.max_epochs=2",
        "logger=mlflow",
        "run_name=odd",
    )
    assert "data.na_columns.growth% -> data.na_columns.growth_" in result.stdout + result.stderr
    (run,) = mlflow_runs(store(tmp_path), "odd")
    assert run.info.status == "FINISHED" and run.data.params["data.na_columns.growth_"] == "median"


def test_a_wandb_project_w_and_b_refuses_is_one_line_at_start_up(tmp_path):
    result = run_train(
        tmp_path, "logger=wandb", "run_name=a%b/c", "trainer.max_epochs=1", ok=False, env=ENV
    )
    assert result.returncode == 2
    assert "logger.wandb: the project 'a%b' (run_name's first part) holds '%'" in result.stderr
    assert not list((tmp_path / "checkpoints").rglob("*.pt"))


class SilentServer:
    """A TCP listener on localhost that accepts connections and never answers (a tracking
    server hung mid-request); ``accepted`` is set at its first connection."""

    def __init__(self) -> None:
        import socket
        import threading

        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.accepted, self.held = threading.Event(), []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(connection)
            self.accepted.set()

    def close(self) -> None:
        self.socket.close()
        for connection in self.held:
            connection.close()


@pytest.mark.slow  # its own process, and MLflow's start
def test_a_stop_while_the_tracking_server_never_answers_exits_3_within_seconds(tmp_path):
    server = SilentServer()
    try:
        run = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "train.py"),
                "logger=mlflow",
                "trainer.max_epochs=1",
                f"logger.mlflow.tracking_uri=http://127.0.0.1:{server.port}",
                "run_name=hung",
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert server.accepted.wait(timeout=120), "train.py never reached the server"
        run.send_signal(signal.SIGTERM)  # while the start-up check waits for an answer
        output, _ = run.communicate(timeout=60)  # before the fix: minutes, SIGTERM or not
    finally:
        server.close()
    assert run.returncode == EXIT_INTERRUPTED, output[-3000:]
    assert "SIGTERM received while waiting for logger.mlflow" in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_a_tracking_server_that_never_answers_is_one_line_after_a_bounded_wait(tmp_path):
    server = SilentServer()
    try:
        result = run_train(
            tmp_path,
            "logger=mlflow",
            "trainer.max_epochs=1",
            f"logger.mlflow.tracking_uri=http://127.0.0.1:{server.port}",
            ok=False,
            process=True,
            timeout=120,
        )
    finally:
        server.close()
    assert result.returncode == 2
    assert "MLflow cannot use that store" in result.stderr.strip().splitlines()[-1]


def test_evaluate_adds_its_metrics_to_the_training_run(tmp_path):
    run_train(
        tmp_path,
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=1",
        "logger=mlflow",
        "run_name=judged",
    )
    run_evaluate(tmp_path, "ckpt=checkpoints/judged/best.pt", "logger=mlflow", "split=val")
    (run,) = mlflow_runs(store(tmp_path), "judged")
    assert run.data.metrics["evaluate/val/acc"] == pytest.approx(run.data.metrics["val/acc"])
    run_train(tmp_path, "model.hidden_sizes=[16]", "trainer.max_epochs=1", "run_name=untracked")
    refused = run_evaluate(
        tmp_path, "ckpt=checkpoints/untracked/best.pt", "logger=mlflow", ok=False
    )
    assert refused.returncode == 2
    assert "was not trained with logger=mlflow" in refused.stderr.strip().splitlines()[-1]
    # A checkpoint edited to name another tracked run adds nothing to that run.
    run_train(
        tmp_path,
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=1",
        "logger=mlflow",
        "run_name=other",
    )
    (other,) = mlflow_runs(store(tmp_path), "other")
    best = tmp_path / "checkpoints/judged/best.pt"
    edited = torch.load(best, weights_only=True)
    edited["tracking"]["backends"]["mlflow"]["run_id"] = other.info.run_id
    torch.save(edited, tmp_path / "edited.pt")
    refused = run_evaluate(tmp_path, "ckpt=edited.pt", "logger=mlflow", "split=test", ok=False)
    assert "is not the run that trained this checkpoint" in refused.stderr.strip().splitlines()[-1]
    (other,) = mlflow_runs(store(tmp_path), "other")
    assert "evaluate/test/acc" not in other.data.metrics
    # Nor is a store ever made where a checkpoint's stored paths.runs points.
    edited = torch.load(best, weights_only=True)
    edited["config"]["paths"]["runs"] = str(tmp_path / "elsewhere" / "runs")
    torch.save(edited, tmp_path / "moved.pt")
    refused = run_evaluate(tmp_path, "ckpt=moved.pt", "logger=mlflow", ok=False)
    assert "no MLflow store at" in refused.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "elsewhere").exists()


class Hidden(importlib.abc.MetaPathFinder):
    """As if ``package`` were not installed."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if name == self.package or name.startswith(self.package + "."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


@pytest.mark.parametrize("package", ["mlflow", "wandb"])
def test_a_missing_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, package):
    monkeypatch.setattr(sys, "meta_path", [Hidden(package), *sys.meta_path])
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    result = run_train(tmp_path, f"logger=[tensorboard,{package}]", "run_name=none", ok=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f'error: logger={package} needs the {package} package: pip install -e ".[{package}]"'
    )
    assert not (tmp_path / "checkpoints" / "none" / "last.pt").exists()


def test_wandb_online_without_a_key_is_refused_rather_than_prompting(tmp_path):
    result = run_train(
        tmp_path,
        "logger=wandb",
        "logger.wandb.mode=online",
        "run_name=online",
        ok=False,
        env={**ENV, "NETRC": str(tmp_path / "none")},
    )
    assert result.returncode == 2
    assert "needs an API key" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "record",
    [
        {"pending": [["step", 0, "train/loss", 1.0]], "backends": {}},
        {"token": "../../x", "pending": [], "backends": {}},
        {"pending": [], "backends": {"mlflow": {"run_id": ["not", "a", "string"]}}},
        "not a record",
        {"pending": [[10**30, 0, "train/loss", 1.0]], "backends": {}},
        {"pending": [[3, 1, "val/a(c)c", 1.0]], "backends": {}},
        {"pending": [[3, 1, "v" * 600, 1.0]], "backends": {}},
        {"pending": [], "backends": {"csv": {"step": 10**30}}},
    ],
)
def test_an_edited_tracking_record_is_ignored_with_one_warning(tmp_path, record):
    run_train(
        tmp_path, "model.hidden_sizes=[16]", "trainer.max_epochs=1", "logger=csv", "run_name=edited"
    )
    path = tmp_path / "checkpoints" / "edited" / "last.pt"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["tracking"] = record
    torch.save(checkpoint, path)
    result = run_train(
        tmp_path,
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=2",
        "logger=csv",
        "run_name=edited",
        "resume=auto",
    )
    assert (result.stdout + result.stderr).count("tracking record is not what torchloom") == 1
    val = [step for step, _ in csv_history(tmp_path / "runs" / "edited")["val/acc"]]
    assert val == [20, 40]


@pytest.mark.slow
def test_two_torchrun_processes_are_one_tracked_run(tmp_path):
    torchrun(
        tmp_path,
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=2",
        "run_name=ddp",
        "trainer.log_every_n_steps=3",
        "logger=[csv,mlflow,wandb]",
        env=ENV,
    )
    (run,) = mlflow_runs(store(tmp_path), "ddp")
    assert run.info.status == "FINISHED"
    assert len(wandb_attempts(tmp_path / "runs" / "ddp")) == 1
    rows = [(r["step"], r["tag"]) for r in csv_rows(tmp_path / "runs" / "ddp")]
    assert rows and len(rows) == len(set(rows))  # one process wrote them


@pytest.mark.slow
def test_a_real_mlflow_server_on_localhost_holds_the_run_and_its_evaluation(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--workers",
            "1",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a server that never starts, not a timing window
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.5)
        run_train(
            tmp_path,
            "model.hidden_sizes=[16]",
            "trainer.max_epochs=2",
            "logger=mlflow",
            f"logger.mlflow.tracking_uri={uri}",
            "run_name=served/first",
        )
        run_evaluate(
            tmp_path,
            "ckpt=checkpoints/served/first/best.pt",
            "logger=mlflow",
            f"logger.mlflow.tracking_uri={uri}",
        )
        (run,) = mlflow_runs(uri, "served/first")
        assert run.info.status == "FINISHED"
        assert run.data.metrics["evaluate/test/acc"] == pytest.approx(run.data.metrics["test/acc"])
        history = mlflow_history(uri, run.info.run_id)
        assert [step for step, _ in history["val/acc"]] == [20, 40]
        assert not (tmp_path / "runs" / "mlflow.db").exists()  # nothing local with a server
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_a_checkpoint_from_before_tracking_resumes_into_a_new_tracked_run_quietly(tmp_path):
    run_train(
        tmp_path, "model.hidden_sizes=[16]", "trainer.max_epochs=1", "logger=csv", "run_name=older"
    )
    path = tmp_path / "checkpoints" / "older" / "last.pt"
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["tracking"]  # as torchloom wrote checkpoints before the logger group
    torch.save(checkpoint, path)
    result = run_train(
        tmp_path,
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=2",
        "logger=csv",
        "run_name=older",
        "resume=auto",
    )
    assert "tracking record" not in result.stdout + result.stderr
    val = [step for step, _ in csv_history(tmp_path / "runs" / "older")["val/acc"]]
    assert val == [20, 40]  # the CSV continues; nothing was cut or doubled


def test_resuming_an_older_checkpoint_starts_new_tracked_runs_and_cuts_the_csv(tmp_path):
    job = (
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=3",
        "trainer.keep_top_k=3",
        "logger=[csv,mlflow]",
        "run_name=older_point",
    )
    run_train(tmp_path, *job)
    (first,) = tmp_path.glob("checkpoints/older_point/epoch=001-*.pt")
    result = run_train(tmp_path, *job, f"resume='{first}'")
    assert (result.stdout + result.stderr).count("older than the last one the run tracked") == 1
    runs = mlflow_runs(store(tmp_path), "older_point")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    newer = max(runs, key=lambda r: r.info.start_time)
    assert [s for s, _ in mlflow_history(store(tmp_path), newer.info.run_id)["val/acc"]] == [40, 60]
    val = [step for step, _ in csv_history(tmp_path / "runs" / "older_point")["val/acc"]]
    assert val == [20, 40, 60]  # the later rows were cut, then logged once by the resumed run


def test_an_edited_run_id_never_writes_into_another_tracked_run(tmp_path):
    # A checkpoint edited (or copied) to name another run's MLflow run and W&B id: the resume
    # leaves those runs as they were and continues its history in a run of its own.
    job = ("model.hidden_sizes=[16]", "logger=[mlflow,wandb]")
    run_train(tmp_path, *job, "trainer.max_epochs=1", "run_name=victim", env=ENV)
    run_train(tmp_path, *job, "trainer.max_epochs=1", "run_name=edited_id", env=ENV)
    (victim,) = mlflow_runs(store(tmp_path), "victim")
    before = mlflow_history(store(tmp_path), victim.info.run_id)
    (victim_attempt,) = wandb_attempts(tmp_path / "runs" / "victim")
    path = tmp_path / "checkpoints" / "edited_id" / "last.pt"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["tracking"]["backends"] = {
        "mlflow": {"run_id": victim.info.run_id},
        "wandb": {"id": victim_attempt["id"]},
    }
    torch.save(checkpoint, path)
    result = run_train(
        tmp_path, *job, "trainer.max_epochs=2", "run_name=edited_id", "resume=auto", env=ENV
    )
    said = result.stdout + result.stderr
    assert "is not this run's (another token)" in said and "W&B id" in said
    assert mlflow_history(store(tmp_path), victim.info.run_id) == before
    assert mlflow_runs(store(tmp_path), "victim")[0].info.status == "FINISHED"
    ids = {a["id"] for a in wandb_attempts(tmp_path / "runs" / "edited_id")}
    assert victim_attempt["id"] not in ids and len(ids) == 1


def test_the_trackers_carry_the_runs_provenance(straight):
    # MLflow: the commit as MLflow names it, the dirty flag and the data fingerprint as tags,
    # provenance.json as an artifact; W&B: the same in its summary. Never the diff.
    cwd, _ = straight
    from mlflow import MlflowClient

    record = json.loads((cwd / "runs" / "straight" / "provenance.json").read_text())
    (run,) = mlflow_runs(store(cwd), "straight")
    tags = run.data.tags
    if record["code"]["commit"] is not None:  # a checkout with git
        assert tags["mlflow.source.git.commit"] == record["code"]["commit"]
    assert tags["torchloom.git_dirty"] == str(record["code"]["dirty"]).lower()
    assert len(tags["torchloom.data_fingerprint"]) == 64
    artifacts = MlflowClient(store(cwd)).list_artifacts(run.info.run_id)
    assert "provenance.json" in [a.path for a in artifacts]
    (attempt,) = wandb_attempts(cwd / "runs" / "straight")
    summary = attempt["summary"]
    assert summary["provenance/torchloom.data_fingerprint"] == tags["torchloom.data_fingerprint"]
