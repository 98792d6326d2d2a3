"""Building the optimizer from ``conf/optim/*.yaml``: no weight decay on biases and norms, and
each layer's LR (``optim.layer_decay``, ``optim.backbone_lr_scale``)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf
from rich.markup import escape
from rich.table import Table
from torch import nn

from models.layers import model_layers
from utils.config.build import build
from utils.errors import UserError

NORM_LAYERS = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
)


def parameter_groups(
    model: nn.Module, weight_decay: float, only: set[int] | None = None
) -> list[dict]:
    """Biases and normalisation weights get no weight decay: shrinking them towards zero only
    fights the normalisation and does not regularise. ``only``: the ids of the parameters to
    group (default: all). A parameter two modules share (a GPT's tied embedding and head) is
    grouped once, where it is first met."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or (only is not None and id(parameter) not in only):
                continue
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if name == "bias" or isinstance(module, NORM_LAYERS):
                no_decay.append(parameter)
            else:
                decay.append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# The keys an optimizer YAML may leave out, and what leaving them out means: the whole of what
# a conf/optim file needs is ``_target_``, ``_partial_: true`` and the optimizer's own
# arguments (docs/extending.md, "Bring your own model").
OPTIONAL_OPTIM_KEYS = {
    "decay_bias_and_norm": False,  # read here, not by the optimizer: biases and norms undecayed
    "weight_decay": None,  # absent: the optimizer's own default (0 for most of torch.optim)
    "backbone_lr_scale": 1.0,  # model=torchvision: the backbone's LR is optim.lr times this
    "layer_decay": None,  # each layer below the head: its LR times this (models/layers.py)
}


def build_optimizer(model: nn.Module, optim_cfg: DictConfig) -> torch.optim.Optimizer:
    """``optim_cfg`` is a partial torch.optim constructor plus torchloom's own keys
    (:data:`OPTIONAL_OPTIM_KEYS`). The param groups are fixed here, once: freezing a backbone
    later only turns its gradients off, so a resume across a thaw finds the same groups."""
    kwargs = OmegaConf.to_container(optim_cfg, resolve=True)
    ours = {
        key: kwargs.pop(key, default)
        for key, default in OPTIONAL_OPTIM_KEYS.items()
        if key != "weight_decay"
    }
    weight_decay = kwargs.get("weight_decay", OPTIONAL_OPTIM_KEYS["weight_decay"])
    if weight_decay is None:
        weight_decay = default_weight_decay(kwargs["_target_"])
    groups = []
    for name, ids, lr_scale in lr_parts(model, ours["backbone_lr_scale"], ours["layer_decay"]):
        if ours["decay_bias_and_norm"]:
            part = [
                p for p in model.parameters() if p.requires_grad and (ids is None or id(p) in ids)
            ]
            part_groups = [{"params": part}]
        else:
            part_groups = parameter_groups(model, weight_decay, ids)
        for group in part_groups:
            if lr_scale != 1.0:
                group.update(lr=kwargs["lr"] * lr_scale, lr_scale=lr_scale)
            if name is not None:
                group["layer"] = name
        groups += [group for group in part_groups if group["params"] or name is None]
    return build(kwargs)(groups if len(groups) > 1 else groups[0]["params"])


def lr_parts(
    model: nn.Module, backbone_scale: float, layer_decay: float | None
) -> list[tuple[str | None, set[int] | None, float]]:
    """(layer name, its parameter ids, its LR scale) for each part of ``model`` with its own
    LR. One meaning for both keys: a parameter's LR is ``optim.lr × layer_decay^(layers above
    it) × backbone_lr_scale`` (the last factor for all but model=torchvision's classifier)."""
    if backbone_scale != 1.0 and not hasattr(model, "backbone_parameters"):
        raise UserError(
            f"optim.backbone_lr_scale={backbone_scale} needs a model with a backbone "
            "and a classifier (model=torchvision); leave it at 1.0"
        )
    head = {id(p) for p in model.head_parameters()} if backbone_scale != 1.0 else set()
    if layer_decay is None:
        if backbone_scale == 1.0:
            return [(None, None, 1.0)]  # all parameters at optim.lr
        backbone = {id(p) for p in model.backbone_parameters()}
        return [(None, head, 1.0), (None, backbone, backbone_scale)]
    layers = model_layers(model)
    parts = []
    for depth, layer in enumerate(reversed(layers)):
        ids = {id(p) for p in layer.parameters}
        scale = layer_decay**depth * (1.0 if ids <= head or not head else backbone_scale)
        parts.append((layer.name, ids, scale))
    return parts[::-1]


def lr_table(optimizer: torch.optim.Optimizer) -> Table | None:
    """Each layer's LR and parameter count, from the input to the head, when the layers have
    LRs of their own (``optim.layer_decay``); None otherwise."""
    rows: dict[str, list] = {}
    for group in optimizer.param_groups:
        if "layer" in group:
            row = rows.setdefault(group["layer"], [group["lr"], 0])
            row[1] += sum(p.numel() for p in group["params"])
    if not rows:
        return None
    table = Table(title="LR by layer (optim.layer_decay)")
    for column in ("layer", "lr", "parameters"):
        table.add_column(column, justify="left" if column == "layer" else "right")
    for name, (lr, count) in rows.items():
        table.add_row(escape(name), f"{lr:.3g}", f"{count:,}")
    return table


def default_weight_decay(target: str) -> float:
    """The ``weight_decay`` default of the optimizer class ``target`` names (0 without one)."""
    import inspect

    from hydra._internal.utils import _locate

    parameter = inspect.signature(_locate(target)).parameters.get("weight_decay")
    default = None if parameter is None else parameter.default
    return default if isinstance(default, int | float) else 0.0


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each param group's settings (LR, weight decay, betas, ...) without its parameters."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
