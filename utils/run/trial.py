"""Inside a search's trial: the job reports its monitored value to the trial the sweeper
(utils/run/search.py) runs it as, after each validation (:class:`PruneTrial`, a callback
train.py adds) or, under ``cv=K``, after each fold (utils/run/cross_validation.py), and ends
when the study's pruner says so. The study, its space and its pruner: utils/run/study.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from utils.config.arguments import finite_number
from utils.run.study import (
    PRUNER_KEYS,
    STORAGE_ENV,
    STUDY_ENV,
    TRIAL_ENV,
    opened_storage,
    optuna,
    pruner_of,
)


def _this_trial() -> tuple[int, dict] | None:
    """(this job's trial number, the sweeper's pruner settings) when the job is a trial of a
    study (its number in the environment the sweeper set), else None."""
    number = os.environ.get(TRIAL_ENV)
    if number is None or not number.isdigit() or STORAGE_ENV not in os.environ:
        return None
    sweeper = HydraConfig.get().sweeper
    settings = {key: sweeper[key] for key in PRUNER_KEYS if key in sweeper}
    return int(number), settings


def trial_callbacks(callbacks: Any, fold_dir: Path | None = None) -> Any:
    """The run's ``callbacks`` node, with :class:`PruneTrial` when this job is a trial of a
    study of one objective and not a fold of cv=K (``fold_dir``: the fold's folder; the
    folds report once each: :func:`fold_reports`)."""
    trial = _this_trial()
    if fold_dir is not None or trial is None or len(trial[1].get("directions") or ()) > 1:
        return callbacks
    number, settings = trial
    entry = {"_target_": f"{__name__}.PruneTrial", "number": number, "pruner": settings}
    node = OmegaConf.to_container(callbacks, resolve=True) if callbacks else {}
    return {**node, PruneTrial.NAME: entry}


def fold_reports(monitor: str, folds: int) -> PruneTrial | None:
    """Under ``cv=folds`` in a trial's job: the trial each fold's monitored value is reported
    to (:meth:`PruneTrial.fold_end`); None outside a study, or in one of several objectives."""
    trial = _this_trial()
    if trial is None or len(trial[1].get("directions") or ()) > 1:
        return None
    reports = PruneTrial(*trial, cv=folds)
    reports.monitor = monitor
    return reports


class PruneTrial:
    """Reports the monitored value after each validation (under cv=K: after each fold) to this
    job's trial; the pruner's stop ends the run as a callback's stop does (checkpoint, test,
    metrics.json), or ends a cross-validation before its next fold."""

    NAME = "pruned"

    def __init__(self, number: int, pruner: dict, cv: int | None = None) -> None:
        self.number, self.pruner, self.cv = number, dict(pruner), cv
        self.monitor: str | None = None
        self._trial = None

    def on_fit_start(self, info: Any) -> None:
        self.monitor = info.config["trainer"]["monitor"]

    def _opened(self) -> Any:
        if self._trial is None:
            library = optuna()
            study = library.load_study(
                study_name=os.environ[STUDY_ENV],
                storage=opened_storage(os.environ[STORAGE_ENV]),
                pruner=pruner_of(self.pruner, self.cv),
            )
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(
                study._study_id, self.number
            )
            self._trial = library.trial.Trial(study, trial_id)
        return self._trial

    def on_validation_end(self, epoch: int, metrics: dict) -> str | None:
        return self._reported(epoch, metrics.get(self.monitor), "epoch")

    def fold_end(self, fold: int, value: Any) -> str | None:
        """Fold ``fold``'s best monitored value, reported as the trial's step ``fold`` (the
        last one too: a finished trial's folds are what later trials are compared with); the
        reason to stop before the next fold when the pruner says so."""
        return self._reported(fold, value, "fold", last=fold + 1 == self.cv)

    def _reported(self, step: int, value: Any, unit: str, last: bool = False) -> str | None:
        if not finite_number(value):
            return None
        trial = self._opened()
        trial.report(float(value), step=step)
        if last or not trial.should_prune():
            return None
        trial.set_user_attr(f"pruned_at_{unit}", step)
        return f"pruned by the study at {unit} {step} ({self.monitor} {value:.4f})"
