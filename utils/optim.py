"""Building the optimizer from ``conf/optim/*.yaml``, with optional no-decay parameter groups."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from utils.config import build
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
    group (default: all)."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or (only is not None and id(parameter) not in only):
                continue
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
}


def build_optimizer(model: nn.Module, optim_cfg: DictConfig) -> torch.optim.Optimizer:
    """``optim_cfg`` is a partial torch.optim constructor plus ``decay_bias_and_norm``."""
    kwargs = OmegaConf.to_container(optim_cfg, resolve=True)
    decay_bias_and_norm = kwargs.pop("decay_bias_and_norm", OPTIONAL_OPTIM_KEYS[
        "decay_bias_and_norm"])  # fmt: skip
    weight_decay = kwargs.get("weight_decay", OPTIONAL_OPTIM_KEYS["weight_decay"])
    if weight_decay is None:
        weight_decay = default_weight_decay(kwargs["_target_"])
    scale = kwargs.pop("backbone_lr_scale", OPTIONAL_OPTIM_KEYS["backbone_lr_scale"])
    parts = [(None, 1.0)]  # (parameter ids, LR scale): all parameters at optim.lr
    if scale != 1.0:
        if not hasattr(model, "backbone_parameters"):
            raise UserError(f"optim.backbone_lr_scale={scale} needs a model with a backbone "
                            "and a classifier (model=torchvision); leave it at 1.0")  # fmt: skip
        parts = [({id(p) for p in model.head_parameters()}, 1.0),
                 ({id(p) for p in model.backbone_parameters()}, scale)]  # fmt: skip
    groups = []
    for ids, lr_scale in parts:
        if decay_bias_and_norm:
            part = [
                p for p in model.parameters() if p.requires_grad and (ids is None or id(p) in ids)
            ]
            part_groups = [{"params": part}]
        else:
            part_groups = parameter_groups(model, weight_decay, ids)
        for group in part_groups:
            if lr_scale != 1.0:
                group["lr"] = kwargs["lr"] * lr_scale
        groups += part_groups
    return build(kwargs)(groups if len(groups) > 1 else groups[0]["params"])


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
