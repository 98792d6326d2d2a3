"""Building objects from config nodes, and the config as plain data.

:func:`build` is Hydra's ``instantiate`` with a constructor's refusal of its values reaching the
user as one line; :func:`builder_of` the builder a node names, for what it declares; :func:`flatten` gives the config as the flat keys that trackers and tables hold (the plain
containers a run records are utils/config/secrets.py's :func:`recorded`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from utils.errors import UserError, required
from utils.system.signals import Interrupted


def build(node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, but a constructor refusing its config values reaches the user
    as one line (Hydra would wrap it in a multi-line InstantiationException)."""
    try:
        return instantiate(node, **kwargs)
    except MissingMandatoryValue as error:
        raise required(error.full_key or "a value") from None
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, UserError | Interrupted):  # bad input; a stop while building
            raise cause from None
        target = OmegaConf.select(node, "_target_") if isinstance(node, DictConfig) else node
        if isinstance(cause, AttributeError) and (
            "before Module.__init__() call" in str(cause) or "_modules" in str(cause)
        ):
            raise UserError(
                f"{target}: a module's __init__ assigned a layer or parameter before calling "
                "super().__init__() (torch says: "
                f"{cause}); make super().__init__() the first line of that __init__"
            ) from None
        if isinstance(cause, (TypeError, ValueError)):
            raise UserError(f"{target}: {cause}; check its keys in the config") from None
        raise


def builder_of(node: Any) -> Any:
    """The builder a config node's ``_target_`` names (imported: the user's own config, never a
    stored one), to read what it declares (the kinds of target it reads, what it can do)."""
    from hydra._internal.utils import _locate

    return _locate(str(node["_target_"]))


def flatten(config: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 0.1}}`` → ``{"optim.lr": 0.1}``; values other than numbers, strings
    and booleans become strings (what TensorBoard's hparams accept)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat
