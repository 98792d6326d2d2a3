"""Start-up checks of the model: one dummy forward, and its size."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from utils.errors import UserError


def check_forward(
    model: nn.Module, input_shape: Sequence[int], num_classes: int, device: torch.device,
    builder: str = "the model", outputs: str = "class scores (the dataset's classes)",
) -> None:  # fmt: skip
    """Run a 2-sample dummy batch through ``model`` so an input shape it cannot take fails now,
    naming the layer, instead of at the first training step. ``num_classes`` is the width the
    output must have, ``outputs`` what those columns are."""
    entered: list[tuple[str, nn.Module]] = []
    hooks = [
        module.register_forward_pre_hook(lambda mod, args, name=name: entered.append((name, mod)))
        for name, module in model.named_modules()
        if name and not any(module.children())
    ]
    was_training = model.training
    model.eval()  # no BatchNorm statistics are updated by the dummy batch
    try:
        # no_grad, not inference_mode: lazy layers (nn.LazyLinear) take their shapes in this
        # first forward, and parameters made under inference mode can never train or be read
        # outside it.
        with torch.no_grad():
            output = model(torch.zeros(2, *input_shape, device=device))
    except RuntimeError as error:
        name, module = entered[-1] if entered else ("(model)", model)
        reason = str(error).strip().splitlines()[0]
        raise UserError(
            f"the model cannot take inputs of shape {list(input_shape)}: layer '{name}' "
            f"({module.__class__.__name__}) failed: {reason}; choose a model or data.shape "
            f"that fit"
        ) from None
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != (2, num_classes):
        got = list(output.shape[1:]) if isinstance(output, torch.Tensor) else type(output).__name__
        raise UserError(
            f"{builder} outputs {got} per sample, expected [{num_classes}] {outputs}: make "
            f"its last layer give {num_classes} outputs, or take a num_classes (or "
            "num_outputs) argument"
        )


def parameter_counts(model: nn.Module) -> tuple[int, int, int]:
    """(total parameters, trainable parameters, bytes of parameters and buffers)."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return total, trainable, size
