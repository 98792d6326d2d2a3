"""evaluate.py's pre-flight: which checkpoints ``ckpt=`` names, and every check that needs only
the config (split, export, average, calibrate, threshold, logger), before any checkpoint is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from utils.checkpoint.load import checkpoint_to_evaluate
from utils.errors import UserError
from utils.evaluation.export import EXPORTERS, SUFFIXES
from utils.fit.top_k import top_k_files
from utils.run.outputs import check_output
from utils.run.start import RunContext
from utils.tracking.tracker import require


@dataclass(frozen=True)
class EvaluatePlan:
    files: list[Path]  # the checkpoints ckpt= names
    fitting: tuple[bool, bool] | None  # (calibrate=temperature, threshold=auto); None: neither
    copies: list[Path] | None  # average=top_k: the run's top-k copies, evaluated as one model
    to_training_run: Any  # logger=mlflow: the node of the store the training run is in


def check_evaluate(cfg: DictConfig, context: RunContext) -> EvaluatePlan:
    """Every check of evaluate.py's config, in one line each, before any checkpoint is read;
    the checkpoints it names and what it asks beyond their metrics."""
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise UserError("ckpt is required: python evaluate.py ckpt=checkpoints/<run_name>/best.pt")
    if cfg.split not in ("auto", "train", "val", "test"):
        raise UserError(f"split={cfg.split!r} must be auto, train, val or test")
    to_training_run = training_run_logger(cfg.logger)  # logger=mlflow: add to the run
    files = checkpoint_files(cfg.ckpt)
    if cfg.export and len(files) != 1:
        raise UserError(f"export takes one checkpoint; ckpt names {len(files)}")
    if cfg.onnx_exporter not in EXPORTERS:
        raise UserError(f"onnx_exporter={cfg.onnx_exporter!r} must be dynamo or torchscript")
    if cfg.export:  # never over the checkpoint it is made from
        check_output(Path(cfg.export), "export", files, suffixes=(*SUFFIXES, ".safetensors"))
    fitting = calibration_asked(cfg, files, context)  # calibrate=temperature, threshold=auto
    copies = copies_to_average(cfg, files)  # average=top_k: a run's top-k copies, as one model
    return EvaluatePlan(files, fitting, copies, to_training_run)


def checkpoint_files(ckpt: Any) -> list[Path]:
    """Files named by ``ckpt``: files as given; a run's folder → its best.pt (else last.pt,
    else its newest checkpoint); a sweep's folder → that of each job folder inside it."""
    entries = list(ckpt) if isinstance(ckpt, (list, tuple)) or OmegaConf.is_list(ckpt) else [ckpt]
    files: list[Path] = []
    for entry in (Path(str(e)) for e in entries):
        if entry.is_file():
            files.append(entry)
            continue
        if not entry.is_dir():
            raise UserError(f"ckpt={entry}: no such checkpoint file or folder")
        found = checkpoint_to_evaluate(entry)
        jobs = (
            [found]
            if found
            else [checkpoint_to_evaluate(p) for p in sorted(entry.iterdir()) if p.is_dir()]
        )
        jobs = [job for job in jobs if job]
        if not jobs:
            raise UserError(f"ckpt={entry}: no checkpoint in that folder or the ones in it")
        files += jobs
    return files


def copies_to_average(cfg: DictConfig, files: list[Path]) -> list[Path] | None:
    """``average=top_k``: the top-k copies in the folder of the one checkpoint ``files`` names
    (a run's folder gives its best.pt); None without it."""
    if cfg.average not in (None, "top_k"):
        raise UserError(f"average={cfg.average} must be top_k (or null)")
    if cfg.average is None:
        return None
    if len(files) != 1 or cfg.logger or cfg.calibrate or cfg.threshold:
        raise UserError(
            "average=top_k takes one run's checkpoint folder (ckpt=checkpoints/<run>) "
            "and no calibrate=, threshold= or logger=; calibrate the averaged.pt it "
            "writes afterwards"
        )
    return top_k_files(files[0].parent)  # fewer than two: refused by the average itself


def calibration_asked(cfg: DictConfig, files: list[Path], context: RunContext) -> tuple | None:
    """(fit a temperature, fit thresholds) when ``calibrate=`` or ``threshold=`` asks, checked
    before anything is read; None when neither does."""
    if cfg.calibrate not in (None, "temperature"):
        raise UserError(f"calibrate={cfg.calibrate} must be temperature (or null)")
    if cfg.threshold not in (None, "auto"):
        raise UserError(
            f"threshold={cfg.threshold} must be auto (or null); predict.py "
            "threshold=<p> sets one for its rows"
        )
    if cfg.calibrate is None and cfg.threshold is None:
        return None
    asked = "calibrate=temperature" if cfg.calibrate else "threshold=auto"
    if len(files) != 1 or files[0].suffix == ".safetensors":
        raise UserError(
            f"{asked} stores what it fits in one .pt checkpoint's record; ckpt names "
            f"{'an export' if len(files) == 1 else f'{len(files)} checkpoints'} "
            "(calibrate the .pt, then export it)"
        )
    if context.processes.world_size > 1:
        raise UserError(f"{asked} runs in one process: drop torchrun")
    return cfg.calibrate is not None, cfg.threshold is not None


def training_run_logger(logger: Any) -> Any:
    """``logger=mlflow``: the node whose store receives each checkpoint's metrics; None
    without a logger. Other loggers track training runs only."""
    nodes = dict(logger or {})
    others = [name for name in nodes if name != "mlflow"]
    if others:
        raise UserError(
            f"logger={others[0]}: evaluate.py adds its metrics to the training "
            "run in MLflow only (logger=mlflow)"
        )
    if not nodes:
        return None
    require("mlflow", "mlflow", "logger=mlflow")
    return nodes["mlflow"]
