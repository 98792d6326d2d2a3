"""``model.init``: how Linear and Conv weights start (biases at zero), for every model.

python train.py model.init=kaiming      # default | xavier | kaiming | orthogonal
"""

from __future__ import annotations

from torch import nn

from utils.errors import UserError

SCHEMES = {
    "xavier": nn.init.xavier_uniform_,
    "kaiming": lambda weight: nn.init.kaiming_normal_(weight, nonlinearity="relu"),
    "orthogonal": nn.init.orthogonal_,
}
SCHEME_NAMES = ("default", *SCHEMES)


def initialize(model: nn.Module, scheme: str) -> nn.Module:
    """``default`` keeps PyTorch's own initialisation of each layer."""
    if scheme == "default":
        return model
    if scheme not in SCHEMES:
        raise UserError(f"model.init={scheme!r} must be one of default, {', '.join(SCHEMES)}")
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            SCHEMES[scheme](module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return model
