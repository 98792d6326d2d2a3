"""Start-up checks of the model: one dummy forward (and what it shows: whether the first layer
flattens each sample), and its size."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from utils.errors import UserError


def check_forward(
    model: nn.Module,
    example: torch.Tensor,
    num_classes: int,
    builder: str = "the model",
    outputs: str = "class scores (the dataset's classes)",
    shape: tuple[int, ...] | None = None,
) -> bool:
    """Run ``example``, a 2-sample batch of what the data's kind of input gives the model
    (data/batching/inputs.py), through ``model`` so an input shape it cannot take fails now,
    naming the layer, instead of at the first training step. ``num_classes`` is the width the
    output must have, ``outputs`` what those columns are (``shape``: the whole output of one
    sample, where it is more than that width: a language model's [positions, vocabulary]). Returns whether the first layer the
    forward calls flattens each sample (:func:`flattens`): a model with no spatial structure,
    which random crops and flips only hurt."""
    entered: list[tuple[str, nn.Module]] = []
    first_input: list[torch.Size] = []

    def enter(module: nn.Module, args: tuple, name: str) -> None:
        if not entered and args and isinstance(args[0], torch.Tensor):
            first_input.append(args[0].shape)
        entered.append((name, module))

    hooks = [
        module.register_forward_pre_hook(lambda mod, args, name=name: enter(mod, args, name))
        for name, module in model.named_modules()
        if name and not any(module.children())
    ]
    input_shape = tuple(example.shape[1:])
    was_training = model.training
    model.eval()  # no BatchNorm statistics are updated by the dummy batch
    try:
        # no_grad, not inference_mode: lazy layers (nn.LazyLinear) take their shapes in this
        # first forward, and parameters made under inference mode can never train or be read
        # outside it.
        with torch.no_grad():
            if takes_ids(model) and example.is_floating_point():  # ids of a model's own
                example = torch.zeros_like(example, dtype=torch.long)
            output = model(example)
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
    expected = tuple(shape) if shape is not None else (num_classes,)
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != (2, *expected):
        got = list(output.shape[1:]) if isinstance(output, torch.Tensor) else type(output).__name__
        raise UserError(
            f"{builder} outputs {got} per sample, expected {list(expected)} {outputs}: make "
            f"its last layer give {num_classes} outputs, or take a num_classes (or "
            "num_outputs) argument"
        )
    return bool(entered) and flattens(entered[0][1], first_input[:1], input_shape)


def takes_ids(model: nn.Module) -> bool:
    """Whether ``model``'s first layer (in registration order) looks token ids up."""
    first = next((m for m in model.modules() if not any(m.children())), None)
    return isinstance(first, nn.Embedding | nn.EmbeddingBag)


def flattens(layer: nn.Module, seen: list[torch.Size], input_shape: Sequence[int]) -> bool:
    """Whether ``layer``, the first the forward called (with inputs of shape ``seen``), treats
    each sample as a flat vector of its values: an ``nn.Flatten``, or an ``nn.Linear`` given
    the whole sample flattened (``x.view(len(x), -1)`` first). A linear layer over patches
    or over the last axis alone is not."""
    if isinstance(layer, nn.Flatten):
        return len(input_shape) > 1
    flat = [2, math.prod(input_shape)]
    return (
        isinstance(layer, nn.Linear)
        and len(input_shape) > 1
        and bool(seen)
        and list(seen[0]) == flat
    )


def parameter_counts(model: nn.Module) -> tuple[int, int, int]:
    """(total parameters, trainable parameters, bytes of parameters and buffers)."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return total, trainable, size
