"""Any classification model of ``torchvision.models``, fitted to the dataset, from random or
pretrained weights (``model=torchvision``).

    python train.py model=torchvision model.name=resnet50 data=imagefolder data.root=flowers
    python train.py model=torchvision model.name=convnext_tiny model.weights=DEFAULT \\
        model.freeze_backbone_epochs=2 optim.backbone_lr_scale=0.1

``name`` goes to ``torchvision.models.get_model``; an unknown name lists close matches. The
model is built as torchvision defines it (1,000 ImageNet classes), ``weights`` are loaded, then:

- its first convolution is refitted to the dataset's channels. Pretrained RGB filters are
  summed for one channel and repeated (scaled by 3/C) for more, so a grey image gives the
  response its RGB copy would;
- its classifier, the last layer with 1,000 outputs, is replaced by a fresh one with
  ``num_classes`` outputs.

``weights``: null (random), a local ``.pth`` file holding the torchvision model's state dict
(loaded with ``weights_only=True``), or a torchvision weight name (``DEFAULT``,
``IMAGENET1K_V1``, ``ResNet50_Weights.IMAGENET1K_V2``) whose file is already in the torch hub
cache (``$TORCH_HOME/hub/checkpoints``). Nothing is downloaded during a run; the error says how
to fetch the file.

``freeze_backbone_epochs=N`` trains only the new classifier for the first N epochs. The rest
keeps its parameters (no gradients) and its BatchNorm statistics (BatchNorm stays in eval mode
although the loop calls ``train()``). From epoch N+1 everything trains. Whether an epoch is
frozen depends on its number alone, so a resume on either side of the boundary is exact.
``optim.backbone_lr_scale`` gives the backbone a smaller LR than the classifier
(utils/model/optim.py).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.nn.functional as F
from torch import nn

from models.layers import by_module_order
from utils.config.arguments import DROPOUT, NON_NEGATIVE_INT, checked
from utils.errors import UserError
from utils.intact import check_intact

IMAGENET_CLASSES = 1000


@checked("model", freeze_backbone_epochs=NON_NEGATIVE_INT, drop_rate=DROPOUT)
def torchvision_model(
    input_shape: Sequence[int],
    num_classes: int,
    name: str,
    weights: str | None,
    freeze_backbone_epochs: int,
    drop_rate: float = 0.0,
) -> FineTuned:
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"close: {', '.join(close)}" if close else f"e.g. {', '.join(names[:5])}"
        raise UserError(f"model.name={name!r} is not a torchvision classification model ({hint})")
    model = torchvision.models.get_model(name, weights=None)
    if weights is not None:
        model.load_state_dict(pretrained_state(name, weights))
    refit_first_conv(model, input_shape[0], pretrained=weights is not None)
    head = replace_head(model, num_classes, name, drop_rate)
    return FineTuned(model, head, freeze_backbone_epochs)


FILE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl", ".tar")  # a weights file, not a name


def pretrained_state(name: str, weights: str) -> dict[str, torch.Tensor]:
    """The state dict ``weights`` names: a local file, or a torchvision weight in the cache."""
    path = Path(weights)
    named = not path.is_file() and "/" not in weights and path.suffix.lower() not in FILE_SUFFIXES
    if named:  # a weight's name (IMAGENET1K_V1, or torchvision's ResNet18_Weights.IMAGENET1K_V1)
        import torchvision

        own = torchvision.models.get_model_weights(name)
        try:
            entry = torchvision.models.get_weight(weights) if "." in weights else own[weights]
            if not isinstance(entry, own):  # another model's weights
                raise ValueError(weights)
        except (KeyError, ValueError, AttributeError):
            known = [w.name for w in own]
            raise UserError(
                f"model.weights={weights!r} is not a weight of {name}; it has "
                f"DEFAULT, {', '.join(known)} (or {own.__name__}.<name>), or give a "
                ".pth file"
            ) from None
        path = Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(entry.url).path).name
        if not path.is_file():
            raise UserError(
                f"model.weights={weights}: {path} is not in the torch hub cache and runs never "
                f'download; fetch it where there is a network (python -c "import torchvision; '
                f"torchvision.models.get_model('{name}', weights='{weights}')\") and copy it "
                f"there, or pass model.weights=<file.pth>"
            )
    if not path.is_file():
        raise UserError(f"model.weights={weights}: no such file")
    check_intact(path, f"fetch it again (model.weights={weights})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        raise UserError(
            f"model.weights={weights}: not a readable state dict (it is loaded "
            "with weights_only=True, so it may hold tensors only)"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"model.weights={weights}: expected a state dict of {name}")
    return state


def refit_first_conv(model: nn.Module, channels: int, pretrained: bool) -> None:
    """The first convolution, for ``channels`` input channels (torchvision's take 3)."""
    found = next(((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)
    if found is None or found[1].in_channels == channels:
        return
    name, conv = found
    refit = nn.Conv2d(
        channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        conv.bias is not None,
    )
    if pretrained:
        with torch.no_grad():
            weight = conv.weight
            if channels == 1:
                refit.weight.copy_(weight.sum(dim=1, keepdim=True))
            else:
                repeats = math.ceil(channels / weight.shape[1])
                refit.weight.copy_(weight.repeat(1, repeats, 1, 1)[:, :channels] * 3 / channels)
            if conv.bias is not None:
                refit.bias.copy_(conv.bias)
    model.set_submodule(name, refit)


def replace_head(model: nn.Module, num_classes: int, name: str, drop_rate: float = 0.0) -> str:
    """Replace the classifier (the last layer with 1,000 outputs) by a fresh one, with dropout
    ``drop_rate`` on its input (``model.drop_rate``, timm's head dropout; added to any the
    architecture has); its name."""
    heads = [
        (n, m)
        for n, m in model.named_modules()
        if (isinstance(m, nn.Linear) and m.out_features == IMAGENET_CLASSES)
        or (isinstance(m, nn.Conv2d) and m.out_channels == IMAGENET_CLASSES)
    ]
    if not heads:
        raise UserError(f"model.name={name}: no 1,000-way classifier layer to replace")
    head_name, old = heads[-1]
    if isinstance(old, nn.Linear):
        new: nn.Module = DroppingLinear(old.in_features, num_classes, bias=old.bias is not None)
    else:
        new = DroppingConv2d(old.in_channels, num_classes, old.kernel_size, old.stride, old.padding)
    new.drop_rate = drop_rate
    model.set_submodule(head_name, new)
    return head_name


class DroppingLinear(nn.Linear):
    """A classifier with dropout on its input in training; its weights' names a Linear's."""

    drop_rate = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.dropout(x, self.drop_rate, self.training))


class DroppingConv2d(nn.Conv2d):
    """A 1×1-convolution classifier (SqueezeNet's) with dropout on its input in training."""

    drop_rate = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.dropout(x, self.drop_rate, self.training))


class FineTuned(nn.Module):
    """A torchvision model whose backbone (all but the classifier ``head``) can be frozen for
    the first ``freeze_backbone_epochs`` epochs (:meth:`set_epoch`, which the loop calls before
    each epoch)."""

    def __init__(self, model: nn.Module, head: str, freeze_backbone_epochs: int) -> None:
        super().__init__()
        self.model = model
        self.head = head
        self.freeze_backbone_epochs = freeze_backbone_epochs
        self.frozen = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return self.model.get_submodule(self.head).parameters()

    def backbone_parameters(self) -> Iterator[nn.Parameter]:
        head = {id(p) for p in self.head_parameters()}
        return (p for p in self.model.parameters() if id(p) not in head)

    def layer_groups(self) -> list[tuple[str, list[nn.Parameter]]]:
        """Its layers for ``optim.layer_decay``: torchvision's by module order
        (models/layers.py), then the new classifier as the head."""
        head = list(self.head_parameters())
        layers = by_module_order(self.model, leave_out=head)
        return [*((layer.name, layer.parameters) for layer in layers), (f"head {self.head}", head)]

    def set_epoch(self, epoch: int) -> None:
        """Freeze or thaw the backbone for ``epoch`` (counted from 0)."""
        self.frozen = epoch < self.freeze_backbone_epochs
        for parameter in self.backbone_parameters():
            parameter.requires_grad_(not self.frozen)
        self.train(self.training)

    def train(self, mode: bool = True) -> FineTuned:
        super().train(mode)
        if self.frozen and mode:  # frozen BatchNorm keeps its statistics
            head = self.model.get_submodule(self.head)
            for module in self.model.modules():
                if module is not head:
                    module.eval()
            head.train()
        return self
