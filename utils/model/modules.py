"""Which module each phase calls: the model as built (checkpoints, summaries, loading weights),
the model the training step calls (DDP and torch.compile around it), and the one evaluation
calls (never DDP: evaluation shards need not have equal batch counts, so no collectives; under
FSDP the sharded model itself, every process calling it as often: utils/system/sharding.py).

    modules = Modules.build(cfg.model, data, context.device, trainer.channels_last, task)
    modules.wrap_for_steps(context.processes, trainer)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from data.text.tokenizer import from_record
from utils.config.build import build
from utils.errors import UserError
from utils.model.checks import check_forward
from utils.system import distributed, sharding
from utils.system.compilation import compile_or_eager
from utils.system.device import wants_channels_last

# What the output columns are, for the dummy forward's message (data/batching/targets.py kinds).


@dataclass
class Modules:
    model: nn.Module
    channels_last: bool  # the memory layout of the weights and of every batch
    device: torch.device
    input_shape: tuple[int, ...]
    step_model: nn.Module
    eval_model: nn.Module
    flattens_input: bool = False  # its first layer flattens each sample (an MLP): no crops

    @property
    def batch_members(self) -> int:
        """How many members each draw their own training rows (models/tabular.py,
        ``model.share_batches=false``); 1 for every other model."""
        return getattr(self.model, "batch_members", 1)

    @classmethod
    def build(
        cls, node: Any, data: Any, device: torch.device, channels_last: bool | None, task: Any
    ) -> Modules:
        """The model of config ``node``, its shapes taken from ``data``, on ``device`` in the
        layout ``channels_last`` asks for (null: the fast one), checked by one dummy forward
        against the outputs the fitted ``task`` needs (utils/tasks.py)."""
        text = getattr(data, "text", None)
        shapes = model_shapes(
            data.input_shape,
            data.num_classes,
            getattr(data, "feature_quantiles", None),
            text,
            getattr(data, "train_rows", None),
            getattr(data, "table", None),
        )
        model = build(node, **accepted_by(node["_target_"], shapes))
        layout = wants_channels_last(model, device, channels_last)
        model = model.to(device, memory_format=torch.channels_last if layout else None)
        flat = check_forward(
            model, data.input_shape, data.num_classes, device, str(node["_target_"]), task.outputs
        )
        return cls(model, layout, device, tuple(data.input_shape), model, model, flat)

    def wrap_for_steps(
        self, processes: distributed.Processes, trainer: Any, dtype: torch.dtype = torch.float32
    ) -> None:
        """DDP around the model for several processes, or the model sharded in place
        (trainer.strategy=fsdp, computing in ``dtype``); then torch.compile if asked."""
        if trainer.strategy == "fsdp":  # every phase calls the sharded model, all processes
            self.step_model = self.eval_model = sharding.shard_model(
                self.model, self.device, trainer, dtype
            )
            return
        if processes.enabled and getattr(self.model, "freeze_backbone_epochs", 0):
            raise UserError(
                "model.freeze_backbone_epochs changes which parameters train mid-run, which DDP "
                "cannot follow; set it to 0 under torchrun (optim.backbone_lr_scale works)"
            )
        step_model = distributed.wrap(self.model, processes, self.device, trainer.sync_batchnorm)
        if trainer.compile:
            step_model = compile_or_eager(
                step_model, self.input_shape, self.device, trainer.compile_mode
            )
        self.step_model = step_model
        self.eval_model = step_model if not processes.enabled else self.model


def model_shapes(
    input_shape: Any,
    outputs: int,
    quantiles: Any = None,
    text: dict | None = None,
    rows: int | None = None,
    table: dict | None = None,
) -> dict[str, Any]:
    """What a model builder may take from the data: ``input_shape``, and the width of its
    output as ``num_classes`` (classes, labels or values: the built-in models' name) or
    ``num_outputs`` (the same number, for builders written for any task); for a table's rows,
    ``feature_quantiles``, each feature's training quantiles, and ``train_rows``, how many
    rows the training split holds (models/tabular.py; None when rebuilt from a checkpoint,
    whose weights hold what was fitted), and ``indicator_features``, how many of the features
    are a table's 0/1 columns after its numbers (``table``: its column record, kept in every
    checkpoint, so a rebuild counts the same); for texts (``text``: the
    tokenizer's record), ``vocab_size`` and ``pad_id`` (None for other data)."""
    vocab_size = pad_id = None
    if text is not None:
        tokenizer = from_record(text, "the data's text record")
        vocab_size, pad_id = tokenizer.vocab_size, tokenizer.pad_id
    return {
        "input_shape": tuple(input_shape),
        "num_classes": outputs,
        "num_outputs": outputs,
        "feature_quantiles": quantiles,
        "train_rows": rows,
        "indicator_features": indicator_features(input_shape, table),
        "vocab_size": vocab_size,
        "pad_id": pad_id,
    }


def indicator_features(input_shape: Any, table: dict | None) -> int | None:
    """How many of a table's features follow its numbers: the one-hot categories and the gap
    flags, each 0 or 1 (data/tables/table.py ``Columns``: numbers first); None for other data."""
    numeric = table.get("numeric") if isinstance(table, dict) else None
    if not isinstance(numeric, list) or len(input_shape) != 1:
        return None
    return max(0, int(input_shape[0]) - len(numeric))


def accepted_by(target: str, supplied: dict[str, Any]) -> dict[str, Any]:
    """The ``supplied`` arguments (the dataset's ``input_shape``, ``num_classes``, or the task's
    kind of ``targets`` for a data builder) that the builder ``target`` names takes: any ``nn.Module`` class or function works, whether its
    signature asks for them or not (the dummy forward then checks its output instead)."""
    import inspect

    from hydra._internal.utils import _locate

    parameters = inspect.signature(_locate(target)).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return supplied
    return {name: value for name, value in supplied.items() if name in parameters}
