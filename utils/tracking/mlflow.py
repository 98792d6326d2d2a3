"""``logger=mlflow``: the run in an MLflow tracking store, through ``MlflowClient`` only (no
active-run stack, so the jobs of a sweep in one process never share a run).

The store is ``logger.mlflow.tracking_uri``, by default a sqlite file under ``paths.runs``
(``runs/mlflow.db``: offline, no server); any MLflow URI works (``http://host:5000``). The
experiment is the run name's first part (``logger.mlflow.experiment`` names another); a sweep
job is its own run, tagged with the sweep. MLflow cannot drop points, so it gets a
checkpoint's points once the checkpoint is written (utils/tracking/tracker.py), and the run is created
then too: a run killed before its first checkpoint leaves no run behind.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from utils.config.build import flatten
from utils.errors import UserError
from utils.system.signals import until_stopped
from utils.tracking.local import Backend
from utils.tracking.tracker import FAILED, TOKEN, TrackedRun, provenance_tags

log = logging.getLogger("torchloom")
METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch call
PARAMS_PER_BATCH = 100


def local_store(runs_root: Path) -> str:
    return f"sqlite:///{(Path(runs_root) / 'mlflow.db').resolve()}"


class Mlflow(Backend):
    name = "mlflow"
    holds = True
    own_process = True  # its import and store check take seconds: run beside the training

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None) -> None:
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.client: Any = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.tracked: TrackedRun | None = None

    def prepare(self, runs_root: Path) -> None:
        """MLflow's import and the store's start-up check: seconds, so done in a process of
        its own while the run sets up (utils/tracking/process.py)."""
        self.client = connect(self.tracking_uri or local_store(runs_root))

    # Every call that reaches the store is waited for so that a stop request ends the wait
    # within seconds (utils/system/signals.py until_stopped): a server that accepts and never answers
    # cannot hold a stopped run.

    def open(self, run: TrackedRun, stored: dict | None, step: int | None) -> None:
        until_stopped(lambda: self._open(run, stored), "logger.mlflow's store")

    def send(self, points: list) -> None:
        until_stopped(lambda: self._send(points), "logger.mlflow's store")

    def missing(self, points: list) -> list:
        return until_stopped(lambda: self._missing(points), "logger.mlflow's store")

    def summary(self, config: Mapping, final: Mapping[str, float], metrics: Mapping) -> None:
        until_stopped(lambda: self._summary(metrics), "logger.mlflow's store")

    def close(self, status: str) -> None:
        until_stopped(lambda: self._close(status), "logger.mlflow's store")

    def _open(self, run: TrackedRun, stored: dict | None) -> None:
        if self.client is None:  # not prepared
            self.client = connect(self.tracking_uri or local_store(run.runs_root))
        self.tracked = run
        local = self.client.tracking_uri.startswith(("sqlite:", "file:", "/"))
        artifacts = (Path(run.runs_root) / "mlartifacts").resolve().as_uri() if local else None
        self.experiment_id = experiment_id(
            self.client, self.experiment or run.experiment, artifacts
        )
        run_id = (stored or {}).get("run_id")
        if stored is not None and not (isinstance(run_id, str) and run_id):
            run_id = run_by_token(self.client, [self.experiment_id], run.token)  # killed while
        if isinstance(run_id, str) and run_id:  # its first checkpoint's points were sent
            self.run_id = reattach(self.client, run_id, run.token)

    def _start(self) -> None:
        """The run, its tags and the flattened config as its parameters."""
        from mlflow.entities import Param

        run = self.tracked
        tags = {"torchloom.run_name": run.name, "torchloom.token": run.token}
        tags |= provenance_tags(run.run_dir)  # commit, dirty flag, data fingerprint
        if run.job is not None:
            tags |= {"torchloom.sweep": run.name, "torchloom.job": run.job}
        created = self.client.create_run(self.experiment_id, run_name=run.display_name, tags=tags)
        self.run_id = created.info.run_id
        if (run.run_dir / "provenance.json").is_file():
            self.client.log_artifact(self.run_id, str(run.run_dir / "provenance.json"))
        params = [Param(k, v) for k, v in shortened_params(run.config).items()]
        for start in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + PARAMS_PER_BATCH])
        log.info(
            "logger.mlflow: run %s in experiment %r at %s",
            self.run_id,
            self.experiment or run.experiment,
            self.client.tracking_uri,
        )

    def _send(self, points: list) -> None:
        if not points:
            return
        if self.run_id is None:
            self._start()
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(p.tag, p.value, now, p.step) for p in points]
        for start in range(0, len(metrics), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + METRICS_PER_BATCH])

    def _missing(self, points: list) -> list:
        """The points after the last step MLflow holds of each tag (a kill may have come
        while a checkpoint's points were being sent)."""
        if self.run_id is None:
            return points
        held = {}
        for tag in {p.tag for p in points}:
            steps = [m.step for m in self.client.get_metric_history(self.run_id, tag)]
            held[tag] = max(steps, default=-1)
        return [p for p in points if p.step > held[p.tag]]

    def position(self) -> dict:
        return {"run_id": self.run_id} if self.run_id else {}

    def _summary(self, metrics: Mapping) -> None:
        if self.run_id is None:
            self._start()
        best = metrics.get("best_checkpoint")
        if best:
            self.client.set_tag(self.run_id, "torchloom.best_checkpoint", str(best))
        self.client.log_dict(self.run_id, dict(metrics), "metrics.json")

    def _close(self, status: str) -> None:
        if self.client is None:
            return
        if self.run_id is None and status == FAILED:  # an attempt that failed before a
            self._start()  # checkpoint: its config, marked failed
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)


def connect(uri: str) -> Any:
    """A client of the store ``uri``, checked once at start-up (a server that does not answer
    is one line, after MLflow's own retries), with MLflow's and its database's start-up
    chatter kept off the console."""
    from mlflow import MlflowClient  # its import sets up its own loggers: quieted after

    for name in ("mlflow", "alembic", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR if name == "urllib3" else logging.WARNING)
    try:
        with store_lock(uri):  # two runs on a fresh store: one creates and migrates it
            client = MlflowClient(tracking_uri=uri)
            with few_retries():
                client.search_experiments(max_results=1)  # creates a new sqlite store's tables
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(
            f"logger.mlflow.tracking_uri={uri}: MLflow cannot use that store "
            f"({first[:200]}); check the URI or the server"
        ) from None
    return client


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """For a local sqlite store: an exclusive lock on ``<store>.lock`` while the first client
    creates and migrates its tables (MLflow's migration is not safe against a second process
    doing the same at once: the documented joblib sweep failed a job, or broke the store)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@contextmanager
def few_retries() -> Iterator[None]:
    """MLflow retries an HTTP request for minutes by default: right for a run's points, too
    long for the start-up check. The user's own MLFLOW_HTTP_REQUEST_* settings still win."""
    quick = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    }  # a server that never answers: ~20 s in all
    added = {k: v for k, v in quick.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def experiment_id(client: Any, name: str, artifacts: str | None) -> str:
    """The experiment called ``name``, created when new (two sweep jobs may race to it)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifacts)
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def run_by_token(client: Any, experiments: list[str], token: Any) -> str | None:
    """The run a resumed run's token names, if one was made before a checkpoint said so."""
    if not isinstance(token, str) or not TOKEN.fullmatch(token):
        return None
    found = client.search_runs(experiments, f"tags.`torchloom.token` = '{token}'", max_results=1)
    return found[0].info.run_id if found else None


def reattach(client: Any, run_id: str, token: str) -> str | None:
    """The stored run, running again; None (a new run) when the store does not have it, or
    when it is not this run's (its token differs: the checkpoint was edited or copied)."""
    found = fetched(client, run_id)
    if found is None:
        log.warning(
            "warning: logger.mlflow: the checkpoint's run %s is not in %s; the history "
            "continues in a new run",
            run_id,
            client.tracking_uri,
        )
        return None
    if found.data.tags.get("torchloom.token") != token:
        log.warning(
            "warning: logger.mlflow: run %s in %s is not this run's (another token); "
            "not writing into it: the history continues in a new run",
            run_id,
            client.tracking_uri,
        )
        return None
    client.update_run(run_id, status="RUNNING")
    log.info("logger.mlflow: continuing run %s", run_id)
    return run_id


# What MLflow accepts as a param or metric key (mlflow.utils.validation): a key of the config
# named after a data column (data.na_columns.growth%) is mapped to one it accepts, once.
ACCEPTED_KEY = re.compile(r"[/\w.\- :]{1,250}")


def accepted_key(key: str) -> str:
    return key if ACCEPTED_KEY.fullmatch(key) else re.sub(r"[^/\w.\- :]", "_", key)[:250]


def shortened_params(config: Mapping) -> dict[str, str]:
    """The flattened config as MLflow params: over-long values shortened and keys MLflow
    refuses mapped to accepted ones (one warning each)."""
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    params, shortened, renamed = {}, [], []
    for key, value in flatten(config).items():
        text = str(value)
        if len(text) > MAX_PARAM_VAL_LENGTH:
            shortened.append(key)
            text = text[: MAX_PARAM_VAL_LENGTH - 1] + "…"
        if accepted_key(key) != key:
            renamed.append(f"{key} -> {accepted_key(key)}")
        params[accepted_key(key)] = text
    if shortened:
        log.warning(
            "warning: logger.mlflow: %d config value(s) longer than MLflow's %d "
            "characters are shortened in its params (%s); the run dir's .hydra/ and the "
            "checkpoint keep them whole",
            len(shortened),
            MAX_PARAM_VAL_LENGTH,
            ", ".join(shortened[:3]),
        )
    if renamed:
        log.warning(
            "warning: logger.mlflow: %d config key(s) hold characters MLflow refuses "
            "and are named so in its params: %s",
            len(renamed),
            ", ".join(renamed[:3]),
        )
    return params


def log_evaluation(
    node: Any, names: tuple, where: tuple[Path, int], metrics: Mapping[str, Any], prefix: str
) -> tuple[str, str]:
    """``evaluate.py logger=mlflow``: a checkpoint's evaluated metrics into the training run
    it came from (``names``: the run id its checkpoint recorded, and the run's token), as
    ``<prefix>/<name>`` at the checkpoint's step (``where``: the training run's
    ``paths.runs``, for the default store, and that step). Returns the run id and store."""
    from mlflow.entities import Metric

    (run_id, token), (runs_root, step) = names, where
    uri = node.get("tracking_uri")
    if not uri:  # the training run's default store: found, never made from a stored path
        store = Path(runs_root) / "mlflow.db"
        if not store.is_file():
            raise UserError(
                f"logger=mlflow: no MLflow store at {store}, where the checkpoint's "
                "paths.runs puts the default one; pass "
                "logger.mlflow.tracking_uri= the store it was trained with"
            )
        uri = local_store(runs_root)
    client = connect(uri)
    if not isinstance(run_id, str):
        experiments = [e.experiment_id for e in client.search_experiments()]
        run_id = run_by_token(client, experiments, token) if experiments else None
    found = fetched(client, run_id) if isinstance(run_id, str) else None
    if found is None:
        raise UserError(
            "logger=mlflow: the checkpoint's training run is not in "
            f"{client.tracking_uri}; pass logger.mlflow.tracking_uri= the store it "
            "was trained with"
        )
    if not (isinstance(token, str) and token and found.data.tags.get("torchloom.token") == token):
        raise UserError(
            f"logger=mlflow: run {run_id} in {client.tracking_uri} is not the run "
            "that trained this checkpoint (another token: the checkpoint was edited "
            "or copied); nothing was added to it"
        )
    now = int(time.time() * 1000)
    values = [
        Metric(f"{prefix}/{k}", float(v), now, step)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    client.log_batch(run_id, metrics=values)
    return run_id, client.tracking_uri


def fetched(client: Any, run_id: str) -> Any:
    """The run ``run_id`` of the store, or None when it has no such run."""
    try:
        return client.get_run(run_id)
    except Exception:
        return None


def add_to_training_run(
    node: Any, checkpoint: dict, path: Path, config: dict, metrics: dict, split: str
) -> None:
    """The metrics of ``checkpoint`` (read from ``path``; an export's is empty) into the MLflow
    run that trained it, as ``evaluate/<split>/<metric>`` at the checkpoint's step."""
    tracking = checkpoint.get("tracking") if isinstance(checkpoint.get("tracking"), dict) else {}
    backends = tracking.get("backends") if isinstance(tracking.get("backends"), dict) else {}
    run_id = (backends.get("mlflow") or {}).get("run_id")
    token = tracking.get("token")
    if "mlflow" not in backends:
        raise UserError(
            f"logger=mlflow: {path} was not trained with logger=mlflow, so there is "
            "no MLflow run to add its metrics to"
        )
    runs = Path(str((config.get("paths") or {}).get("runs", "runs")))
    step = checkpoint.get("global_step", 0)
    where = (runs, step if isinstance(step, int) else 0)
    run_id, uri = log_evaluation(node, (run_id, token), where, metrics, "evaluate")
    print(f"added the {split} metrics of {path} to MLflow run {run_id} ({uri})")
