"""Any timm architecture by name, fitted to the dataset (``model=timm``; the ``timm`` extra).

    python train.py model=timm model.name=convnext_nano data=imagefolder data.root=flowers
    python train.py model=timm model.name=resnet50 model.pretrained=resnet50.safetensors \\
        model.drop_path_rate=0.05 optim.layer_decay=0.75

``name`` goes to ``timm.create_model`` with the dataset's channels (``in_chans``) and classes
(``num_classes``), ``drop_rate`` (dropout before the classifier) and ``drop_path_rate``
(stochastic depth). ``pretrained``: null (random), or a local file of the model's weights under
timm's own key names — a ``.safetensors`` file (as timm and the Hugging Face hub store them) or
a ``.pth``/``.bin`` state dict (read with ``weights_only=True``). The classifier is left out when
its number of classes differs (a fresh one is trained), and the first convolution is refitted
to another number of channels as timm does it (``adapt_input_conv``). Nothing is downloaded
during a run.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from utils.config.arguments import DROPOUT, checked
from utils.errors import UserError
from utils.intact import check_intact

EXTRA = 'pip install -e ".[timm]"'


def _timm():
    try:
        import timm
    except ImportError:
        raise UserError(f"model=timm needs timm: {EXTRA}") from None
    return timm


@checked("model", drop_rate=DROPOUT, drop_path_rate=DROPOUT)
def timm_model(
    input_shape: Sequence[int],
    num_classes: int,
    name: str,
    pretrained: str | None,
    drop_rate: float,
    drop_path_rate: float,
) -> nn.Module:
    timm = _timm()
    if not timm.is_model(name):
        names = timm.list_models()
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
        hint = f"close: {', '.join(close)}" if close else "timm.list_models() lists them"
        raise UserError(f"model.name={name!r} is not a timm model ({hint})")
    model = timm.create_model(
        name,
        pretrained=False,
        num_classes=num_classes,
        in_chans=input_shape[0],
        drop_rate=drop_rate,
        drop_path_rate=drop_path_rate,
    )
    if pretrained is not None:
        load_timm_weights(model, weights_file(pretrained), input_shape[0])
    return model


def weights_file(given: str) -> dict[str, torch.Tensor]:
    """The state dict in the local file ``given``, read as data: safetensors, or a torch file
    loaded with ``weights_only=True`` (a timm checkpoint's ``state_dict`` entry too)."""
    path = Path(given).expanduser()
    if not path.is_file():
        raise UserError(
            f"model.pretrained={given}: no such file; runs never download: save the weights "
            "where there is a network (timm.create_model(name, pretrained=True) and "
            "torch.save(model.state_dict(), ...)) and give that file"
        )
    if path.suffix != ".safetensors":
        check_intact(path, f"save it again (model.pretrained={given})")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except ImportError:
        raise UserError(
            f'model.pretrained={given}: .safetensors needs pip install -e ".[export]"'
        ) from None
    except Exception:
        raise UserError(f"model.pretrained={given}: not a readable state dict") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # timm's own training checkpoints
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise UserError(f"model.pretrained={given}: expected a state dict of named tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_timm_weights(model: nn.Module, state: dict, channels: int) -> None:
    """``state`` (timm's key names) into ``model``: the classifier left out when its shape
    differs, the first convolution adapted to ``channels``; any other mismatch is one line."""
    from timm.models import adapt_input_conv

    config = getattr(model, "pretrained_cfg", None) or {}
    first = config.get("first_conv")
    first = [first] if isinstance(first, str) else list(first or [])
    own = model.state_dict()
    for conv in first:
        key = f"{conv}.weight"
        if key in state and key in own and state[key].shape[1] != channels:
            state[key] = adapt_input_conv(channels, state[key])
    heads = config.get("classifier")
    heads = [heads] if isinstance(heads, str) else list(heads or [])
    fresh = []
    for head in heads:
        for suffix in ("weight", "bias"):
            key = f"{head}.{suffix}"
            if key in state and key in own and state[key].shape != own[key].shape:
                del state[key]
                fresh.append(key)
    missing = [k for k in own if k not in state and k not in fresh]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in state if k in own and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        first_bad = (missing or unexpected or wrong)[0]
        raise UserError(
            f"model.pretrained: the weights do not fit this {type(model).__name__} "
            f"({len(missing)} missing, {len(unexpected)} unexpected, {len(wrong)} of another "
            f"shape, e.g. {first_bad!r}); are they of model.name's architecture?"
        )
    model.load_state_dict(state, strict=False)
