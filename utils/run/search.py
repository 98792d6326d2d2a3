"""Searches that stop bad trials early and survive a kill: torchloom's Optuna sweeper
(``hydra/sweeper=torchloom_optuna``; ``pip install -e ".[sweep]"``, Optuna 4.7 or later).

    python train.py -m hparams_search=digits_optuna run_name=search1
    python train.py -m hparams_search=digits_optuna run_name=search1 hydra.sweeper.pruner=hyperband
    python train.py -m hparams_search=digits_optuna run_name=search1    # again: the study goes on

The sweeper asks the study for a trial, runs it as a job of the sweep in
``runs/<run_name>/<trial number>/`` and tells the study how it ended. Inside the job, after
each validation, the monitored value is reported to the trial (utils/run/study.py
:class:`PruneTrial`, a callback train.py adds in a trial's job); when the pruner says stop, the job ends as a
callback's stop ends a run: its checkpoint and metrics.json kept, ``stopped_by`` naming
``pruned`` and the epoch, and the trial is told pruned.

The study lives on disk: by default a SQLite file, ``runs/<run_name>/study.db``;
``storage: journal`` keeps it in ``runs/<run_name>/study.journal`` (Optuna's journal file,
for processes that share a filesystem); any URL Optuna's storage takes (``sqlite:///...``,
``postgresql://...``) or a path ending in ``.journal``. Running the same command again
continues the study: ended trials (complete, pruned, failed) stay, ``n_trials`` counts them, and a trial
a kill stopped (its owner, a process of this machine, is gone) runs again under its number
with its parameters, from its own ``last.pt``. Several workers (two shells, joblib) share the
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


def owner_gone(trial: Any) -> bool:
    """Whether a running trial's sweeper was a process of this machine that has ended (a kill,
    a preemption): its trial is continued by the next sweeper to look."""
    host, _, pid = str(trial.system_attrs.get(OWNER_ATTR, "")).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
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
        total = int(self.settings.get("n_trials", 20))
        batch = max(int(self.settings.get("n_jobs", 1)), 1)
        returns = []
        while True:
            with claimed(self.sweep_dir):
                trials = self._next_trials(study, total, batch)
            if not trials:
                break
            returns.append(self._run(study, trials))
        best = _best(study, library)
        if best is not None:
            results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
            OmegaConf.save(OmegaConf.create(results), self.sweep_dir / "optimization_results.yaml")
            log.info("best trial %d: %s = %s", best.number, best.params, best.value)
        return returns

    def _study(self, arguments: list[str]) -> Any:
        library = optuna()
        distributions, fixed = search_space(self.settings.get("params") or {}, arguments)
        if not distributions:
            raise UserError(
                "hydra/sweeper=torchloom_optuna has nothing to search; give hydra.sweeper.params or a "
                "choice(...)/interval(...) override"
            )
        self.distributions, self.fixed = distributions, fixed
        direction = str(self.settings.get("direction", "maximize"))
        if direction not in DIRECTIONS:
            raise UserError(f"hydra.sweeper.direction={direction!r} must be maximize or minimize")
        _check_direction(direction, self.config)
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
            pruner=pruner_of(self.settings),
            direction=direction,
            load_if_exists=True,
        )
        if study.direction.name.lower() != direction:
            raise UserError(
                f"study {name} at {redacted(self.url)} was made to {study.direction.name.lower()}"
                f", and hydra.sweeper.direction={direction}; give the study a new study_name"
            )
        space = described_space(distributions)
        stored = study.user_attrs.get(SPACE_ATTR)
        if stored is None:
            study.set_user_attr(SPACE_ATTR, space)
        elif stored != space:
            raise UserError(
                f"study {name} at {redacted(self.url)} searches another space than "
                "hydra.sweeper.params; give this search a new study_name (nothing was changed)"
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
        orphans = [t for t in running if owner_gone(t)]
        chosen = []
        for frozen in orphans[:batch]:
            study._storage.set_trial_system_attr(frozen._trial_id, OWNER_ATTR, owner())
            log.info("trial %d: its sweeper was stopped; continuing it", frozen.number)
            chosen.append(library.trial.Trial(study, frozen._trial_id))
        live = len(running) - len(orphans)
        while len(chosen) < batch and done + live + len(chosen) < total:
            trial = study.ask(self.distributions)
            study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, owner())
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
        if state == "pruned":
            study.tell(trial, state=states.PRUNED)
        elif state != "complete" or not finite_number(value):
            study.tell(trial, state=states.FAIL)
        else:
            study.tell(trial, float(value))


def _trials_held(storage: Any, name: str) -> int:
    """How many trials the study ``name`` holds in ``storage`` (0: there is none yet)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))


def _best(study: Any, library: Any) -> Any:
    done = [
        t for t in study.get_trials(deepcopy=False) if t.state == library.trial.TrialState.COMPLETE
    ]
    return study.best_trial if done else None


def _check_direction(direction: str, config: DictConfig) -> None:
    """``direction`` must agree with trainer.monitor_mode (the value each job returns)."""
    trainer = config.get("trainer") or {}
    try:
        mode = monitor_mode(trainer.get("monitor"), trainer.get("monitor_mode", "auto"))
    except Exception:
        return  # the jobs say what is wrong with the monitor
    if (mode == "max") != (direction == "maximize"):
        raise UserError(
            f"hydra.sweeper.direction={direction} contradicts trainer.monitor_mode={mode} "
            f"({trainer.get('monitor')}); set one to agree with the other"
        )
