"""Searches that stop bad trials early and survive a kill: torchloom's Optuna sweeper
(``hydra/sweeper=torchloom_optuna``; ``pip install -e ".[sweep]"``, Optuna 4.7 or later).

    python train.py -m hparams_search=digits_optuna run_name=search1
    python train.py -m hparams_search=digits_optuna run_name=search1 hydra.sweeper.pruner=hyperband
    python train.py -m hparams_search=digits_optuna run_name=search1    # again: the study goes on

The sweeper asks the study for a trial, runs it as a job of the sweep in
``runs/<run_name>/<trial number>/`` and tells the study how it ended. Inside the job, after
each validation, the monitored value is reported to the trial (utils/run/trial.py
:class:`PruneTrial`, a callback train.py adds in a trial's job); when the pruner says stop, the job ends as a
callback's stop ends a run: its checkpoint and metrics.json kept, ``stopped_by`` naming
``pruned`` and the epoch, and the trial is told pruned. Under ``cv=K`` each fold reports once
it ends, and a pruned trial trains no further fold (``pruner=wilcoxon``: a paired test of its
folds against the best trial's; utils/run/cross_validation.py). With several objectives
(``directions`` and ``objectives``, figures of each trial's metrics.json) the study is
Optuna's multi-objective one, unpruned, and its Pareto front is the answer.

The study lives on disk: by default a SQLite file, ``runs/<run_name>/study.db``;
``storage: journal`` keeps it in ``runs/<run_name>/study.journal`` (Optuna's journal file,
for processes that share a filesystem); any URL Optuna's storage takes (``sqlite:///...``,
``postgresql://...``) or a path ending in ``.journal``. Running the same command again
continues the study: ended trials (complete, pruned, failed) stay, ``n_trials`` counts them, and a trial
a kill stopped (its owner, a process of this machine, is gone; or, on another machine, its
heartbeat is four beats old) runs again under its number with its parameters, from its own
``last.pt``. Several workers (two shells, joblib) share the
study; a trial is claimed under a lock file beside a local study, so no trial runs twice.

A password in a storage URL never reaches a file: the sweeper hands the URL to the jobs in
the environment and leaves ``***`` in the config Hydra writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict

from utils.config.arguments import finite_number
from utils.config.monitor import monitor_mode
from utils.errors import UserError
from utils.run.study import (
    DIRECTIONS,
    HEARTBEAT_ATTR,
    OBJECTIVES_ATTR,
    OWNER_ATTR,
    SPACE_ATTR,
    STORAGE_ENV,
    STUDY_ENV,
    TRIAL_ENV,
    described_space,
    opened_storage,
    optuna,
    override_of,
    pruner_of,
    redacted,
    sampler_of,
    search_space,
    storage_url,
)
from utils.run.sweep import trial_state

log = logging.getLogger("torchloom")


@contextlib.contextmanager
def claimed(sweep_dir: Path) -> Iterator[None]:
    """One worker at a time decides which trial it runs next (a lock file in the sweep dir)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".study.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# A sweeper writes the time into each trial it runs every hydra.sweeper.heartbeat_seconds; a
# trial of another machine whose time is this many beats old has lost its sweeper.
STALE_BEATS = 4


@contextlib.contextmanager
def heartbeat(study: Any, trials: list[Any], seconds: float) -> Iterator[None]:
    """While ``trials`` run: the time in each of them now and every ``seconds`` after (a
    thread), so that sweepers on other machines can tell a live trial from an orphan."""

    def beat() -> None:
        for trial in trials:
            study._storage.set_trial_system_attr(trial._trial_id, HEARTBEAT_ATTR, time.time())

    beat()
    stop = threading.Event()

    def beating() -> None:
        while not stop.wait(seconds):
            try:
                beat()
            except Exception as error:  # the storage busy or away a moment: the next beat
                log.debug("heartbeat not written: %s", error)

    thread = threading.Thread(target=beating, name="study-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def owner_gone(trial: Any, heartbeat_seconds: float, now: float) -> bool:
    """Whether a running trial's sweeper has ended (a kill, a preemption): a process of this
    machine that is gone, or, on another machine, one whose heartbeat is older than
    :data:`STALE_BEATS` beats (clocks agreeing to well within that, as NTP keeps them). Its
    trial is continued by the next sweeper to look."""
    host, _, pid = str(trial.system_attrs.get(OWNER_ATTR, "")).rpartition(":")
    if host != socket.gethostname():
        beat = trial.system_attrs.get(HEARTBEAT_ATTR)
        return finite_number(beat) and now - beat > STALE_BEATS * heartbeat_seconds
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --- The sweeper -----------------------------------------------------------------------------


class StudySweeper(Sweeper):
    """``hydra/sweeper=torchloom_optuna`` (conf/hydra/sweeper/torchloom_optuna.yaml): the module's docstring."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.url = storage_url(self.settings.get("storage"), self.sweep_dir)
        os.environ[STORAGE_ENV] = self.url  # the jobs' way to the study; never in a file
        with open_dict(config):
            config.hydra.sweeper.storage = redacted(self.url)
            config.hydra.overrides.hydra = [redacted(o) for o in config.hydra.overrides.hydra]
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> list[Any]:
        library = optuna()
        study = self._study(arguments)
        seconds = self.settings.get("heartbeat_seconds", 30)
        self.heartbeat_seconds = float(seconds) if finite_number(seconds) else 0.0
        if self.heartbeat_seconds <= 0:
            raise UserError(
                f"hydra.sweeper.heartbeat_seconds={self.settings.get('heartbeat_seconds')} "
                "must be a number of seconds above 0 (30 by default)"
            )
        total = int(self.settings.get("n_trials", 20))
        batch = max(int(self.settings.get("n_jobs", 1)), 1)
        returns = []
        while True:
            with claimed(self.sweep_dir):
                trials = self._next_trials(study, total, batch)
            if not trials:
                break
            returns.append(self._run(study, trials))
        self._write_results(study, library)
        return returns

    def _write_results(self, study: Any, library: Any) -> None:
        """``optimization_results.yaml``: the best trial's parameters and value; with several
        objectives, every trial on the Pareto front (``solutions``: its parameters and values,
        in the order of ``objectives``), as hydra-optuna-sweeper writes them."""
        done = [
            t
            for t in study.get_trials(deepcopy=False)
            if t.state == library.trial.TrialState.COMPLETE
        ]
        if not done:
            return
        if len(self.objectives) > 1:
            front = sorted(study.best_trials, key=lambda t: t.number)
            solutions = [
                {"number": t.number, "params": t.params, "values": t.values} for t in front
            ]
            results = {"name": "optuna", "objectives": self.objectives, "solutions": solutions}
            log.info("Pareto front: trials %s", ", ".join(str(t.number) for t in front))
        else:
            best = study.best_trial
            results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
            log.info("best trial %d: %s = %s", best.number, best.params, best.value)
        OmegaConf.save(OmegaConf.create(results), self.sweep_dir / "optimization_results.yaml")

    def _study(self, arguments: list[str]) -> Any:
        library = optuna()
        distributions, fixed = search_space(self.settings.get("params") or {}, arguments)
        if not distributions:
            raise UserError(
                "hydra/sweeper=torchloom_optuna has nothing to search; give hydra.sweeper.params or a "
                "choice(...)/interval(...) override"
            )
        self.distributions, self.fixed = distributions, fixed
        self.objectives, directions = objectives_of(self.settings, self.config)
        name = str(self.settings.get("study_name") or "torchloom")
        storage = opened_storage(self.url)
        # A continued study draws on from where it stopped: the sampler's seed moves on by the
        # trials it holds (re-seeded as at the start, it would propose the first points again).
        seed, held = self.settings.get("seed"), _trials_held(storage, name)
        sampler = sampler_of(
            self.settings.get("sampler", "tpe"),
            None if seed is None else int(seed) + held,
            distributions,
        )
        study = library.create_study(
            storage=storage,
            study_name=name,
            sampler=sampler,
            pruner=pruner_of(self.settings, self.config.get("cv")),
            directions=directions,
            load_if_exists=True,
        )
        made = [d.name.lower() for d in study.directions]
        if made != directions:
            raise UserError(
                f"study {name} at {redacted(self.url)} was made to {', '.join(made)}, and "
                f"hydra.sweeper asks {', '.join(directions)}; give the study a new study_name"
            )
        space = described_space(distributions)
        stored = study.user_attrs.get(SPACE_ATTR)
        if stored is None:
            study.set_user_attr(SPACE_ATTR, space)
            study.set_user_attr(OBJECTIVES_ATTR, self.objectives)
        elif stored != space:
            raise UserError(
                f"study {name} at {redacted(self.url)} searches another space than "
                "hydra.sweeper.params; give this search a new study_name (nothing was changed)"
            )
        elif study.user_attrs.get(OBJECTIVES_ATTR, self.objectives) != self.objectives:
            raise UserError(
                f"study {name} at {redacted(self.url)} was made for the objectives "
                f"{', '.join(study.user_attrs[OBJECTIVES_ATTR])}, not "
                f"{', '.join(self.objectives)}; give this search a new study_name"
            )
        os.environ[STUDY_ENV] = name
        return study

    def _next_trials(self, study: Any, total: int, batch: int) -> list[Any]:
        """Up to ``batch`` trials to run: first those a kill stopped, then new ones, while the
        ended (complete, pruned or failed) and running ones are fewer than ``n_trials``."""
        library = optuna()
        states = library.trial.TrialState
        trials = study.get_trials(deepcopy=False)
        done = sum(t.state in (states.COMPLETE, states.PRUNED, states.FAIL) for t in trials)
        running = [t for t in trials if t.state == states.RUNNING]
        beats, now = self.heartbeat_seconds, time.time()
        orphans = [t for t in running if owner_gone(t, beats, now)]
        chosen = []
        for frozen in orphans[:batch]:
            study._storage.set_trial_system_attr(frozen._trial_id, OWNER_ATTR, owner())
            study._storage.set_trial_system_attr(frozen._trial_id, HEARTBEAT_ATTR, now)
            log.info("trial %d: its sweeper was stopped; continuing it", frozen.number)
            chosen.append(library.trial.Trial(study, frozen._trial_id))
        live = len(running) - len(orphans)
        while len(chosen) < batch and done + live + len(chosen) < total:
            trial = study.ask(self.distributions)
            study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, owner())
            study._storage.set_trial_system_attr(trial._trial_id, HEARTBEAT_ATTR, now)
            chosen.append(trial)
        return chosen

    def _run(self, study: Any, trials: list[Any]) -> list[JobReturn]:
        jobs = []
        for trial in trials:
            params = [override_of(k, trial.params[k]) for k in self.distributions]
            hydra = [
                f"hydra.sweep.subdir={trial.number}",
                f"+hydra.job.env_set.{TRIAL_ENV}={trial.number}",
            ]
            jobs.append((*self.fixed, *params, *hydra))
        with heartbeat(study, trials, self.heartbeat_seconds):
            returns = self.launcher.launch(jobs, initial_job_idx=trials[0].number)
        for trial, job in zip(trials, returns, strict=True):
            self._tell(study, trial, job)
        return returns

    def _tell(self, study: Any, trial: Any, job: JobReturn) -> None:
        library = optuna()
        states = library.trial.TrialState
        metrics_file = self.sweep_dir / str(trial.number) / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
        state = trial_state({"status": "unfinished", **metrics})  # as the summary says it
        value = job.return_value if job.status.name == "COMPLETED" else None
        values = [value] if len(self.objectives) == 1 else [metrics.get(o) for o in self.objectives]
        if state == "pruned":
            study.tell(trial, state=states.PRUNED)
        elif state != "complete" or not all(finite_number(v) for v in values):
            if state == "complete":  # finished without a figure an objective names
                missing = [
                    o for o, v in zip(self.objectives, values, strict=True) if not finite_number(v)
                ]
                log.warning(
                    "warning: trial %d's metrics.json has no number for %s; told failed",
                    trial.number,
                    ", ".join(missing),
                )
            study.tell(trial, state=states.FAIL)
        else:
            study.tell(trial, [float(v) for v in values])


def _trials_held(storage: Any, name: str) -> int:
    """How many trials the study ``name`` holds in ``storage`` (0: there is none yet)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))


def objectives_of(settings: dict, config: DictConfig) -> tuple[list[str], list[str]]:
    """(the metrics the study optimises, their directions): the job's monitored value, to
    ``hydra.sweeper.direction``; or, with ``hydra.sweeper.directions`` (several objectives),
    the figures ``hydra.sweeper.objectives`` names, read from each trial's metrics.json. A
    direction against a metric's own (trainer.monitor_mode for the monitor; loss and error
    lower, accuracy higher, ...) is refused."""
    trainer = config.get("trainer") or {}
    monitor = str(trainer.get("monitor"))
    several = settings.get("directions")
    if not several:
        direction = str(settings.get("direction", "maximize"))
        _check_direction("direction", direction, monitor, trainer.get("monitor_mode", "auto"))
        return [monitor], [direction]
    directions = [str(d) for d in several]
    objectives = [str(o) for o in settings.get("objectives") or ()]
    if len(objectives) != len(directions) or len(set(objectives)) != len(objectives):
        raise UserError(
            f"hydra.sweeper.directions={directions} needs hydra.sweeper.objectives: one "
            "metric of metrics.json a direction, each once (e.g. objectives=[val/acc,"
            "train/samples_per_second] directions=[maximize,maximize])"
        )
    for objective, direction in zip(objectives, directions, strict=True):
        mode = trainer.get("monitor_mode", "auto") if objective == monitor else "auto"
        _check_direction(f"directions ({objective})", direction, objective, mode)
    return objectives, directions


def _check_direction(key: str, direction: str, metric: str, mode: str) -> None:
    """``direction`` (hydra.sweeper.``key``) must agree with the way ``metric`` improves."""
    if direction not in DIRECTIONS:
        raise UserError(f"hydra.sweeper.{key}={direction!r} must be maximize or minimize")
    try:
        improves = monitor_mode(metric, mode)
    except Exception:
        return  # a name whose direction cannot be told: the user's word; a bad monitor: the job's
    if (improves == "max") != (direction == "maximize"):
        said = (
            f"{metric}, which is better {'higher' if improves == 'max' else 'lower'}"
            if key != "direction"
            else f"trainer.monitor_mode={improves} ({metric})"
        )
        raise UserError(
            f"hydra.sweeper.{key}={direction} contradicts {said}; set one to agree with the other"
        )
