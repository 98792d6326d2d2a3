"""Building the optimizer from ``conf/optim/*.yaml``, with optional no-decay parameter groups."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from utils.config import build

NORM_LAYERS = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Biases and normalisation weights get no weight decay: shrinking them towards zero only
    fights the normalisation and does not regularise."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad:
                continue
            if name == "bias" or isinstance(module, NORM_LAYERS):
                no_decay.append(parameter)
            else:
                decay.append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, optim_cfg: DictConfig) -> torch.optim.Optimizer:
    """``optim_cfg`` is a partial torch.optim constructor plus ``decay_bias_and_norm``."""
    kwargs = OmegaConf.to_container(optim_cfg, resolve=True)
    decay_bias_and_norm = kwargs.pop("decay_bias_and_norm")
    if decay_bias_and_norm:
        params = [p for p in model.parameters() if p.requires_grad]
    else:
        params = parameter_groups(model, kwargs["weight_decay"])
    return build(kwargs)(params)


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each param group's settings (LR, weight decay, betas, ...) without its parameters."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
