"""What a run shows and leaves behind: the config tree, the model summary, the final table,
``metrics.json`` and the TensorBoard hparams record."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.tree import Tree
from torch import nn

from utils.config import flatten
from utils.model_check import parameter_counts


def config_tree(config: Mapping, label: str = "config") -> Tree:
    tree = Tree(f"[bold]{label}")
    for key, value in config.items():
        if isinstance(value, Mapping):
            tree.add(config_tree(value, f"[bold cyan]{key}"))
        else:
            tree.add(f"[cyan]{key}[/]: {value}")
    return tree


def print_model_summary(console: Console, model: nn.Module, input_shape, num_classes: int) -> None:
    total, trainable, size = parameter_counts(model)
    console.print(
        f"model [bold]{model.__class__.__name__}[/]: input {list(input_shape)} → {num_classes} "
        f"classes, {total:,} parameters ({trainable:,} trainable), {size / 2**20:.2f} MiB"
    )


def metrics_table(metrics: Mapping[str, Any]) -> Table:
    table = Table(title="final metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.items():
        table.add_row(name, _format(value))
    return table


def _format(value: Any) -> str:
    if not isinstance(value, float):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"


def write_json(data: Mapping, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=True) + "\n")
    os.replace(tmp, path)


def write_hparams(writer, config: Mapping, metrics: Mapping[str, float]) -> None:
    """Record the flattened config with the final metrics in the run's own event file, so
    TensorBoard's HPARAMS tab compares runs side by side."""
    from torch.utils.tensorboard.summary import hparams

    final = {k: v for k, v in metrics.items() if isinstance(v, float) and math.isfinite(v)}
    experiment, session_start, session_end = hparams(flatten(config), final)
    file_writer = writer._get_file_writer()
    for summary in (experiment, session_start, session_end):
        file_writer.add_summary(summary)
