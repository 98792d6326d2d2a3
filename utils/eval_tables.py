"""What ``evaluate.py`` shows for each checkpoint: the metrics, per-class precision, recall and
F1, the confusion matrix (as a table, a CSV and a TensorBoard image), and a comparison table
when several checkpoints are evaluated."""

from __future__ import annotations

from typing import Any

import torch
from rich.table import Table

from utils.evaluation import per_class_scores


def confusion_image(confusion: torch.Tensor, cell: int = 12) -> torch.Tensor:
    """Rows normalised to [0, 1], dark = many: a [1, H, W] image for TensorBoard."""
    rows = confusion.double() / confusion.sum(dim=1, keepdim=True).clamp(min=1)
    image = (1 - rows).float().repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    return image.unsqueeze(0)


def checkpoint_tables(out: Any, name: str, metrics: dict, split: str) -> dict[str, Any]:
    """Print one checkpoint's tables through ``out``; return its JSON-ready metrics."""
    confusion = metrics.pop("confusion")
    scores = per_class_scores(confusion)
    support = confusion.sum(dim=1).tolist()
    classes = len(support)
    summary = {f"{split}/{k}": v for k, v in metrics.items()}
    for score in ("precision", "recall", "f1"):
        summary[f"{split}/macro_{score}"] = sum(scores[score]) / classes
    overview = Table(title=f"{name} — {split}")
    overview.add_column("metric")
    overview.add_column("value", justify="right")
    for key in ("loss", "acc", "acc_top5"):
        if f"{split}/{key}" in summary:
            overview.add_row(f"{split}/{key}", f"{summary[f'{split}/{key}']:.4f}")
    out.print(overview)
    table = Table(title="per class")
    for column in ("class", "precision", "recall", "F1", "support"):
        table.add_column(column, justify="right")
    for index in range(classes):
        table.add_row(
            str(index),
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
    if classes <= 20:
        matrix = Table(title="confusion (rows: true class, columns: predicted)")
        matrix.add_column("")
        for index in range(classes):
            matrix.add_column(str(index), justify="right")
        for index, row in enumerate(confusion.tolist()):
            matrix.add_row(str(index), *map(str, row))
        out.print(matrix)
    return {**summary, "per_class": scores, "support": support, "confusion": confusion.tolist()}


def confusion_csv(confusion: torch.Tensor) -> str:
    classes = len(confusion)
    rows = [",".join(["true\\predicted", *map(str, range(classes))])]
    rows += [",".join([str(i), *map(str, row)]) for i, row in enumerate(confusion.tolist())]
    return "\n".join(rows) + "\n"


def comparison(results: dict[str, dict], split: str) -> Table:
    """One row per checkpoint, one column per ``split`` metric."""
    table = Table(title=f"comparison — {split}")
    keys = [k for k in next(iter(results.values())) if k.startswith(f"{split}/")]
    table.add_column("checkpoint", overflow="fold")
    for key in keys:
        table.add_column(key.split("/")[1].replace("macro_", "macro "), justify="right")
    for name, result in results.items():
        table.add_row(name, *(f"{result.get(k, float('nan')):.4f}" for k in keys))
    return table
