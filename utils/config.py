"""The typed schema of the keys the training loop reads, and the checks Hydra's types cannot say.

Values live in ``conf/train.yaml``; the dataclasses here only give types, so a wrong type
(``trainer.max_epochs=ten``) fails at composition with Hydra's message naming the key. Importing
this module registers the schema as ``train_schema`` in Hydra's ConfigStore.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from utils.errors import UserError


@dataclass
class TrainerConfig:
    max_epochs: int = MISSING
    accumulate_grad_batches: int = MISSING
    gradient_clip_val: float | None = MISSING
    device: str = MISSING
    compile: bool = MISSING
    deterministic: bool = MISSING
    log_every_n_steps: int = MISSING
    val_every_n_epochs: int = MISSING
    monitor: str = MISSING
    monitor_mode: str = MISSING


@dataclass
class PathsConfig:
    runs: str = MISSING
    checkpoints: str = MISSING


@dataclass
class TrainConfig:
    # Each group node maps to a constructor through `_target_`; its keys are checked by that
    # constructor's signature when it is instantiated.
    model: Any = MISSING
    data: Any = MISSING
    optim: Any = MISSING
    scheduler: Any = MISSING
    precision: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = MISSING
    run_name: str = MISSING
    resume: str | None = MISSING


ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def _number(cfg: DictConfig, key: str) -> float:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{key}={value!r} is not a number; pass e.g. {key}=1")
    return value


def check_config(cfg: DictConfig) -> None:
    """Reject values that have the right type but make no sense, before any data is loaded."""
    rules = [
        ("trainer.max_epochs", lambda v: v >= 0, "0 or more"),
        ("trainer.accumulate_grad_batches", lambda v: v >= 1, "1 or more"),
        ("trainer.log_every_n_steps", lambda v: v >= 1, "1 or more"),
        ("trainer.val_every_n_epochs", lambda v: v >= 1, "1 or more"),
        ("data.batch_size", lambda v: v >= 1 and v == int(v), "a whole number, 1 or more"),
        ("data.eval_batch_size", lambda v: v >= 1 and v == int(v), "a whole number, 1 or more"),
        ("optim.lr", lambda v: v > 0, "greater than 0"),
        ("optim.weight_decay", lambda v: v >= 0, "0 or more"),
    ]
    for key, ok, expected in rules:
        value = _number(cfg, key)
        if not ok(value):
            raise UserError(f"{key}={value} is out of range: it must be {expected}")
    if cfg.trainer.monitor_mode not in ("min", "max"):
        raise UserError(f"trainer.monitor_mode={cfg.trainer.monitor_mode!r} must be min or max")
    clip = cfg.trainer.gradient_clip_val
    if clip is not None and clip <= 0:
        raise UserError(
            f"trainer.gradient_clip_val={clip} must be greater than 0, or null for no clipping"
        )


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain dicts, lists, strings and numbers (safe in a checkpoint)."""
    return OmegaConf.to_container(cfg, resolve=True)
