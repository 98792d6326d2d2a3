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

from utils.errors import UserError
from utils.report.page import Page
from utils.report.run import REPORT, class_pictures


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
    names = [str(n) for n in result.get("classes") or range(count)]
    names = names if len(names) == count else [str(i) for i in range(count)]
    rows = result.get("reliability")
    usable = isinstance(rows, list) and all(isinstance(r, Mapping) for r in rows)
    class_pictures(page, matrix, names, rows if usable else [], "reliability")


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
