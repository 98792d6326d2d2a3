"""A model rebuilt from a checkpoint alone, the checkpoint read as untrusted data: its config
checked against torchloom's exact builders (utils/config/trust.py), its inputs record checked
(utils/checkpoint/record.py), the model built on the meta device first to check its weights fit
(utils/checkpoint/stored.py). What predict.py predicts with, what ``distill.teacher`` teaches with,
and, rebuilt on the data it is evaluated on, what evaluate.py scores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from utils.checkpoint.record import InputRecord
from utils.checkpoint.stored import check_stored_model, model_config, read_checkpoint, task_config
from utils.config.build import build
from utils.model.modules import Modules, model_shapes
from utils.model.weights import load_weights


@dataclass
class Rebuilt:
    model: nn.Module  # in eval mode, on the device asked for
    record: InputRecord  # how its inputs were shaped and normalised
    task: Any  # what it predicts (utils/tasks.py), fitted to the record
    weights: str  # which of the checkpoint's weights: swa, ema, raw, or export


def rebuild(path: Path, weights: str, device: torch.device) -> Rebuilt:
    """The model of the checkpoint (or .safetensors export) at ``path`` with its ``weights``
    (auto, swa, ema or raw) on ``device``, in eval mode."""
    config, state, inputs, which = read_checkpoint(path, None, weights)
    record = InputRecord.read(inputs, path)
    task = build(task_config(config)).fitted(record, torch.device("cpu"), record)  # as trained
    modules = rebuild_model(config, state, record, device, task)
    return Rebuilt(modules.model.eval(), record, task, which)


def rebuild_model(config: dict, weights: dict, shapes: Any, device: Any, task: Any) -> Modules:
    """The stored ``config``'s model for inputs and outputs of ``shapes`` (an inputs record,
    or the data it is evaluated on), checked on the meta device that ``weights`` fit before
    anything it asks is allocated, then built on ``device`` with them loaded."""
    model_node = OmegaConf.create(model_config(config["model"]))
    hints = shapes.model_hints()  # read once: a table's quantiles are a pass over its rows
    # The check leaves the quantiles out: the weights hold those the model was fitted to.
    supplied = model_shapes(
        shapes.input_shape, shapes.num_classes, {**hints, "feature_quantiles": None}
    )
    check_stored_model(model_node, supplied, weights)
    modules = Modules.build(model_node, shapes, device, None, task, hints=hints)
    load_weights(modules.model, weights)
    return modules
