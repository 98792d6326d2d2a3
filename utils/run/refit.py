"""``trainer.refit``: once the run is validated and tested, the final model trained again on
train ∪ val, tested on the same test split.

    python train.py data=csv data.path=t.csv data.target=y              # a small table: refits
    python train.py data=csv data.path=t.csv data.target=y trainer.refit=false

On a small table the val split is a sixth of scarce rows, and a model trained on them too is
a better model (scikit-learn's HistGradientBoosting holds nothing out under 10,000 samples; the
figures are in docs/real-data.md). The run itself is what it always was: it picks its epochs
and best.pt on val and is tested. Then the refit, a run of its own with the same config and
seed in ``runs/<run>/refit/`` and ``checkpoints/<run>/refit/``, trains with its val rows
joined to the training split (``trainer.train_on_val``), the run's batch size and epochs
(``auto``: its optimizer steps; the epochs it trained when it stopped early); val is in its
training now, so it is validated only after its last epoch and its ``best.pt`` is its final
weights. ``metrics.json`` of the run gains ``refit/...`` (its test figures and checkpoint);
``predict.py``, ``evaluate.py`` and the exports take ``checkpoints/<run>/refit/best.pt`` as
any checkpoint. ``resume=auto`` finishes a refit a kill stopped from its ``last.pt``. It runs
in one process: under torchrun ``auto`` does not refit (each process would need the run's
metrics.json at once) and ``true`` is refused.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from data.batching.dataset import capabilities_of
from utils.config.build import builder_of
from utils.errors import UserError
from utils.files import write_json
from utils.report.run import write_run_report
from utils.run.folders import REFIT_FOLDER
from utils.run.outputs import read_metrics, report_safely
from utils.system.distributed import processes_from_env

log = logging.getLogger("torchloom")
AUTO_ROWS = 10_000  # refit=auto: a CSV table whose train ∪ val hold fewer rows
ONCE = 10**9  # the refit's val_every_n_epochs: validated after its last epoch alone


def check_refit(cfg: DictConfig) -> None:
    """``trainer.refit`` before any data is read (with ``cv=K``: utils/run/cross_validation.py
    ``check_cv``)."""
    refit = cfg.trainer.refit  # train_on_val: a bool, as the schema types it
    if not (refit == "auto" or isinstance(refit, bool)):
        raise UserError(f"trainer.refit={refit!r} must be auto, true or false")
    if refit is True and processes_from_env().enabled:
        raise UserError(
            "trainer.refit=true runs in one process (it is for tables that fit one); under "
            "torchrun leave it out, or refit with python train.py"
        )


def refit(cfg: DictConfig, stop: Any, train: Callable[..., float]) -> None:
    """After ``train(cfg)`` finished: the refit when ``trainer.refit`` asks for one (and the
    run's ``metrics.json`` says it fits), ``train(config, stop, run_dir)`` being train.py's
    recipe; its test figures then join the run's ``metrics.json``."""
    if processes_from_env().enabled:  # torchrun: auto never refits (true is refused)
        return
    root = Path(HydraConfig.get().runtime.output_dir)
    first = read_metrics(root)
    if first is None or not _wanted(cfg, first):
        return
    job = refit_config(cfg, first)
    rows = first["samples"]["train"] + first["samples"]["val"]
    log.info(
        "refit: the run again on train ∪ val (%d rows) -> %s (trainer.refit=false skips it)",
        rows,
        root / REFIT_FOLDER,
    )
    train(job, stop, root / REFIT_FOLDER)
    refitted = read_metrics(root / REFIT_FOLDER)
    if refitted is None:
        return
    figures = {k: v for k, v in refitted.items() if k.startswith("test/")}  # _wanted: a test
    record = {f"refit/{k}": v for k, v in figures.items()}
    record["refit/checkpoint"] = refitted.get("best_checkpoint")
    record["refit/epochs"] = refitted.get("epochs")
    write_json({**first, **record}, root / "metrics.json")
    said = str(first.get("monitor", "")).replace("val/", "test/", 1)  # the monitor's
    shown = "  ".join(
        f"{k} {v:.4f} (the run's {first[k]:.4f})"
        for k, v in figures.items()
        if isinstance(v, float) and isinstance(first.get(k), float) and k in (said, "test/loss")
    )
    log.info("refit: %s; its weights: %s", shown, record["refit/checkpoint"])
    if cfg.report:  # the run's report again, with the refit's figures
        report_safely(lambda: write_run_report(root))


def refit_config(cfg: DictConfig, first: dict) -> DictConfig:
    """The refit's config: the run's, named ``<run>/refit``, its val rows trained on, for the
    epochs the run trained, validated once at the end, with no early stopping."""
    job = copy.deepcopy(cfg)  # typed as composed (the schema's trainer)
    with open_dict(job):
        job.run_name = f"{cfg.run_name}/{REFIT_FOLDER}"
        job.resume = "auto" if cfg.resume else None  # a refit a kill stopped goes on
        trainer = job.trainer
        trainer.refit, trainer.train_on_val = False, True
        stopped = first.get("stopped_by") or first.get("stopped_early_at_epoch") is not None
        if stopped and type(first.get("epochs")) is int and first["epochs"] >= 1:
            trainer.max_epochs = first["epochs"]  # else as the run's: a count, or auto's steps
        trainer.val_every_n_epochs = ONCE
        trainer.early_stopping.patience = None
    return job


def _wanted(cfg: DictConfig, first: dict) -> bool:
    """Whether this run refits: asked (true), or auto on a CSV table of under ``AUTO_ROWS``
    rows; never for a fold, a run that trained on val already, a debug mode, one not completed
    or one without a test split apart from val (its test would be on rows it trained on)."""
    trainer, asked = cfg.trainer, cfg.trainer.refit
    if asked is False or trainer.train_on_val or (cfg.data.get("split") or {}).get("folds"):
        return False
    debugging = trainer.overfit_batches or trainer.limit_train_batches or trainer.profile_steps
    if debugging or not trainer.write_outputs or trainer.shapes_only:  # conf/debug/: no refit
        return False
    samples = first.get("samples")
    counts = isinstance(samples, dict) and all(
        type(samples.get(split)) is int for split in ("train", "val")
    )
    if first.get("status") != "completed" or not counts:  # edited or from before the key
        return False
    if first.get("test_split") != "test":
        if asked is True:
            raise UserError(
                "trainer.refit=true: this data has no test split apart from val, so the "
                "refit's test would be on rows it trained on; give data.split.test (or "
                "data.split.test_path), or leave trainer.refit out"
            )
        return False
    if asked is True:
        return True
    small = samples["train"] + samples["val"] < AUTO_ROWS
    return small and "refits" in capabilities_of(builder_of(cfg.data))  # declared with it
