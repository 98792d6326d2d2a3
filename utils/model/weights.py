"""Weights between a model and a file: the unwrapped module (no DDP or torch.compile prefixes),
and loading a state dict that must fit the model exactly, naming what does not.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from rich.table import Table
from torch import nn

from utils.errors import UserError
from utils.text import console

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DataParallel, torch.compile


def unwrap(model: nn.Module) -> nn.Module:
    """The module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        else:
            return model


# --- Weights -------------------------------------------------------------------------------


def strip_wrapper_prefixes(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove ``module.`` and ``_orig_mod.`` prefixes, in any order and number."""
    cleaned = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned


def load_weights(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
) -> None:
    """Load weights into the unwrapped ``model``. A mismatch prints a table of missing,
    unexpected and shape-mismatched keys; ``strict=False`` loads what fits, but loading
    nothing at all is always an error."""
    target = unwrap(model)
    target.load_state_dict(weights_that_fit(target.state_dict(), state_dict, strict), strict=False)


def weights_that_fit(
    expected: Mapping[str, torch.Tensor], state_dict: Mapping[str, torch.Tensor], strict: bool
) -> dict[str, torch.Tensor]:
    """The tensors of ``state_dict`` that fit a model whose own state is ``expected`` (its
    tensors may be on the meta device: only their shapes are read), or the mismatch table
    and a :class:`UserError` (see :func:`load_weights`)."""
    incoming = strip_wrapper_prefixes(state_dict)
    missing = [k for k in expected if k not in incoming]
    unexpected = [k for k in incoming if k not in expected]
    mismatched = [
        (k, tuple(incoming[k].shape), tuple(v.shape))
        for k, v in expected.items()
        if k in incoming and incoming[k].shape != v.shape
    ]
    fitting = len(expected) - len(missing) - len(mismatched)
    if (strict and (missing or unexpected or mismatched)) or fitting == 0:
        table = Table(title="checkpoint weights vs model")
        for column in ("key", "problem", "checkpoint", "model"):
            table.add_column(column)
        for key in missing:
            table.add_row(key, "missing from checkpoint", "", "")
        for key in unexpected:
            table.add_row(key, "not in model", "", "")
        for key, have, want in mismatched:
            table.add_row(key, "shape", str(list(have)), str(list(want)))
        console(stderr=True).print(table)
        raise UserError(
            f"the checkpoint's weights do not fit the model: {len(missing)} missing, "
            f"{len(unexpected)} unexpected, {len(mismatched)} of another shape "
            f"({fitting} of {len(expected)} fit); was it trained with another model config?"
        )
    fitted = {k: v for k, v in incoming.items() if k in expected and v.shape == expected[k].shape}
    for key, tensor in fitted.items():  # a stored NaN would only come back as NaN outputs
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UserError(
                f"the checkpoint's weight {key!r} is not finite (NaN or Inf): it is damaged or was "
                "edited; use another checkpoint or train again"
            )
    return fitted
