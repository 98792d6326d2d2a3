"""train.py's pre-flight: every check that needs only the config, before any data is read.

Values of the right type that make no sense (``trainer.max_epochs=-1``), keys added with ``+``
that nothing reads, builder groups bound to their builders' signatures, and the optimizer and
schedule tried on a stand-in model, so a bad value fails in one line naming its key.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from data.augmentation.mixing import Mixing
from data.batching.inputs import HINTS
from models.text import read_architecture
from utils.config.arguments import check_node
from utils.config.build import build, builder_of
from utils.config.familiar import ours
from utils.config.monitor import monitor_mode
from utils.config.resolvers import check_run_name
from utils.config.schema import CONF, TrainerConfig
from utils.errors import UserError
from utils.fit.callbacks.hooks import entries_of
from utils.fit.swa import check_swa
from utils.fit.teacher import check_settings
from utils.model.optim import build_optimizer
from utils.run.cross_validation import check_cv
from utils.run.refit import check_refit
from utils.schedulers import StepCounts
from utils.system.distributed import processes_from_env
from utils.system.sharding import check_strategy

log = logging.getLogger("torchloom")
HF_TARGET = "models.text.hf_model"


def _number(cfg: DictConfig, key: str) -> float:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{key}={value!r} is not a number; pass e.g. {key}=1")
    return value


OPTIONAL_KEYS = (
    "optim.weight_decay",
    "optim.layer_decay",
)  # may be left out of a YAML (utils/model/optim.py)
NULL_ALLOWED = (
    "trainer.max_steps",
    "trainer.val_every_n_steps",
    "trainer.cpu_threads",
    "trainer.checkpoint_every_n_steps",
    "trainer.checkpoint_every_minutes",
    "trainer.early_stopping.patience",
    "trainer.ema.decay",
    "optim.layer_decay",
)


def check_more_runs(cfg: DictConfig) -> None:
    """The runs a job trains besides its own: ``cv=K``'s folds, ``trainer.refit``'s refit."""
    if cfg.cv is not None:
        check_cv(cfg)
    check_refit(cfg)


# Each numeric key, what it must be, and the words that say so.
RULES = [
    ("trainer.accumulate_grad_batches", lambda v: v >= 1, "1 or more"),
    ("trainer.log_every_n_steps", lambda v: v >= 1, "1 or more"),
    ("trainer.val_every_n_epochs", lambda v: v >= 1, "1 or more"),
    ("trainer.max_steps", lambda v: v >= 1 and v == int(v), "a whole number, 1 or more"),
    ("trainer.val_every_n_steps", lambda v: v >= 1 and v == int(v), "1 or more, or null"),
    ("trainer.keep_top_k", lambda v: v >= 0, "0 or more"),
    ("trainer.checkpoint_every_n_steps", lambda v: v >= 1, "1 or more, or null for off"),
    ("trainer.checkpoint_every_minutes", lambda v: v > 0, "above 0, or null for off"),
    ("trainer.max_consecutive_skips", lambda v: v >= 0, "0 or more"),
    ("trainer.overfit_batches", lambda v: v >= 0, "0 or more"),
    ("trainer.profile_steps", lambda v: v >= 0, "0 or more"),
    ("trainer.cpu_threads", lambda v: v >= 1, "1 or more, or null for automatic"),
    ("trainer.early_stopping.patience", lambda v: v >= 1, "1 or more, or null for off"),
    ("trainer.early_stopping.min_delta", lambda v: v >= 0, "0 or more"),
    ("trainer.ema.decay", lambda v: 0 < v < 1, "above 0 and below 1, or null for off"),
    ("data.batch_size", lambda v: v >= 1 and v == int(v), "a whole number, 1 or more"),
    ("data.eval_batch_size", lambda v: v >= 1 and v == int(v), "a whole number, 1 or more"),
    ("optim.lr", lambda v: v > 0, "greater than 0"),
    ("optim.weight_decay", lambda v: v >= 0, "0 or more"),
    ("optim.layer_decay", lambda v: 0 < v <= 1, "above 0 and at most 1, or null for off"),
]


def check_config(cfg: DictConfig) -> TrainerConfig:
    """Reject values that have the right type but make no sense, before any data is loaded.
    Returns ``cfg.trainer`` as a plain dataclass (the loop reads it every step)."""
    epochs = checked_epochs(cfg.trainer.max_epochs)
    for key, ok, expected in RULES:
        if OmegaConf.select(cfg, key) is None and key in NULL_ALLOWED:
            continue
        if key == "data.batch_size" and cfg.data.get("batch_size") == "auto":
            continue  # fitted to the training set's size (data/batching/dataset.py)
        if key in OPTIONAL_KEYS and OmegaConf.select(cfg, key, default=...) is ...:
            continue  # left out: its documented default (utils/model/optim.py)
        value = _number(cfg, key)
        if not (math.isfinite(value) and ok(value)):  # inf passes every comparison above
            raise UserError(f"{key}={value} is out of range: it must be {expected}")
    if cfg.trainer.log_grad_norms not in ("total", "per_layer"):
        raise UserError(
            f"trainer.log_grad_norms={cfg.trainer.log_grad_norms!r} must be total or per_layer"
        )
    if cfg.tune not in (None, "lr", "batch_size"):
        raise UserError(f"tune={cfg.tune!r} is unknown; use tune=lr or tune=batch_size")
    check_more_runs(cfg)  # cv=K's folds, trainer.refit
    monitor_mode(cfg.trainer.monitor, cfg.trainer.monitor_mode)
    clip = cfg.trainer.gradient_clip_val
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise UserError(
            f"trainer.gradient_clip_val={clip} must be finite and greater than 0, or null for no "
            "clipping"
        )
    check_run_name(cfg.run_name)
    check_rounds(cfg)
    check_added_keys(cfg)
    check_groups(cfg)
    if epochs != "auto":  # else once the data says how many epochs (utils/fit/swa.py)
        check_swa(cfg.trainer.swa, epochs)  # before any data is read
    entries_of(cfg.callbacks, processes_from_env().world_size)  # conf/callbacks/, yours
    check_strategy(cfg)  # trainer.strategy, and what fsdp carries
    check_settings(cfg.distill)

    Mixing.from_augment(OmegaConf.to_container(cfg.data.get("augment") or {}, resolve=True))
    return OmegaConf.to_object(cfg.trainer)


def check_rounds(cfg: DictConfig) -> None:
    """``trainer.val_every_n_steps`` is read by a data builder that cuts its stream into
    rounds of steps (``round_steps``: data=corpus); another's would leave it unread."""
    if cfg.trainer.val_every_n_steps is None:
        return
    if "round_steps" not in inspect.signature(builder_of(cfg.data)).parameters:
        raise UserError(
            f"trainer.val_every_n_steps={cfg.trainer.val_every_n_steps} applies to a token "
            "stream (data=corpus); use trainer.val_every_n_epochs for this data"
        )


def checked_epochs(epochs: object) -> object:
    """``trainer.max_epochs``: a whole number, 0 or more, or ``auto``."""
    if epochs != "auto" and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0):
        raise UserError(
            f"trainer.max_epochs={epochs!r} must be a whole number, 0 or more, or auto (fitted "
            "to the training set's size)"
        )
    return epochs


# Keys of the plain dicts a builder reads whole (a builder's signature checks its own keys).
DICT_KEYS = {
    "data.augment": (
        "crop_padding",
        "horizontal_flip",
        "spatial",
        "mixup_alpha",
        "cutmix_alpha",
        "mix_prob",
        "mix_switch_prob",
        "mix_off_epoch",
        "random_resized_crop",
        "scale",
        "ratio",
        "color_jitter",
        "random_erasing",
        "repeats",
    ),
    "data.split": (
        "val_path",
        "test_path",
        "val",
        "test",
        "seed",
        "folds",
        "fold",
        "stratify",
        "group",
    ),
}


def check_added_keys(cfg: DictConfig) -> None:
    """``+key=value`` adds a key Hydra's schema lacks, and Hydra's own message for a typo
    says to add ``+``: a key nothing reads (``+trainer.max_epoch=3``) is refused in one line
    instead of silently ignored. A key under a group is its builder's to check."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    root = OmegaConf.get_type(cfg)  # the train schema: every top-level key that is read
    top_level = (
        [f.name for f in dataclasses.fields(root)] if dataclasses.is_dataclass(root) else None
    )
    for override in HydraConfig.get().overrides.task:
        if not override.startswith("+"):
            continue
        key = override.lstrip("+").partition("=")[0]
        if (CONF / key.replace(".", "/")).is_dir():
            continue  # a config group (+experiment=...), which Hydra checks
        top = key.split(".")[0]
        if top_level is not None and top not in top_level and not (CONF / top).is_dir():
            raise UserError(unread(override, key, top, top_level))
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        if dataclasses.is_dataclass(schema):
            known = [f.name for f in dataclasses.fields(schema)]
        elif parent in DICT_KEYS:
            known = list(DICT_KEYS[parent])
        else:
            continue
        if name not in known:
            raise UserError(unread(override, key, name, known, parent))


def unread(override: str, key: str, name: str, known: list[str], parent: str = "") -> str:
    """The line for ``+key=...`` that nothing reads: torchloom's name for a familiar one
    (Lightning's, timm's), else the closest key that is read."""
    shown = override if len(override) <= 80 else f"{override[:77]}..."
    if ours(key):
        return f"{shown}: nothing reads {key}; torchloom's is {ours(key)}"
    guess = difflib.get_close_matches(name, known, n=1)
    where = f"{parent}." if parent else ""
    hint = f"did you mean {where}{guess[0]}{key[len(where) + len(name) :]}? " if guess else ""
    return f"{shown}: nothing reads {key}; {hint}correct or remove it (conf/ shows every key that is read)"


# Arguments train.py passes to each group's builder itself (the rest come from the YAML).
SUPPLIED = {
    "model": ("input_shape", "num_classes", "num_outputs", *HINTS),  # and the kind's hints
    "data": ("targets",),  # the kind the task learns, to builders that read several kinds
    "optim": ("params",),
    "scheduler": (),  # finished with the optimizer and step counts by what it returns
    "precision": ("device",),
    "task": (),  # fitted to the data and device by the task's fitted()
}
OPTIM_KEYS_OF_OURS = (
    "decay_bias_and_norm",
    "backbone_lr_scale",
    "layer_decay",
)  # read by utils/model/optim.py, not the optimizer


def record_architecture(cfg: DictConfig) -> None:
    """model=hf: the encoder's config.json into ``model.architecture`` before the run records
    its config, so its checkpoints rebuild the model without the folder (models/text/), and a
    resume on a folder whose encoder changed is refused as a changed config."""
    node = cfg.model
    if node.get("_target_") == HF_TARGET and node.get("architecture") is None:
        with open_dict(cfg):
            node.architecture = read_architecture(node.path)
    if node.get("_target_") == HF_TARGET:
        own, used = str(node.get("tokenizer")), str(cfg.data.get("tokenizer"))
        if _tokenizer_file(used) != _tokenizer_file(own):
            log.warning(
                "warning: data.tokenizer=%s is not the encoder's own (model.tokenizer=%s): its "
                "token ids name other words than the encoder learned; leave data.tokenizer to "
                "follow model.tokenizer unless this one was made for it",
                used,
                own,
            )


def _tokenizer_file(given: str) -> Path:
    """The tokenizer.json a data.tokenizer (a file, or a folder holding one) names."""
    path = Path(given).expanduser().resolve()
    return path / "tokenizer.json" if path.is_dir() else path


def check_groups(cfg: DictConfig) -> None:
    """Bind each group node to its builder's signature and run the builder's own argument
    checks; build the optimizer and schedule on a stand-in parameter, so torch's own checks
    (``Invalid beta parameter``) fail now, naming the key, not after the data is loaded."""
    from hydra._internal.utils import _locate

    for group, supplied in SUPPLIED.items():
        node = OmegaConf.to_container(cfg[group], resolve=True)
        try:
            target = _locate(node["_target_"])
        except Exception:
            raise UserError(
                f"{group}._target_={node.get('_target_')!r} cannot be imported; check its module "
                "and name"
            ) from None
        drop_keys_of_the_option_replaced(cfg, group, target)
        node = OmegaConf.to_container(cfg[group], resolve=True)
        if group == "optim":
            node = {k: v for k, v in node.items() if k not in OPTIM_KEYS_OF_OURS}
        check_node(group, node, target, supplied)
    _try_optimizer_and_schedule(cfg)
    record_architecture(cfg)  # model=hf: read now, so the run records it


def drop_keys_of_the_option_replaced(cfg: DictConfig, group: str, target: Any) -> None:
    """``model._target_=my.Net`` on the command line replaces the builder of the group's
    option (conf/model/auto.yaml), whose own keys (``hidden_sizes``) the new builder may not
    take: those it does not take, and that this command line did not give, are dropped, said
    in one line. A key given here is kept, and checked against the builder as usual."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    given = {o.lstrip("+~").partition("=")[0] for o in HydraConfig.get().overrides.task}
    if f"{group}._target_" not in given:
        return
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    taken = {p.name for p in parameters}
    dropped = [
        key
        for key in cfg[group]
        if not str(key).startswith("_") and key not in taken and f"{group}.{key}" not in given
    ]
    if group == "optim":
        dropped = [key for key in dropped if key not in OPTIM_KEYS_OF_OURS]
    if dropped:
        with open_dict(cfg):
            for key in dropped:
                cfg[group].pop(key)
        log.info(
            "%s._target_=%s replaces the builder of the %s option, so its keys %s, which "
            "%s does not take, are dropped",
            group,
            cfg[group]["_target_"],
            group,
            ", ".join(map(str, dropped)),
            cfg[group]["_target_"].rsplit(".", 1)[-1],
        )


def _try_optimizer_and_schedule(cfg: DictConfig) -> None:
    import torch

    class StandIn(torch.nn.Module):  # a backbone and a head, as optim.backbone_lr_scale needs
        def __init__(self) -> None:
            super().__init__()
            self.backbone, self.head = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)

        def head_parameters(self):
            return self.head.parameters()

        def backbone_parameters(self):
            return self.backbone.parameters()

    stand_in = StandIn()
    try:
        optimizer = build_optimizer(stand_in, cfg.optim)
    except (ValueError, TypeError) as error:
        raise UserError(f"{_key_named(cfg.optim, str(error), 'optim')}: {error}") from None

    build(cfg.scheduler)(optimizer, StepCounts(per_epoch=10, total=100))


# Words torch's optimizer messages use for a key ("Invalid learning rate: -1").
OPTIMIZER_WORDS = {"lr": "learning rate", "eps": "epsilon", "betas": "beta"}


def _key_named(node: DictConfig, message: str, group: str) -> str:
    """The ``group.key=value`` a torch error message is about, else the group itself."""
    lowered = message.lower()
    for key in node:
        if str(key).startswith("_"):
            continue
        word = OPTIMIZER_WORDS.get(str(key), str(key).replace("_", " "))
        if word in lowered or str(key) in lowered:
            return f"{group}.{key}={OmegaConf.select(node, str(key))}"
    return f"{group} ({node.get('_target_')})"
