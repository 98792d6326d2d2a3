"""Which layer each parameter belongs to, counted from the input: what ``optim.layer_decay``
scales (utils/model/optim.py). Layer ``i`` of ``L`` trains at ``optim.lr × layer_decay^(L-1-i)``:
the head at the full LR, each layer below it a factor ``layer_decay`` less.

A model may declare its layers with a method ``layer_groups()`` returning, from the input to
the output, ``(name, module or parameters)`` pairs; every trainable parameter must be in
exactly one (one left out would silently train at the full LR, so that is refused). Otherwise
the rule by module order applies:

- walk the model's children in order. A block is a child with modules of its own. A
  ``Sequential`` or ``ModuleList`` of blocks is opened, and so is a block that is the only one
  among its siblings (a wrapper, ViT's ``encoder``): each block in it is a layer (ResNet's ``layer1.0``, MobileNet's ``features.3``,
  ViT's encoder layers); any other block is a layer; the leaves with parameters before the
  first block form one stem layer (ResNet's ``conv1`` and ``bn1``), a leaf after it is a
  layer of its own (``fc``); parameters held directly (a class token) join the first layer;
- a model that is a flat stack of leaves (the ``mlp``, the ``cnn``) has a layer per
  convolution or linear layer, with the norms and activations that follow it;
- ``model=torchvision``'s new classifier is always the last layer, the head.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from utils.errors import UserError

WEIGHT_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding)


@dataclass
class Layer:
    name: str
    parameters: list[nn.Parameter]


def model_layers(model: nn.Module) -> list[Layer]:
    """``model``'s layers, from the input to the output, each parameter in exactly one."""
    declared = getattr(model, "layer_groups", None)
    if callable(declared):
        layers = [Layer(name, _parameters(part)) for name, part in declared()]
        _check_cover(model, layers)
    else:
        layers = by_module_order(model)
    return [layer for layer in layers if layer.parameters]


def by_module_order(model: nn.Module, leave_out: Iterable[nn.Parameter] = ()) -> list[Layer]:
    """The rule by module order (the module docstring), without the ``leave_out`` parameters
    (a head the caller appends itself)."""
    skip = {id(p) for p in leave_out}
    walker = _Walk(skip)
    walker.walk(model, "")
    return walker.layers


def _parameters(part: nn.Module | Iterable[nn.Parameter]) -> list[nn.Parameter]:
    return list(part.parameters() if isinstance(part, nn.Module) else part)


def _check_cover(model: nn.Module, layers: list[Layer]) -> None:
    """Every parameter of ``model`` in exactly one of ``layers``: one line naming the first
    that is not."""
    owner = type(model).__name__
    seen: dict[int, str] = {}
    for layer in layers:
        for parameter in layer.parameters:
            if id(parameter) in seen:
                raise UserError(
                    f"optim.layer_decay: {owner}.layer_groups() puts a parameter in "
                    f"both {seen[id(parameter)]!r} and {layer.name!r}; give each "
                    "parameter one layer"
                )
            seen[id(parameter)] = layer.name
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and id(parameter) not in seen:
            raise UserError(
                f"optim.layer_decay: parameter {name} is in none of "
                f"{owner}.layer_groups()'s layers (it would train at the full LR "
                "unnoticed); add it to one"
            )


class _Walk:
    def __init__(self, skip: set[int]) -> None:
        self.skip, self.layers = skip, []

    def params(self, module: nn.Module, recurse: bool = True) -> list[nn.Parameter]:
        return [p for p in module.parameters(recurse=recurse) if id(p) not in self.skip]

    def children(self, module: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(n, c) for n, c in module.named_children() if self.params(c)]

    def is_block(self, module: nn.Module) -> bool:
        return bool(self.children(module))

    def leaves(self, module: nn.Module) -> list[nn.Module]:
        return [c for _, c in self.children(module) if not self.is_block(c)]

    def direct(self, module: nn.Module) -> list[nn.Parameter]:
        return self.params(module, recurse=False)

    def opens(self, module: nn.Module) -> bool:
        """A Sequential or ModuleList of at least two blocks: each is a layer of its own."""
        blocks = [c for _, c in self.children(module) if self.is_block(c)]
        return isinstance(module, nn.Sequential | nn.ModuleList) and len(blocks) >= 2

    def walk(self, module: nn.Module, prefix: str) -> None:
        first = len(self.layers)
        direct = self.direct(module)
        children = self.children(module)
        if not any(self.is_block(c) for _, c in children):  # a flat stack of leaves
            self._stack(children, prefix, first)
        else:
            stem: list[str] = []
            single = sum(self.is_block(c) for _, c in children) == 1  # a wrapper, an encoder
            for name, child in children:
                if self.opens(child) or (single and self.is_block(child)):
                    self.walk(child, f"{prefix}{name}.")
                elif self.is_block(child) or len(self.layers) > first:
                    self.layers.append(Layer(f"{prefix}{name}", self.params(child)))
                else:  # leaves before the first block: the stem
                    stem.append(name)
            if stem:
                merged = [p for n in stem for p in self.params(module.get_submodule(n))]
                self.layers.insert(first, Layer(f"{prefix}{'+'.join(stem)}", merged))
        if direct:  # a class token, a position embedding: with the first layer here
            if len(self.layers) > first:
                self.layers[first].parameters[:0] = direct
            else:
                self.layers.append(Layer(prefix.rstrip(".") or "parameters", direct))

    def _stack(self, children: list[tuple[str, nn.Module]], prefix: str, first: int) -> None:
        """A layer per convolution or linear layer, with what follows it."""
        for name, child in children:
            if isinstance(child, WEIGHT_LAYERS) or len(self.layers) == first:
                self.layers.append(Layer(f"{prefix}{name} ({type(child).__name__})", []))
            self.layers[-1].parameters += self.params(child)
