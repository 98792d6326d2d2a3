"""A sweep's ``report.html``, in the sweep's folder: its jobs as ``summary.json`` lists them,
and for a search (hydra/sweeper=torchloom_optuna) its trials in the order they ran with the
best so far, the parameters of each trial against its objective, the parameters' importances
where Optuna can compute them, and the pruned trials marked. The study is read by the search's
own module (utils/run/search.py) and handed here as plain rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from utils import plots
from utils.report.page import Page
from utils.report.run import REPORT, read_json

COLUMNS = ("job", "status", "state", "epochs", "best_metric", "monitor", "overrides")


def write_sweep_report(sweep_dir: Path, study: Mapping[str, Any] | None = None) -> Path:
    """``study``: the search's trials (``trials``: number, state, value, values, pareto,
    params, choices, log), ``direction(s)``, ``objective(s)`` and ``importances`` (or the
    reason there are none)."""
    page = Page(f"torchloom sweep {sweep_dir.name}")
    if study is not None:
        search(page, study)
    jobs(page, read_json(sweep_dir / "summary.json"))
    page.write(sweep_dir / REPORT)
    return sweep_dir / REPORT


def search(page: Page, study: Mapping[str, Any]) -> None:
    trials, objective = study["trials"], str(study["objective"])
    objectives, directions = study.get("objectives") or [objective], study.get("directions")
    aims = zip(directions or [study["direction"]], objectives, strict=False)
    said = ", ".join(f"{way} {name}" for way, name in aims)
    page.heading(f"the search: {len(trials)} trials, to {said}")
    states: dict[str, int] = {}
    for trial in trials:
        states[trial["state"]] = states.get(trial["state"], 0) + 1
    page.text(", ".join(f"{count} {state.lower()}" for state, count in sorted(states.items())))
    if not trials:
        return
    if len(objectives) > 1:  # several objectives: the front, not a best
        page.picture(plots.pareto(trials, objectives, directions), "the Pareto front")
        rows = [
            [t["number"], t["state"].lower(), *_padded(t["values"], len(objectives)), t["pareto"]]
            for t in trials
        ]
        page.table(["trial", "state", *objectives, "on the front"], rows)
        return
    page.picture(plots.trials(trials, str(study["direction"]), objective), "each trial's objective")
    names = sorted({name for trial in trials for name in trial["params"]})
    if names:
        page.picture(plots.parallel(trials, names, objective), "parameters against the objective")
    importances = study.get("importances")
    if isinstance(importances, Mapping) and importances:
        page.picture(plots.bars(importances, "parameter importances", "importance"), "importances")
    elif importances:
        page.text(f"parameter importances: {importances}")
    rows = [[t["number"], t["state"].lower(), t["value"], _params(t["params"])] for t in trials]
    page.table(["trial", "state", objective, "parameters"], rows)


def _padded(values: Sequence[Any], count: int) -> list[Any]:
    return [*values, *[""] * (count - len(values))][:count]


def _params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{name}={value}" for name, value in sorted(params.items()))


def jobs(page: Page, summary: dict | None) -> None:
    page.heading("jobs")
    listed = summary.get("jobs") if summary else None
    if not isinstance(listed, Sequence) or not listed:
        page.text("no summary.json in this folder yet: the sweep has not finished", "note")
        return
    rows = []
    for job in listed:
        if isinstance(job, Mapping):
            cells = [job.get(column, "") for column in COLUMNS]
            rows.append([" ".join(map(str, c)) if isinstance(c, list) else c for c in cells])
    page.table(COLUMNS, rows)
