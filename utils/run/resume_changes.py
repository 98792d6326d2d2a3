"""What a resume may change: how the new config differs from a checkpoint's, each difference
classified as applied, refused unless ``resume_allow_changes=true``, or refused always (the
docs/resuming.md lists them)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from data.augmentation.images import IMAGE_AUGMENT_OFF
from data.augmentation.mixing import MIXING_OFF
from models.auto import TABLE_KEYS_BEFORE
from utils.config.build import flatten
from utils.config.monitor import monitor_mode
from utils.errors import UserError
from utils.text import brief

# What a resume may change. Every key of the new config that differs from the checkpoint's
# is one of these (docs/resuming.md lists them):
# refused unless resume_allow_changes=true: the weights or the data order would mean another run;
CHANGES_NEED_ALLOW = (
    "model",
    "data",
    "trainer.accumulate_grad_batches",
    "trainer.train_on_val",
    "seed",
)
# refused always: the saved optimizer, schedule or best-so-far state cannot carry over;
CHANGES_NEVER = (
    "optim._target_",
    "optim.decay_bias_and_norm",
    "scheduler._target_",
    "trainer.monitor",
    "trainer.monitor_mode",
    "task._target_",
    "task.standardize_targets",
    "optim.layer_decay",
    "trainer.swa.start",
    "trainer.swa.lr",
    "trainer.swa.anneal_epochs",
    "distill.weights",
)
# data keys that only say where the same data lives or how fast it is read;
DATA_KEYS_FREE_TO_CHANGE = (
    "root",
    "download",
    "num_workers",
    "eval_batch_size",
    "path",
    "cache",
    "cache_max_gb",
    "cache_dir",
)
# everything else is applied exactly from the resume point on and reported. Of those, these
# rebuild the optimizer's hyperparameters and the LR schedule at the current step.
CHANGES_RESCHEDULE = ("optim", "scheduler", "trainer.max_epochs", "data.batch_size")
# Keys that say how to start this invocation, not what the run is.
INVOCATION_KEYS = (
    "resume",
    "resume_allow_changes",
    "overwrite",
    "init_from",
    "tune",
    "run_name",
    "logger",
    "cv",
    "report",  # what is drawn and fitted beside the run at its end (report.html, baselines)
    "baselines",
)


@dataclass
class ResumeChanges:
    """How the new config differs from a checkpoint's, as ``key: stored -> current`` lines."""

    never: list[str] = field(default_factory=list)
    need_allow: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)

    @property
    def reschedule(self) -> bool:
        return any(line.startswith(CHANGES_RESCHEDULE) for line in self.applied + self.need_allow)


def _added_later() -> dict[str, Any]:
    """Keys later versions added, with the value that does what the versions before them did:
    a checkpoint stored without them compares as holding these."""

    return {
        **{f"data.augment.{key}": off for key, off in MIXING_OFF.items()},
        **{f"data.augment.{key}": off for key, off in IMAGE_AUGMENT_OFF.items()},
        "data.cache_size": None,
        "data.crop_pct": 1.0,
        "task._target_": "utils.tasks.classification",
        "task.label_smoothing": 0.0,
        "task.loss": "ce",
        "task.class_weights": None,
        "trainer.ema.decay": None,
        "trainer.ema.warmup": True,
        "trainer.ema.evaluate": True,
        "trainer.early_stopping.patience": None,
        "trainer.early_stopping.min_delta": 0.0,
        "optim.layer_decay": None,
        "trainer.swa.start": None,
        "trainer.swa.lr": None,
        "trainer.swa.anneal_epochs": 1,
        "scheduler.warmup_epochs": 0,
        "model.drop_path_rate": 0.0,
        "model.drop_rate": 0.0,
        # model=auto's MLP for a table before the tabular model, whose members shared each
        # batch, embedded every 0/1 column and had the defaults' sizes
        **{f"model.{key}": before for key, before in TABLE_KEYS_BEFORE.items()},
        "trainer.refit": False,  # no run refitted
        "trainer.train_on_val": False,
        "distill.teacher": None,
        "distill.weights": "auto",
        "distill.temperature": 4.0,
        "distill.alpha": 0.5,
        "data.windows": "passes",  # a corpus's windows: each pass's permuted
    }


LONGEST = 120  # characters of a value a change's line shows: its start and end beyond


def config_changes(stored: dict, current: dict) -> ResumeChanges:
    stored_flat, current_flat = _comparable(stored), _comparable(current)
    for key, before in _added_later().items():
        if key in current_flat:  # compared as flatten shows it
            stored_flat.setdefault(key, flatten({key: before})[key])
    changes = ResumeChanges()
    for key in sorted(set(stored_flat) | set(current_flat)):
        if key.split(".")[0] in INVOCATION_KEYS:
            continue
        before, after = stored_flat.get(key, "<absent>"), current_flat.get(key, "<absent>")
        if before == after:
            continue
        line = f"{key}: {brief(str(before), LONGEST)} -> {brief(str(after), LONGEST)}"
        free_data = key.startswith("data.") and key.split(".")[1] in DATA_KEYS_FREE_TO_CHANGE
        if key in CHANGES_NEVER:
            changes.never.append(line)
        elif _under(key, CHANGES_NEED_ALLOW) and not free_data:
            changes.need_allow.append(line)
        else:
            changes.applied.append(line)
    return changes


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in prefixes)


def _comparable(config: dict) -> dict[str, Any]:
    """Flattened, with the monitor's direction resolved (``auto`` and ``max`` for an accuracy
    are the same setting). Hydra's own directives other than ``_target_`` say how a node is
    instantiated, not what the run is (older checkpoints hold ``scheduler._partial_``)."""
    flat = {
        key: value
        for key, value in flatten(config).items()
        if not key.rsplit(".", 1)[-1].startswith("_") or key.endswith("._target_")
    }
    monitor, mode = flat.get("trainer.monitor"), flat.get("trainer.monitor_mode")
    if monitor is not None and mode is not None:
        with contextlib.suppress(UserError):  # a stored contradiction compares as written
            flat["trainer.monitor_mode"] = monitor_mode(monitor, mode)
    return flat
