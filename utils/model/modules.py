"""Which module each phase calls: the model as built (checkpoints, summaries, loading weights),
the model the training step calls (DDP and torch.compile around it), and the one evaluation
calls (never DDP: evaluation shards need not have equal batch counts, so no collectives; under
FSDP the sharded model itself, every process calling it as often: utils/system/sharding.py).

    modules = Modules.build(cfg.model, data, context.device, trainer.channels_last, task)
    modules.wrap_for_steps(context.processes, trainer)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from utils.config.build import build
from utils.errors import UserError
from utils.model.checks import check_forward
from utils.system import distributed, sharding
from utils.system.compilation import compile_or_eager
from utils.system.device import wants_channels_last

# What the output columns are, for the dummy forward's message (data/batching/targets.py kinds).

log = logging.getLogger("torchloom")


@dataclass(kw_only=True)
class Modules:
    model: nn.Module
    channels_last: bool  # the memory layout of the weights and of every batch
    device: torch.device
    input_shape: tuple[int, ...]
    step_model: nn.Module
    eval_model: nn.Module
    flattens_input: bool = False  # its first layer flattens each sample (an MLP): no crops
    example: torch.Tensor | None = None  # a batch of 2 of what it takes (torch.compile's proof)

    @property
    def batch_members(self) -> int:
        """How many members each draw their own training rows (models/tabular/,
        ``model.share_batches=false``); 1 for every other model."""
        return getattr(self.model, "batch_members", 1)

    @classmethod
    def build(
        cls,
        node: Any,
        data: Any,
        device: torch.device,
        channels_last: bool | None,
        task: Any,
        hints: dict[str, Any] | None = None,
    ) -> Modules:
        """The model of config ``node``, its shapes and ``hints`` taken from ``data`` (hints
        given: already read from it), on ``device`` in the layout ``channels_last`` asks for
        (null: the fast one), checked by the data's example batch against the outputs the
        fitted ``task`` needs (utils/tasks.py)."""
        hints = data.model_hints() if hints is None else hints
        shapes = model_shapes(data.input_shape, data.num_classes, hints)
        model = build(node, **accepted_by(node["_target_"], shapes))
        layout = wants_channels_last(model, device, channels_last)
        model = model.to(device, memory_format=torch.channels_last if layout else None)
        example = data.inputs.example(data.input_shape, 2, device)
        builder, shape = str(node["_target_"]), task.output_shape(tuple(data.input_shape))
        flat = check_forward(model, example, data.num_classes, builder, task.outputs, shape)
        return cls(
            model=model,
            channels_last=layout,
            device=device,
            input_shape=tuple(data.input_shape),
            step_model=model,
            eval_model=model,
            flattens_input=flat,
            example=example,
        )

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
        if trainer.activation_checkpointing:  # each block recomputed in the backward
            blocks = sharding.blocks_of(self.model, trainer.fsdp.blocks)
            sharding.checkpoint_blocks(self.model, blocks)
            log.info("trainer.activation_checkpointing: %d blocks recomputed", len(blocks))
        step_model = distributed.wrap(self.model, processes, self.device, trainer.sync_batchnorm)
        if trainer.compile:
            step_model = compile_or_eager(step_model, self.example, trainer.compile_mode)
        self.step_model = step_model
        self.eval_model = step_model if not processes.enabled else self.model


def model_shapes(input_shape: Any, outputs: int, hints: dict[str, Any]) -> dict[str, Any]:
    """What a model builder may take from the data: ``input_shape``, and the width of its
    output as ``num_classes`` (classes, labels or values: the built-in models' name) or
    ``num_outputs`` (the same number, for builders written for any task); and the ``hints``
    its kind of input gives (data/batching/inputs.py HINTS: a table's ``feature_quantiles``,
    ``train_rows`` and ``indicator_features``, texts' ``vocab_size`` and ``pad_id``; None
    where the kind has none)."""
    return {
        "input_shape": tuple(input_shape),
        "num_classes": outputs,
        "num_outputs": outputs,
        **hints,
    }


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
