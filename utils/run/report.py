"""What a run shows and leaves behind: the config tree, the model summary, the final table,
``metrics.json`` and the TensorBoard hparams record."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree
from torch import nn

from utils.model.checks import parameter_counts


def config_tree(config: Mapping, label: str = "config") -> Tree:
    tree = Tree(f"[bold]{label}")
    for key, value in config.items():
        if isinstance(value, Mapping):
            tree.add(config_tree(value, f"[bold cyan]{key}"))
        else:  # escaped: a value like [price, rent] is text, not a rich style tag
            tree.add(f"[cyan]{key}[/]: {escape(str(value))}")
    return tree


def model_summary(model: nn.Module, input_shape, task: Any) -> str:
    """One line: the model, its input and output (the fitted ``task``'s, utils/tasks.py), its
    size."""
    total, trainable, size = parameter_counts(model)
    return (
        f"model [bold]{model.__class__.__name__}[/]: input {list(input_shape)} → "
        f"{len(task.names)} {task.unit}, {total:,} parameters ({trainable:,} trainable), "
        f"{size / 2**20:.2f} MiB"
    )


def final_metrics(state, summary: Mapping, data, checkpointer) -> dict:
    """What metrics.json holds for a finished run: the final train/val/test metrics, the
    run's throughput ``summary``, the ``data``'s split sizes, its best epoch and where best.pt
    is, and how it was run."""
    return {
        "status": "completed",
        **state.metrics,
        **summary,
        "test_split": data.test_split,
        "samples": data.sizes(),  # each split's
        "monitor": checkpointer.monitor.name,
        "best_metric": state.best_metric,
        "best_epoch": state.best_epoch,
        "epochs": state.epoch,
        "global_step": state.global_step,
        # samples of one optimizer step, every process's and micro-batch's together
        "samples_per_step": state.global_batch * checkpointer.trainer.accumulate_grad_batches,
        "stopped_by": state.stopped_by,  # a callback's stop: its name, reason, epoch and step
        "wall_time_seconds": state.total_seconds(),  # every segment of a resumed run
        "segment_wall_time_seconds": state.segment_seconds(),  # this process's alone
        "best_checkpoint": str(checkpointer.best),
        "overrides": checkpointer.run.record.overrides,
    }


MAX_TABLE_WIDTH = 136  # characters of a row of the final table; longer values fold, never cut


def metrics_table(metrics: Mapping[str, Any]) -> Table:
    """The final figures, every one whole and readable in a log file as on a terminal: a list
    (the overrides) one item a line, a long value folded, the table as narrow as they allow."""
    table = Table(title="final metrics")
    table.add_column("metric", no_wrap=True)
    names = max((len(name) for name in metrics), default=0)
    shown = max(MAX_TABLE_WIDTH - names - 7, 40)  # the rest of the row: the borders' 7
    table.add_column("value", justify="right", overflow="fold", max_width=shown)
    for name, value in metrics.items():
        table.add_row(name, escape(_format(value)))
    return table


def _format(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "\n".join(_format(item) for item in value) if value else "[]"
    if isinstance(value, dict):
        return "\n".join(f"{key}: {_format(item)}" for key, item in value.items()) or "{}"
    if not isinstance(value, float):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"


def image_grid(images: torch.Tensor, columns: int, padding: int = 2) -> torch.Tensor:
    """Images [N, C, H, W] in [0, 1] tiled row by row on white, as one RGB image [3, H', W']
    (torchvision's ``make_grid``, without importing torchvision for it at start-up)."""
    n, _, height, width = images.shape
    rows = math.ceil(n / columns)
    grid = torch.ones(3, padding + rows * (height + padding), padding + columns * (width + padding))
    for index, image in enumerate(images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images):
        top = padding + (index // columns) * (height + padding)
        left = padding + (index % columns) * (width + padding)
        grid[:, top : top + height, left : left + width] = image
    return grid


def log_sample_grid(tracker, first_batch: tuple, data, task, count: int = 16):
    """The first training samples as the model sees them (augmented, then shown un-normalised)
    with their targets as the ``task`` shows them, in the history (TensorBoard's images and
    text): a label that does not match its image shows at once."""
    images, labels = first_batch[0][:count].float().cpu(), first_batch[1][:count].cpu()
    if images.dim() == 3 and len(data.input_shape) == 1:  # each member's own rows: member 0's
        images, labels = images[:, 0], labels[:, 0]
    if images.dim() == 4:  # images (a table's rows have no picture)
        mean = torch.tensor(data.mean).view(1, -1, 1, 1)
        std = torch.tensor(data.std).view(1, -1, 1, 1)
        shown = (images * std + mean).clamp(0, 1)
        tracker.image("train/samples", image_grid(shown, columns=8), 0)
    shown = task.shown_targets(labels)
    rows = [" ".join(f"{text:>3}" for text in shown[i : i + 8]) for i in (0, 8)]
    tracker.text("train/sample_labels", "row by row: " + " / ".join(rows), 0)
