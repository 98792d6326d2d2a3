"""What ``evaluate.py`` shows for each checkpoint: the metrics, then per-class precision, recall
and F1 with the confusion matrix (as a table, a CSV and a TensorBoard image), per-label AP, or
per-target errors and residuals — each task picks its tables (utils/tasks.py ``Task.tables``);
and a comparison table when several checkpoints are evaluated."""

from __future__ import annotations

from typing import Any

import torch
from rich.table import Table

from utils.evaluation.metrics import per_class_scores
from utils.text import shown

MAX_IMAGE_SIDE = 1200  # pixels: 100 classes at 12 px a cell


def confusion_image(confusion: torch.Tensor, cell: int = 12) -> torch.Tensor:
    """Rows normalised to [0, 1], dark = many: a [1, H, W] image for TensorBoard, ``cell``
    pixels a cell while the image stays within :data:`MAX_IMAGE_SIDE` (memory grows as its
    area: 600 classes at 12 px were 2.5 GB)."""
    rows = confusion.float() / confusion.sum(dim=1, keepdim=True).clamp(min=1)
    cell = max(1, min(cell, MAX_IMAGE_SIDE // len(confusion)))  # 1,000 classes: 1 px a cell
    image = (1 - rows).repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    return image.unsqueeze(0)


def reliability_csv(rows: list[dict]) -> str:
    """The reliability table: each confidence bin's range, count, accuracy, mean confidence and
    gap (numbers in full)."""
    lines = ["lo,hi,count,accuracy,confidence,gap"]
    for row in rows:
        gap = abs(row["accuracy"] - row["confidence"]) if row["count"] else 0.0
        lines.append(
            ",".join(
                [
                    repr(row["lo"]),
                    repr(row["hi"]),
                    str(row["count"]),
                    repr(row["accuracy"]),
                    repr(row["confidence"]),
                    repr(gap),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def overview_table(out: Any, title: str, summary: dict[str, Any], split: str) -> None:
    overview = Table(title=shown(title))
    overview.add_column("metric")
    overview.add_column("value", justify="right")
    for key, value in summary.items():
        if key.startswith(f"{split}/") and isinstance(value, float):
            overview.add_row(shown(key), f"{value:.4f}")
    out.print(overview)


def label_tables(out: Any, name: str, metrics: dict, split: str, names: list[str]) -> dict:
    """task=multilabel: the metrics, then each label's AP, precision, recall, F1 and support."""
    per_label = metrics.pop("per_label")
    summary = {f"{split}/{k}": v for k, v in metrics.items()}
    overview_table(out, f"{name} — {split}", summary, split)
    table = Table(title="per label (precision, recall and F1 at the task's threshold)")
    for column in ("label", "AP", "precision", "recall", "F1", "support"):
        table.add_column(column, justify="right")
    for index, label in enumerate(names):
        ap = per_label["ap"][index]
        table.add_row(
            shown(label),
            "-" if ap != ap else f"{ap:.4f}",
            *(f"{per_label[s][index]:.4f}" for s in ("precision", "recall", "f1")),
            str(per_label["support"][index]),
        )
    out.print(table)
    return {**summary, "per_label": {"names": names, **per_label}}


def value_tables(out: Any, name: str, metrics: dict, split: str, names: list[str]) -> dict:
    """task=regression: the metrics, then each target's errors and residual summary, in the
    targets' own units."""
    per_target = metrics.pop("per_target")
    summary = {f"{split}/{k}": v for k, v in metrics.items()}
    overview_table(out, f"{name} — {split}", summary, split)
    columns = ("mae", "rmse", "r2", "bias", "median_abs_error", "p90_abs_error", "max_abs_error")
    table = Table(title="per target (residual = prediction - target; bias = its mean)")
    table.add_column("target", justify="right")
    for column in ("MAE", "RMSE", "R²", "bias", "median |res|", "p90 |res|", "max |res|"):
        table.add_column(column, justify="right")
    for index, target in enumerate(names):
        table.add_row(shown(target), *(f"{per_target[c][index]:.4g}" for c in columns))
    out.print(table)
    return {**summary, "per_target": {"names": names, **per_target}}


def class_tables(out: Any, name: str, metrics: dict, split: str, names: list[str]) -> dict:
    """task=classification: the metrics, per-class precision, recall and F1, and the
    confusion matrix (up to 20 classes)."""
    confusion = metrics.pop("confusion")
    reliability = metrics.pop("reliability", None)  # also reliability.csv and its picture
    scores = per_class_scores(confusion)
    support = confusion.sum(dim=1).tolist()
    classes = len(support)
    summary = {f"{split}/{k}": v for k, v in metrics.items()}
    overview_table(out, f"{name} — {split}", summary, split)
    for score in ("precision", "recall", "f1"):
        summary[f"{split}/macro_{score}"] = sum(scores[score]) / classes
    table = Table(title="per class")
    for column in ("class", "precision", "recall", "F1", "support"):
        table.add_column(column, justify="right")
    for index in range(classes):
        table.add_row(
            shown(names[index]) if len(names) == classes else str(index),
            *(f"{scores[s][index]:.4f}" for s in ("precision", "recall", "f1")),
            str(support[index]),
        )
    table.add_row(
        "macro",
        *(f"{summary[f'{split}/macro_{s}']:.4f}" for s in ("precision", "recall", "f1")),
        str(sum(support)),
        style="bold",
    )
    out.print(table)
    if classes <= 20:  # named as the table above names them
        labels = (
            [shown(n) for n in names] if len(names) == classes else list(map(str, range(classes)))
        )
        matrix = Table(title="confusion", caption="rows: true class; columns: predicted")
        matrix.add_column("")
        for label in labels:
            matrix.add_column(label, justify="right")
        for label, row in zip(labels, confusion.tolist(), strict=True):
            matrix.add_row(label, *map(str, row))
        out.print(matrix)
    shown_names = list(names) if len(names) == classes else list(map(str, range(classes)))
    return {
        **summary,
        "per_class": scores,
        "support": support,
        "confusion": confusion.tolist(),
        "classes": shown_names,
        "reliability": reliability,
    }


def calibration_table(before: dict, after: dict, split: str) -> Table:
    """evaluate.py calibrate=/threshold=: each metric on ``split`` before and after a
    calibration fitted on val (evaluate.py's lines under it say so)."""
    table = Table(title=f"calibration — {split}")
    for column in ("metric", "before", "after"):
        table.add_column(column, justify="right")
    for key, value in before.items():
        if isinstance(value, float) and isinstance(after.get(key), float):
            table.add_row(f"{split}/{key}", f"{value:.4f}", f"{after[key]:.4f}")
    return table


def confusion_csv(confusion: torch.Tensor) -> str:
    classes = len(confusion)
    rows = [",".join(["true\\predicted", *map(str, range(classes))])]
    rows += [",".join([str(i), *map(str, row)]) for i, row in enumerate(confusion.tolist())]
    return "\n".join(rows) + "\n"


def comparison(results: dict[str, dict], split: str) -> Table:
    """One row per checkpoint, one column per ``split`` metric."""
    table = Table(title=f"comparison — {split}")
    first = next(iter(results.values()))
    keys = [k for k, v in first.items() if k.startswith(f"{split}/") and isinstance(v, float)]
    table.add_column("checkpoint", overflow="fold")
    for key in keys:
        table.add_column(key.split("/")[1].replace("macro_", "macro "), justify="right")
    for name, result in results.items():
        table.add_row(shown(name), *(f"{result.get(k, float('nan')):.4f}" for k in keys))
    return table
