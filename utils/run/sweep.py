"""Multirun sweeps that survive failed jobs and end with an answer.

    python train.py -m optim=sgd,adamw optim.lr=0.01,0.001      # 4 jobs, then a summary table
    python train.py -m seed=0,1,2 model=mlp,cnn                 # mean ± std over seeds
    python train.py -m run_name=grid1 optim.lr=0.1,0.01         # re-run: finished jobs skipped

Each job lives in ``runs/<run_name>/<job>/`` with checkpoints in ``checkpoints/<run_name>/<job>/``.
A job that fails records its error in its ``metrics.json`` and returns the worst value for the
monitored direction, so the sweep (and any Hydra sweeper optimising the return value) goes on.
When the sweep ends, :class:`SweepSummary` prints one table of every job, writes it as
``summary.csv`` and ``summary.json`` in the sweep dir, and exits 1 if any job failed.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from utils.config.monitor import Monitor, monitor_mode
from utils.config.resolvers import RUN_TIMESTAMP_ENV, in_sweep
from utils.errors import UserError, print_error
from utils.files import write_json
from utils.report.sweep import write_sweep_report
from utils.run.study import STORAGE_ENV, shares_its_folder, storage_url, study_rows
from utils.run.trial import PruneTrial
from utils.tasks import main_metrics
from utils.text import console as text_console

log = logging.getLogger("torchloom")
EXIT_JOBS_FAILED = 1  # the sweep finished, but at least one of its jobs failed


def shown_metrics() -> tuple[str, ...]:
    """Metrics the summary shows besides the monitored one, when the jobs measured them: each
    task's main test metric (utils/tasks.py), R², the losses, then the same on val."""

    return (
        *main_metrics("test"),
        "test/r2",
        "test/loss",
        *main_metrics("val"),
        "val/loss",
        "train/loss",
    )


def job_overrides() -> list[str]:
    """This job's command-line overrides, minus ``resume=`` (re-running a sweep adds it)."""
    return [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]


def job_monitor_mode(cfg: DictConfig) -> str:
    """``min`` or ``max`` for the job's monitor; ``max`` when the config cannot say (a failed
    job's worst value must still be written)."""
    try:
        return monitor_mode(cfg.trainer.monitor, cfg.trainer.monitor_mode)
    except Exception:
        return "max"


def worst_value(monitor_mode: str) -> float:
    """What a failed job returns: the worst possible value for the monitored direction."""
    return Monitor("", monitor_mode).worst


def finished_value(run_dir: Path, overrides: list[str]) -> float | None:
    """The monitored value of this job when an earlier run of the same sweep finished it, so
    re-running a sweep skips it; None when it still has to run. A job folder holding a job
    with other overrides is refused: it belongs to another sweep."""
    metrics_file = run_dir / "metrics.json"
    if not metrics_file.exists():
        return None
    metrics = json.loads(metrics_file.read_text())
    check_same_job(run_dir, metrics.get("overrides", []), overrides)
    if metrics.get("status") != "completed":
        return None
    return metrics["best_metric"]


class ForeignJob(UserError):
    """The job folder holds a job of another sweep: the whole sweep stops, nothing is
    overwritten."""


def job_start(run_dir: Path, resume: str | None, overrides: list[str]):
    """In a sweep: ``(value, resume)`` where value is the result of this job when an earlier
    run of the sweep finished it (skip it), else None, and resume is ``auto`` unless given, so
    an unfinished job continues from its ``last.pt``. Outside a sweep: ``(None, resume)``."""
    if not in_sweep():
        return None, resume
    previous = finished_value(run_dir, overrides)
    if previous is not None:
        log.info("%s: finished by an earlier run of this sweep; skipped", run_dir)
    return previous, resume or "auto"


def check_same_job(run_dir: Path, stored: list[str], overrides: list[str]) -> None:
    stored = [o for o in stored if not o.startswith("resume=")]
    if sorted(stored) != sorted(overrides):
        raise ForeignJob(
            f"{run_dir} holds another job ({' '.join(stored) or 'no overrides'}), not this one "
            f"({' '.join(overrides) or 'no overrides'}); give the sweep a new run_name=..."
        )


def record_failure(run_dir: Path, error: BaseException, monitor_mode: str) -> float:
    """Write the failed job's ``metrics.json`` (status and error) and return its worst value."""
    run_dir.mkdir(parents=True, exist_ok=True)
    message = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
    write_json(
        {"status": "failed", "error": message, "overrides": job_overrides()},
        run_dir / "metrics.json",
    )
    return worst_value(monitor_mode)


# --- The end of a sweep ----------------------------------------------------------------------


def collect_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job folder (``<sweep_dir>/<number>/``), from the job's ``metrics.json``; a job
    that left none (killed, or never started) shows as ``unfinished``."""
    rows = []
    folders = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    for folder in sorted(folders, key=lambda p: int(p.name)):
        metrics_file = folder / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
        if "overrides" not in metrics:
            overrides_file = folder / ".hydra" / "overrides.yaml"
            metrics["overrides"] = _read_overrides(overrides_file)
        rows.append({"job": int(folder.name), "status": "unfinished", **metrics})
        rows[-1]["state"] = trial_state(rows[-1])
    return rows


def trial_state(row: dict[str, Any]) -> str:
    """``complete``, ``pruned`` (a search's pruner stopped it at epoch ``epochs``:
    utils/run/trial.py), ``failed`` or ``unfinished`` (killed, or still running)."""
    stopped = row.get("stopped_by") or {}
    if row["status"] == "completed" and stopped.get("callback") == PruneTrial.NAME:
        return "pruned"
    return {"completed": "complete", "failed": "failed"}.get(row["status"], "unfinished")


def _read_overrides(path: Path) -> list[str]:
    if not path.exists():
        return []
    from omegaconf import OmegaConf

    return list(OmegaConf.load(path))


def sort_jobs(rows: list[dict[str, Any]], monitor: str, mode: str) -> list[dict[str, Any]]:
    """Completed jobs best first by the monitored metric, then the others in job order."""
    sign = -Monitor(monitor, mode).sign  # best first

    def key(row: dict[str, Any]) -> tuple:
        value = row.get(monitor)
        if row["status"] != "completed" or not isinstance(value, (int, float)):
            return (1, 0.0, row["job"])
        return (0, sign * value, row["job"])

    return sorted(rows, key=key)


# Overrides that repeat one experiment rather than change it: the summary groups the jobs that
# differ only in these (seeds, and the folds of a cross-validation, data/batching/folds.py).
REPEATS = ("seed=", "data.split.fold=")


def seed_groups(rows: list[dict[str, Any]], metrics: list[str]) -> list[dict[str, Any]]:
    """Jobs that differ only in ``seed=`` or ``data.split.fold=`` (:data:`REPEATS`), grouped:
    mean ± std (sample) of each metric over the completed ones, and their count."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        key = tuple(o for o in row["overrides"] if not o.startswith(REPEATS))
        groups[key].append(row)
    summaries = []
    for key, members in groups.items():
        done = [r for r in members if r["status"] == "completed"]
        summary: dict[str, Any] = {
            "overrides": list(key),
            "jobs": len(members),
            "completed": len(done),
        }
        for name in metrics:
            values = [r[name] for r in done if isinstance(r.get(name), (int, float))]
            if values:
                summary[name] = {
                    "mean": statistics.fmean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                }
        summaries.append(summary)
    return summaries


def write_summary(
    sweep_dir: Path,
    rows: list[dict[str, Any]],
    columns: list[str],
    groups: list[dict[str, Any]] | None,
) -> None:
    with open(sweep_dir / "summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row, column) for column in columns])
    write_json({"jobs": rows, "seed_groups": groups}, sweep_dir / "summary.json")


def _cell(row: dict[str, Any], column: str) -> Any:
    value = row.get(column, "")
    return " ".join(value) if isinstance(value, list) else value


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    if isinstance(value, str) and value.endswith(".pt"):
        return os.path.relpath(value)
    return "" if value is None else str(value)


def summary_table(rows: list[dict[str, Any]], columns: list[str], title: str) -> Table:
    """The jobs, with only the overrides that differ between them (the shared ones are in the
    title)."""
    shared = set.intersection(*(set(row["overrides"]) for row in rows)) if rows else set()
    if shared:
        title += f" (all: {' '.join(o for o in rows[0]['overrides'] if o in shared)})"
    table = Table(title=escape(title))  # escaped: data.target=[a,b] is text, not a style tag
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        shown = {**row, "overrides": [o for o in row["overrides"] if o not in shared]}
        style = None if row["status"] == "completed" else "red"
        table.add_row(*(escape(_shown(_cell(shown, c))) for c in columns), style=style)
    return table


def seed_table(groups: list[dict[str, Any]], metrics: list[str], over: str) -> Table:
    table = Table(title=f"over {over}: mean ± std")
    for column in ["overrides", "completed", *metrics]:
        table.add_column(column, overflow="fold")
    for group in groups:
        cells = [
            f"{group[m]['mean']:.4f} ± {group[m]['std']:.4f}" if m in group else "" for m in metrics
        ]
        overrides = escape(" ".join(group["overrides"]))
        table.add_row(overrides, f"{group['completed']}/{group['jobs']}", *cells)
    return table


def summarize(
    sweep_dir: Path,
    monitor: str,
    mode: str,
    console: Console,
    objectives: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Print and write the summary of the jobs under ``sweep_dir``; returns the rows, best
    first. ``objectives`` (a search of several: each metric's direction): the rows gain
    ``pareto``, whether no other complete job is at least as good on every one and better on
    one."""
    rows = sort_jobs(collect_jobs(sweep_dir), monitor, mode)
    present = {key for row in rows for key in row}
    shown = [m for m in shown_metrics() if m in present]
    metrics = list(dict.fromkeys([monitor, *(objectives or ()), *shown]))
    columns = ["job", "overrides", *metrics, "status", "state", "epochs", "wall_time_seconds"]
    if objectives:
        front = pareto_front(rows, objectives)
        for row in rows:
            row["pareto"] = row["job"] in front
        columns.append("pareto")
    columns.append("best_checkpoint")
    if any(row.get("stopped_early_at_epoch") for row in rows):  # trainer.early_stopping
        columns.append("stopped_early_at_epoch")
    if any(row.get("error") for row in rows):
        columns.append("error")
    varied = [
        word
        for word, prefix in zip(("seeds", "folds"), REPEATS, strict=True)
        if any(o.startswith(prefix) for row in rows for o in row["overrides"])
    ]
    groups = seed_groups(rows, metrics) if varied else None
    write_summary(sweep_dir, rows, columns, groups)
    console.print(summary_table(rows, columns, f"sweep {sweep_dir}: {len(rows)} jobs"))
    if groups:
        console.print(seed_table(groups, metrics, " and ".join(varied)))
    trained = sum(row.get("epochs") or 0 for row in rows)
    pruned = sum(row["state"] == "pruned" for row in rows)
    console.print(f"{trained} epochs trained in all; {pruned} of {len(rows)} jobs pruned")
    console.print(f"summary: {sweep_dir / 'summary.csv'}, {sweep_dir / 'summary.json'}")
    return rows


def pareto_front(rows: list[dict[str, Any]], objectives: dict[str, str]) -> set[int]:
    """The jobs no other complete job dominates on ``objectives`` (metric: maximize or
    minimize); a job without a number for each is on no front."""
    signs = {name: 1.0 if way == "maximize" else -1.0 for name, way in objectives.items()}
    points = {
        row["job"]: [signs[name] * row[name] for name in signs]
        for row in rows
        if row["state"] == "complete"
        and all(
            isinstance(row.get(name), int | float) and math.isfinite(row[name]) for name in signs
        )
    }

    def dominated(point: list[float]) -> bool:
        return any(
            all(o >= p for o, p in zip(other, point, strict=True)) and other != point
            for other in points.values()
        )

    return {job for job, point in points.items() if not dominated(point)}


class SweepSummary(Callback):
    """Pins the sweep's run name for every job, then summarises the sweep when it ends."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Jobs of the joblib and submitit launchers compose their config in other processes,
        # some of them much later; they all inherit this time through the environment, so
        # the whole sweep lands under one runs/<run_name>/.
        os.environ.setdefault(RUN_TIMESTAMP_ENV, datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        trainer = config.trainer
        # A log file or pipe gets the whole table rather than 80 folded columns.
        console = text_console()
        sweeper = config.hydra.sweeper
        several = sweeper.get("directions") if "directions" in sweeper else None
        objectives = dict(zip(sweeper.objectives, several, strict=True)) if several else None
        mode = job_monitor_mode(config)
        rows = summarize(sweep_dir, trainer.monitor, mode, console, objectives)
        if config.report:  # report.html: the jobs, a search's trials
            sweep_report(sweep_dir, config.hydra.sweeper, trainer.monitor)
        failed = [row for row in rows if row["status"] != "completed"]
        if shares_its_folder(config):  # a study's other workers may still be running trials
            running = [row for row in failed if row["status"] == "unfinished"]
            if running:
                log.info("trials still running in another worker of the study: %d", len(running))
            failed = [row for row in failed if row["status"] != "unfinished"]
        if failed:
            print_error(
                f"{len(failed)} of {len(rows)} jobs did not complete (jobs "
                f"{', '.join(str(r['job']) for r in failed)}); see {sweep_dir}/summary.csv"
            )
            sys.exit(EXIT_JOBS_FAILED)


SEARCH_SWEEPER = "torchloom_sweeper.OptunaSweeper"  # hydra/sweeper=torchloom_optuna's target


def sweep_report(sweep_dir: Path, sweeper: Any, objective: str) -> None:
    """The sweep's ``report.html`` (utils/report/sweep.py), with its study's trials when it is
    a search; a drawing that fails is one warning, never the sweep's failure."""
    study = None
    try:
        if str(sweeper.get("_target_", "")).endswith(SEARCH_SWEEPER):
            url = os.environ.get(STORAGE_ENV) or storage_url(sweeper.get("storage"), sweep_dir)
            study = study_rows(url, str(sweeper.get("study_name") or "torchloom"), objective)
        log.info("report: %s", write_sweep_report(sweep_dir, study))
    except Exception as error:
        log.warning("warning: the sweep's report.html not written: %s", error)


def parallel_jobs() -> int:
    """How many jobs of this sweep run at once on this machine: joblib's ``n_jobs`` (negative
    counts back from the cores, as joblib does), else 1."""
    launcher = HydraConfig.get().launcher
    if "Joblib" not in str(launcher.get("_target_", "")) or not in_sweep():
        return 1
    n_jobs = launcher.get("n_jobs") or 1
    return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)
