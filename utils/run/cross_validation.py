"""``cv=K``: every fold of a K-fold cross-validation (data/batching/folds.py) in one job.

    python train.py cv=5                                        # the bundled digits, 5 folds
    python train.py cv=5 data=csv data.path=t.csv data.target=y
    python train.py cv=5 run_name=cv1 resume=auto               # after a kill: the rest
    python train.py -m cv=5 optim.lr=0.01,0.001                 # each job a whole CV

Fold ``k`` is a training run of its own with ``data.split.folds=K data.split.fold=k``, in
``runs/<run>/fold-<k>/`` and ``checkpoints/<run>/fold-<k>/``: the same seed, so the same initial
weights, and its own optimizer, schedule, EMA and early stopping, as any run. ``resume=auto``
skips the folds that finished and resumes the one a kill stopped from its ``last.pt``.

Each fold saves its best checkpoint's predictions on its val part (``fold-<k>/oof.pt``). When
every fold has finished, ``runs/<run>/oof.csv`` holds one row per sample of train ∪ val (its
fold, its name, its target and the prediction), and ``runs/<run>/metrics.json`` the folds'
mean and standard deviation of each metric, the out-of-fold metrics (``oof/...``: the pooled
predictions, scored once) and each fold's monitored value. The job returns the mean monitored
value, so a sweeper (Optuna) optimises the whole cross-validation.
"""

from __future__ import annotations

import copy
import csv
import io
import logging
import statistics
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict
from rich.table import Table

from data.batching.dataset import capabilities_of
from utils.checkpoint.load import load_checkpoint
from utils.checkpoint.record import InputRecord
from utils.config.build import build, builder_of
from utils.config.schema import CONF
from utils.config.secrets import recorded
from utils.errors import UserError
from utils.evaluation.metrics import outputs_of
from utils.files import atomic_file, write_json
from utils.intact import check_intact
from utils.report.run import write_run_report
from utils.run.folders import check_part_name, fold_folder, output_dirs
from utils.run.outputs import read_metrics, report_safely
from utils.run.resume_changes import config_changes
from utils.run.start import check_new_run, remove_files
from utils.run.trial import PruneTrial, fold_reports
from utils.system.distributed import processes_from_env
from utils.text import cell, console

log = logging.getLogger("torchloom")
PREDICTIONS = "oof.pt"  # a fold's val predictions, in its run dir


def check_cv(cfg: DictConfig) -> int:
    """``cv=K``'s settings, before any data is read: K, data that can be folded, and a resume
    that continues the folds (``resume=auto``)."""
    folds = cfg.cv
    if not (isinstance(folds, int) and not isinstance(folds, bool) and folds >= 2):
        raise UserError(f"cv={folds} must be a whole number of folds, 2 or more (or null)")
    if "folds" not in capabilities_of(builder_of(cfg.data)):  # declared with the builder
        raise UserError(
            f"cv={folds} needs data whose val split is held out of its samples "
            f"({', '.join(f'data={name}' for name in folded_data())})"
        )
    if cfg.trainer.get("refit") is True:
        raise UserError(
            f"trainer.refit=true and cv={folds} do not combine: each fold's val part is what "
            "its out-of-fold predictions are made on; leave trainer.refit out"
        )
    given = (cfg.data.get("split") or {}).get("folds")
    if given is not None and given != folds:
        raise UserError(
            f"cv={folds} and data.split.folds={given} disagree; leave "
            "data.split.folds out (cv=K sets it for every fold)"
        )
    if cfg.resume not in (None, "auto"):
        raise UserError(
            f"cv={folds} continues with resume=auto (each fold from its own "
            f"last.pt), not resume={cfg.resume}"
        )
    if cfg.tune or cfg.trainer.get("shapes_only") or not cfg.trainer.get("write_outputs", True):
        raise UserError(
            f"cv={folds} trains and saves every fold; it does not combine with "
            "tune= or the debug modes that write nothing"
        )
    return folds


def fold_config(cfg: DictConfig, folds: int, fold: int) -> DictConfig:
    """The config of fold ``fold``: one run of ``data.split.folds=folds``, named
    ``<run>/fold-<k>`` (its MLflow experiment is the CV's run name)."""
    job = copy.deepcopy(cfg)  # typed as composed (the schema's trainer)
    with open_dict(job):
        job.cv = None
        job.run_name = f"{cfg.run_name}/{fold_folder(fold)}"
        job.data.split = {**(job.data.get("split") or {}), "folds": folds, "fold": fold}
    return job


def cross_validate(cfg: DictConfig, stop: Any, train: Callable[..., float]) -> float:
    """Train every fold (``train(config, stop, run_dir)``: train.py's recipe), skipping those
    a resumed CV finished; then pool their predictions. Returns the folds' mean monitored
    value."""
    folds = check_cv(cfg)
    root = Path(HydraConfig.get().runtime.output_dir)
    check_part_name(cfg.run_name)
    replaced = []  # an earlier run of the name (overwrite=true): all but the folds that follow
    begun = any((root / fold_folder(fold)).is_dir() for fold in range(folds))
    if cfg.resume is None or not begun:  # resume=auto with no fold begun: a new cv, too
        auto = cfg.resume == "auto"
        replaced = check_new_run(*output_dirs(cfg, root), cfg.overwrite, folds=folds, auto=auto)
    values: list[float] = []
    study = fold_reports(cfg.trainer.monitor, folds)  # a search's trial: a report a fold
    for fold in range(folds):
        fold_dir = root / fold_folder(fold)
        job = fold_config(cfg, folds, fold)
        finished = finished_fold(fold_dir) if cfg.resume == "auto" else None
        if finished is not None:
            check_same_split(job, fold_dir)
            log.info("cv: fold %d of %d finished earlier (%s); kept", fold + 1, folds, fold_dir)
            values.append(finished["best_metric"])
        else:
            log.info("cv: fold %d of %d -> %s", fold + 1, folds, fold_dir)
            values.append(train(job, stop, fold_dir))
            if replaced and processes_from_env().is_main:  # once a fold of this run stands
                remove_files(replaced)
                replaced = []
        pruned = study.fold_end(fold, values[-1]) if study else None
        if pruned:
            log.info("cv: %s; the folds after it are not trained", pruned)
            if processes_from_env().is_main:
                write_pruned(root, folds, cfg, pruned)
            return statistics.fmean(values)
    if processes_from_env().is_main:
        summary = pool_folds(root, folds, cfg)
        console().print(summary_table(summary))
        log.info(
            "cv: out-of-fold predictions in %s; metrics in %s",
            root / "oof.csv",
            root / "metrics.json",
        )
        if cfg.report:  # the folds' mean ± std, and where their reports are
            report_safely(lambda: write_run_report(root))
    return statistics.fmean(values)


def write_pruned(root: Path, folds: int, cfg: DictConfig, reason: str) -> None:
    """``metrics.json`` of a cross-validation its search's pruner ended after fold ``k``:
    ``stopped_by`` the pruner at that fold, the folds' values so far and their mean (what
    the job returns), and the epochs they trained; no out-of-fold predictions (not every
    sample has one)."""
    fold_metrics = [read_metrics(root / fold_folder(k)) or {} for k in range(folds)]
    done = [m for m in fold_metrics if isinstance(m.get("best_metric"), int | float)]
    monitor = done[0].get("monitor", cfg.trainer.monitor)
    values = [m["best_metric"] for m in done]
    mean = statistics.fmean(values)
    record = {
        "status": "completed",
        "stopped_by": {"callback": PruneTrial.NAME, "reason": reason, "fold": len(done) - 1},
        "cv": {"folds": folds, "monitor": monitor, "values": values, "mean": mean},
        "monitor": monitor,
        "best_metric": mean,
        monitor: mean,
        "epochs": sum(m.get("epochs") or 0 for m in done),
        "overrides": list(HydraConfig.get().overrides.task),
    }
    write_json(record, root / "metrics.json")


def finished_fold(fold_dir: Path) -> dict | None:
    """A fold's ``metrics.json`` when it finished (it then holds its predictions too)."""
    metrics = read_metrics(fold_dir) if (fold_dir / PREDICTIONS).is_file() else None
    ok = metrics is not None and metrics.get("status") == "completed"
    return metrics if ok and isinstance(metrics.get("best_metric"), int | float) else None


def check_same_split(job: DictConfig, fold_dir: Path) -> None:
    """A finished fold is kept only when it was made by this fold's config: the same K, seed,
    stratify, group, data and model (a fold of a 3-fold split is not fold k of a 5-fold one)."""
    best = output_dirs(job, fold_dir)[1] / "best.pt"
    stored = load_checkpoint(best).get("config")
    if not isinstance(stored, dict):
        raise UserError(f"{best} holds no config (was it edited?); choose a new run_name=...")
    changes = config_changes(stored, recorded(job))
    differ = changes.never + changes.need_allow
    if differ:
        raise UserError(
            f"cv={job.data.split.folds} resume=auto: {fold_dir.name} was made by "
            f"another split or run ({'; '.join(differ)}), so its predictions cannot "
            "join this one's; choose a new run_name=... for this cross-validation"
        )


# --- A fold's predictions --------------------------------------------------------------------


def save_fold_predictions(
    out: Any, model: Any, batches: Any, precision: Any, task: Any, data: Any
) -> None:
    """The ``model``'s (best.pt's) predictions on the fold's val part (``batches``), with each
    sample's name (``data.fold_ids``), target and decoded row, as ``oof.pt`` in its run dir."""
    outputs, targets = outputs_of(model, batches.epoch(0), precision)
    ids = data.fold_ids
    if len(ids.names) != len(outputs):
        raise RuntimeError(f"{len(ids.names)} val names for {len(outputs)} predictions")
    header, rows, _ = task.decode(outputs, SimpleNamespace(topk=task.count, threshold=None))
    saved = {
        "fold": ids.fold,
        "names": ids.names,
        "targets": targets,
        "target_cells": task.target_cells(targets),
        "outputs": task.portable(outputs),
        "header": header,
        "rows": rows,
        "inputs": InputRecord.from_run(data, task).to_dict(),
    }
    if out.is_main:
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        with atomic_file(out.run_dir / PREDICTIONS) as f:
            f.write(buffer.getvalue())


def read_fold_predictions(path: Path) -> dict:
    """A fold's ``oof.pt`` (named tensors and strings only; checked)."""
    check_intact(path, "remove its fold's folder and resume=auto to train that fold again")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(
            f"cannot read {path} ({type(error).__name__}); remove its fold's "
            "folder and resume=auto to train that fold again"
        ) from None
    count = len(saved.get("names", [])) if isinstance(saved, dict) else -1
    ok = (
        count > 0
        and all(
            isinstance(saved.get(k), torch.Tensor) and len(saved[k]) == count
            for k in ("targets", "outputs")
        )
        and len(saved.get("rows", [])) == count == len(saved.get("target_cells", []))
        and isinstance(saved.get("header"), list)
        and isinstance(saved.get("inputs"), dict)
    )
    if not ok:
        raise UserError(
            f"{path} is not a fold's predictions as torchloom writes them; remove "
            "its fold's folder and resume=auto to train that fold again"
        )
    return saved


# --- The folds pooled ------------------------------------------------------------------------


def pool_folds(root: Path, folds: int, cfg: DictConfig) -> dict:
    """``oof.csv`` and ``metrics.json`` of the whole cross-validation under ``root``."""
    saved = [read_fold_predictions(root / fold_folder(k) / PREDICTIONS) for k in range(folds)]
    fold_metrics = [finished_fold(root / fold_folder(k)) or {} for k in range(folds)]
    write_oof_csv(root / "oof.csv", saved)
    record = InputRecord.read(saved[0]["inputs"], root / "fold-0" / PREDICTIONS)
    task = build(cfg.task).fitted(record, torch.device("cpu"), record)
    scores = task.pooled_scores()
    scores.add(torch.cat([s["outputs"] for s in saved]), torch.cat([s["targets"] for s in saved]))
    pooled = {
        f"oof/{name}": value
        for name, value in scores.result(torch.device("cpu")).items()
        if isinstance(value, float)
    }
    monitor = fold_metrics[0].get("monitor", cfg.trainer.monitor)
    values = [m.get("best_metric", float("nan")) for m in fold_metrics]
    summary: dict[str, Any] = {
        "status": "completed",
        "cv": {
            "folds": folds,
            "monitor": monitor,
            "values": values,
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values),
            "checkpoints": [m.get("best_checkpoint") for m in fold_metrics],
        },
        "epochs": sum(m.get("epochs") or 0 for m in fold_metrics),  # all folds together
    }
    names = [
        k
        for k, v in fold_metrics[0].items()
        if isinstance(v, float) and k.split("/")[0] in ("train", "val", "test")
    ]
    for name in names:
        numbers = [m[name] for m in fold_metrics if isinstance(m.get(name), int | float)]
        if len(numbers) == folds:
            summary[name], summary[f"{name}_std"] = (
                statistics.fmean(numbers),
                statistics.stdev(numbers),
            )
    summary.update(pooled)
    # One definition: every fold's val/ figures are its best.pt's, so the monitored metric's
    # mean and std are those of the values the table shows.
    summary.update(
        {
            "monitor": monitor,
            "best_metric": summary["cv"]["mean"],
            monitor: summary["cv"]["mean"],
            f"{monitor}_std": summary["cv"]["std"],
            "overrides": list(HydraConfig.get().overrides.task),
        }
    )
    write_json(summary, root / "metrics.json")
    return summary


def write_oof_csv(path: Path, saved: list[dict]) -> None:
    """One row per sample of train ∪ val: its fold, name and target, then its prediction."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["fold", "sample", "target", *saved[0]["header"]])
    for fold in saved:
        for name, target, row in zip(
            fold["names"], fold["target_cells"], fold["rows"], strict=True
        ):
            writer.writerow([fold["fold"], cell(name), target, *row])
    with atomic_file(path) as f:
        f.write(text.getvalue().encode())


def summary_table(summary: dict) -> Table:
    """Each fold's monitored value, their mean ± std, and the out-of-fold metrics."""
    cv = summary["cv"]
    table = Table(title=f"cross-validation: {cv['folds']} folds")
    table.add_column("")
    table.add_column(cv["monitor"], justify="right")
    for fold, value in enumerate(cv["values"]):
        table.add_row(f"fold {fold}", f"{value:.4f}")
    table.add_row("mean ± std", f"{cv['mean']:.4f} ± {cv['std']:.4f}")
    for name, value in summary.items():
        if name.startswith(("oof/", "test/")) and not name.endswith("_std"):
            spread = summary.get(f"{name}_std")
            shown = f"{value:.4f}" + ("" if spread is None else f" ± {spread:.4f}")
            table.add_row(name, shown)
    return table


def folded_data() -> list[str]:
    """The conf/data options whose builder declares it can be folded (those whose module
    imports: an extra not installed leaves its option out)."""
    import yaml

    names = []
    for path in sorted((CONF / "data").glob("*.yaml")):
        target = (yaml.safe_load(path.read_text()) or {}).get("_target_")
        try:
            folds = "folds" in capabilities_of(builder_of({"_target_": target}))
        except ImportError:
            folds = False
        names += [path.stem] if folds else []
    return names
