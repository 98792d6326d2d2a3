"""``evaluate.py``'s ``report.html``, beside its ``metrics.json`` (runs/eval/<timestamp>/):
for each checkpoint evaluated, its figures on the split asked, and by task the confusion
matrix and per-class precision and recall with the reliability diagram, each label's average
precision, or each target's errors — drawn from that metrics.json alone, so ``report.py``
draws it again."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from utils import plots
from utils.errors import UserError
from utils.report.page import Page
from utils.report.run import REPORT

SCORES = ("precision", "recall")


def write_evaluation_report(folder: Path, results: Mapping[str, Any]) -> Path:
    """``results``: evaluate.py's metrics.json, checkpoint path → its result."""
    page = Page(f"torchloom evaluation {folder.name}")
    for checkpoint, result in results.items():
        if not isinstance(result, Mapping):
            raise UserError(f"{folder / 'metrics.json'}: {checkpoint!r} holds no result object")
        page.heading(str(checkpoint))
        figures = {k: v for k, v in result.items() if "/" in k and isinstance(v, float | int)}
        page.figures(figures)
        classes(page, result)
        listed(page, result.get("per_label"), ("ap", "precision", "recall", "f1", "support"))
        listed(page, result.get("per_target"), ("mae", "rmse", "r2", "bias", "max_abs_error"))
    page.write(folder / REPORT)
    return folder / REPORT


def classes(page: Page, result: Mapping[str, Any]) -> None:
    confusion = result.get("confusion")
    if not isinstance(confusion, list) or not confusion:
        return
    try:
        matrix = np.array(confusion, dtype=np.int64)
    except (TypeError, ValueError):
        raise UserError(
            "metrics.json: its confusion matrix is not numbers; was it edited?"
        ) from None
    count = len(matrix)
    if matrix.shape != (count, count):
        raise UserError(f"metrics.json: its confusion matrix is {matrix.shape}, not square")
    names = [str(n) for n in result.get("classes") or range(count)][:count]
    shown, said = np.arange(count), ""
    if count > plots.MOST_CLASSES:
        shown = plots.most_confused(matrix)
        said = f" (the {len(shown)} most confused of {count} classes)"
    labels = [names[i] for i in shown]
    sub = matrix[np.ix_(shown, shown)]
    page.picture(
        plots.confusion(sub, labels), "confusion: counts, and each true class's shares" + said
    )
    scores = result.get("per_class")
    scores = scores if isinstance(scores, Mapping) else {}
    if all(isinstance(scores.get(key), list) and len(scores[key]) == count for key in SCORES):
        chosen = {key: [float(scores[key][i]) for i in shown] for key in SCORES}
        page.picture(plots.per_class(chosen, labels), "precision and recall per class" + said)
    rows = result.get("reliability")
    if isinstance(rows, list) and rows and all(isinstance(r, Mapping) for r in rows):
        page.picture(plots.reliability(rows), "reliability")


def listed(page: Page, per: Any, columns: tuple[str, ...]) -> None:
    """Per label or per target: one row each, the columns that metrics.json holds."""
    if not isinstance(per, Mapping) or not isinstance(per.get("names"), list):
        return
    present = [c for c in columns if isinstance(per.get(c), list)]
    rows = [
        [str(name), *(per[c][i] if i < len(per[c]) else "" for c in present)]
        for i, name in enumerate(per["names"])
    ]
    page.table(["", *present], rows)
