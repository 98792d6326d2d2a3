"""A run's ``report.html``: who ran it and on what, its final figures beside the simple
baselines', its learning curves with the best checkpoint marked, and what its test split says
(confusion, per-class scores, reliability, ROC and PR curves, predicted against actual, the
worst-predicted samples). Drawn from the run folder alone — ``metrics.json``,
``provenance.json``, the history (utils/report/history.py) and ``test_predictions.npz``
(utils/report/evidence.py) — so ``report.py`` draws it again for any finished run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from utils import plots
from utils.errors import UserError
from utils.evaluation.metrics import calibration, per_class_scores
from utils.files import read_json_object
from utils.report.evidence import read_evidence
from utils.report.history import finite, read_history, repeated_steps
from utils.report.page import Page

REPORT = "report.html"
MOST_TARGETS = 4  # a regression's targets drawn (each a pair of plots)


def read_json(path: Path) -> dict | None:
    """A JSON object the run wrote (utils/files.py ``read_json_object``); None when missing."""
    return read_json_object(path) if path.is_file() else None


def write_run_report(run_dir: Path) -> Path:
    """Draw and write ``run_dir/report.html`` for a finished training run (its
    ``metrics.json`` written); returns its path."""
    metrics = read_json(run_dir / "metrics.json")
    if metrics is None:
        raise UserError(
            f"{run_dir} holds no metrics.json: not a finished run's folder (a run writes it "
            "when it ends; pass runs/<run_name>)"
        )
    page = Page(f"torchloom run {run_dir.name}")
    identity(page, metrics, read_json(run_dir / "provenance.json"))
    final_figures(page, metrics)
    curves(page, run_dir, metrics)
    evidence = read_evidence(run_dir)
    if evidence is not None:
        test_split(page, evidence, str(metrics.get("test_split", "test")))
    page.write(run_dir / REPORT)
    return run_dir / REPORT


def identity(page: Page, metrics: dict, provenance: dict | None) -> None:
    page.heading("the run")
    rows = [("status", metrics.get("status")), ("monitor", metrics.get("monitor"))]
    rows += [(key, metrics.get(key)) for key in ("best_metric", "best_epoch", "epochs")]
    rows.append(("wall time (s)", metrics.get("wall_time_seconds")))
    if provenance:
        command, code = _mapping(provenance.get("command")), _mapping(provenance.get("code"))
        rows.append(("command", " ".join(map(str, command.get("argv") or []))))
        rows.append(("commit", f"{code.get('commit')}{' (dirty)' if code.get('dirty') else ''}"))
        for name, source in _mapping(_mapping(provenance.get("data")).get("sources")).items():
            if isinstance(source, dict):
                rows.append((f"data {name}", source.get("content_sha256") or source))
    overrides = metrics.get("overrides")
    listed = overrides if isinstance(overrides, list) else [overrides or "none"]
    rows.append(("overrides", " ".join(map(str, listed)) or "none"))
    page.table(["", ""], rows)


def _mapping(value: Any) -> dict:
    """A part of a file read as data that should be an object: itself, or {} if not."""
    return value if isinstance(value, dict) else {}


SPLITS = ("train/", "val/", "test/", "refit/test/")  # refit/: trainer.refit's run's figures


def final_figures(page: Page, metrics: dict) -> None:
    """The run's figures as metrics.json holds them, then the baselines' beside them."""
    page.heading("final figures")
    own = {
        key: value
        for key, value in metrics.items()
        if key.startswith(SPLITS) and isinstance(value, float | int)
    }
    page.figures(own)
    unsure = [
        key for key, value in own.items() if isinstance(value, float) and not math.isfinite(value)
    ]
    if unsure:
        page.text(
            f"not finite: {', '.join(unsure)} (the loss diverged, or a split was empty)", "note"
        )
    baselines(page, metrics)


def baselines(page: Page, metrics: dict) -> None:
    """The run beside each baseline on the split it tested on, then every baseline figure."""
    found = {
        k: v for k, v in metrics.items() if k.startswith("baseline/") and isinstance(v, float | int)
    }
    said = metrics.get("baselines")
    if not found:
        if isinstance(said, str):
            page.text(f"baselines: {said}")
        return
    page.heading("next to the simple baselines (scikit-learn, same train split, same rows)")
    split = f"{metrics.get('test_split', 'test')}/"
    names = list(dict.fromkeys(k.split("/")[1] for k in found))
    measured = [
        k
        for k in metrics
        if k.startswith(split) and any(f"baseline/{n}/{k}" in found for n in names)
    ]
    rows = [["this run", *(metrics[k] for k in measured), metrics.get("wall_time_seconds", "")]]
    for name in names:
        cells = [found.get(f"baseline/{name}/{k}", "") for k in measured]
        rows.append([name, *cells, found.get(f"baseline/{name}/fit_seconds", "")])
    page.table(["model", *measured, "seconds"], rows, "the run's time is its whole training")
    for line in beaten(metrics, found):
        page.text(line, "win")
    page.figures(found)
    if isinstance(said, str):
        page.text(said)


LOWER_IS_BETTER = ("loss", "mae", "rmse", "nll", "brier", "ece")


def beaten(metrics: dict, found: dict) -> list[str]:
    """Plain sentences where a baseline's figure on the split the run tested on beats the
    run's own."""
    tested = f"{metrics.get('test_split', 'test')}/"
    lines = []
    for key, value in found.items():
        name, _, split_metric = key.removeprefix("baseline/").partition("/")
        own = metrics.get(split_metric)
        if not split_metric.startswith(tested) or not isinstance(own, float):
            continue
        lower = split_metric.rsplit("/", 1)[-1] in LOWER_IS_BETTER
        if math.isfinite(value) and (value < own if lower else value > own):
            lines.append(
                f"the {name} baseline beats this run on {split_metric}: "
                f"{value:.4f} against {own:.4f}"
            )
    return lines


def curves(page: Page, run_dir: Path, metrics: dict) -> None:
    page.heading("learning curves")
    points, source = read_history(run_dir)
    folds = sorted(p.parent.name for p in run_dir.glob("fold-*/report.html"))
    if not points and folds:  # cv=K: each fold's curves are in its own report
        page.text(
            f"each fold's curves in its own report: {', '.join(f + '/report.html' for f in folds)}"
        )
        return
    if not points:
        page.text(
            "no history in this folder (logger= wrote none here: MLflow or W&B hold it)", "note"
        )
        return
    monitor = str(metrics.get("monitor") or "val/loss")
    panels = {
        "loss": {tag: finite(points[tag]) for tag in ("train/loss", "val/loss") if tag in points},
        monitor: {monitor: finite(points.get(monitor, []))},
        "learning rate": {"train/lr": finite(points.get("train/lr", []))},
        "data wait (share of each step)": {
            "train/data_wait_fraction": finite(points.get("train/data_wait_fraction", []))
        },
    }
    if monitor in panels["loss"]:  # the monitor is a loss: drawn once
        del panels[monitor]
    panels = {title: series for title, series in panels.items() if any(series.values())}
    best = best_step(points.get(monitor, []), metrics)
    tokens = tokens_per_step(metrics)
    if tokens:  # a language model's curves against the tokens it has trained on
        panels = {
            t: {k: [(s * tokens, v) for s, v in p] for k, p in d.items()} for t, d in panels.items()
        }
        best = None if best is None else best * tokens
    axis = f"tokens ({tokens:,} an optimizer step)" if tokens else "optimizer step"
    picture = plots.curves(panels, best, axis)
    page.picture(picture, f"from the {source}, against {axis}; dotted: best checkpoint")
    for tag, steps in repeated_steps(points).items():
        page.text(f"{tag}: steps repeated or out of order in the history: {steps[:5]}", "note")
    for tag, series in points.items():
        dropped = len(series) - len(finite(series))
        if dropped:
            page.text(f"{tag}: {dropped} non-finite values left out of the curves", "note")


def tokens_per_step(metrics: dict) -> int | None:
    """A language model's tokens an optimizer step (its samples a step times its tokens a
    sample); None for a run that counts no tokens."""
    tokens, samples = (
        metrics.get("train/tokens_per_second"),
        metrics.get("train/samples_per_second"),
    )
    per_step = metrics.get("samples_per_step")
    numbers = all(isinstance(v, float | int) and v > 0 for v in (tokens, samples, per_step))
    return round(per_step * tokens / samples) if numbers else None


def best_step(series: list[tuple[int, float]], metrics: dict) -> int | None:
    """The step best.pt was written at: its epoch's end (epochs of equal steps), else the
    first validation of the best value."""
    best, epoch = metrics.get("best_metric"), metrics.get("best_epoch")
    epochs, steps = metrics.get("epochs"), metrics.get("global_step")
    if all(isinstance(v, int) and v > 0 for v in (epoch, epochs, steps)) and steps % epochs == 0:
        at = epoch * steps // epochs
        if any(step == at for step, _ in series):
            return at
    for step, value in series:
        if isinstance(best, float) and math.isclose(value, best, rel_tol=1e-6, abs_tol=1e-12):
            return step
    return None


def test_split(page: Page, evidence: dict[str, np.ndarray], split: str) -> None:
    """Each picture whose arrays the task's evidence holds (utils/tasks ``evidence``)."""
    if "sampled" in evidence:  # a language model: what it writes
        page.heading("what it writes (300 tokens after a new line, temperature 0.8, top 200)")
        page.preformatted("\n\n".join(str(text) for text in evidence["sampled"]))
        return
    page.heading(f"the {split} split: where it is right and wrong")
    names = [str(n) for n in evidence["names"]]
    if "predicted" in evidence:
        classes(page, evidence, names)
    if "scores" in evidence:
        width = evidence["scores"].reshape(len(evidence["loss"]), -1).shape[1]
        labels = names[-width:] if len(names) >= width else [str(i) for i in range(width)]
        picture = plots.ranking(evidence["scores"], evidence["truth"], labels)
        page.picture(picture, "ROC and precision-recall")
    if "estimate" in evidence:
        values(page, evidence, names)
    worst(page, evidence)


def classes(page: Page, evidence: dict[str, np.ndarray], names: list[str]) -> None:
    count = len(names)
    target, predicted = evidence["target"].astype(np.int64), evidence["predicted"].astype(np.int64)
    matrix = np.bincount(target * count + predicted, minlength=count * count).reshape(count, count)
    correct = torch.from_numpy((target == predicted).astype(np.float64))
    rows = calibration(torch.from_numpy(evidence["confidence"].astype(np.float64)), correct)
    class_pictures(page, matrix, names, rows["reliability"], f"reliability (ECE {rows['ece']:.4f})")


def class_pictures(
    page: Page, matrix: np.ndarray, names: list[str], reliability: list, said_reliability: str
) -> None:
    """A confusion ``matrix``'s pictures (counts and shares; precision and recall per class,
    from the matrix) and the ``reliability`` diagram: a run's and an evaluation's alike. Past
    :data:`utils.plots.MOST_CLASSES` classes, the most confused ones, said so."""
    count = len(matrix)
    shown, said = np.arange(count), ""
    if count > plots.MOST_CLASSES:
        shown = plots.most_confused(matrix)
        said = f" (the {len(shown)} most confused of {count} classes)"
    sub, labels = matrix[np.ix_(shown, shown)], [names[i] for i in shown]
    page.picture(
        plots.confusion(sub, labels), "confusion: counts, and each true class's shares" + said
    )
    scores = per_class_scores(torch.from_numpy(matrix))
    chosen = {key: [scores[key][i] for i in shown] for key in ("precision", "recall")}
    page.picture(plots.per_class(chosen, labels), "precision and recall per class" + said)
    if reliability:
        page.picture(plots.reliability(reliability), said_reliability)


def values(page: Page, evidence: dict[str, np.ndarray], names: list[str]) -> None:
    predicted = evidence["estimate"].reshape(len(evidence["loss"]), -1)
    target = evidence["actual"].reshape(len(evidence["loss"]), -1)
    for column in range(min(predicted.shape[1], MOST_TARGETS)):
        name = names[column] if column < len(names) else str(column)
        picture = plots.regression(predicted[:, column], target[:, column], name)
        page.picture(picture, f"{name}: predicted against actual, and the residuals")
    if predicted.shape[1] > MOST_TARGETS:
        page.text(f"the first {MOST_TARGETS} of {predicted.shape[1]} targets drawn")


def worst(page: Page, evidence: dict[str, np.ndarray]) -> None:
    if "worst" not in evidence or not len(evidence["worst"]):
        return
    captions = [str(c) for c in evidence["captions"]]
    title = f"the {len(captions)} worst-predicted samples, highest loss first (true → predicted)"
    if "pictures" in evidence:
        pictures = evidence["pictures"].astype(np.float64) / 255
        page.picture(plots.samples(pictures, captions), title)
    elif "texts" in evidence:
        page.table(
            ["sample", "as read"],
            list(zip(captions, (str(t) for t in evidence["texts"]), strict=False)),
            title,
        )
    else:
        page.table(["sample"], [[c] for c in captions], title)
