"""The typed schema of the keys the training loop reads, and the checks Hydra's types cannot say.

Values live in ``conf/train.yaml``; the dataclasses here only give types, so a wrong type
(``trainer.max_epochs=ten``) fails at composition with Hydra's message naming the key. Importing
this module registers the schema as ``train_schema`` in Hydra's ConfigStore.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import InstantiationException
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from utils.claim import RunClaim, release_claims
from utils.errors import EXIT_USER_ERROR, UserError, print_error, user_error_in
from utils.monitor import default_monitor, monitor_mode
from utils.signals import Interrupted


@dataclass
class EarlyStoppingConfig:
    patience: int | None = MISSING
    min_delta: float = MISSING


@dataclass
class EmaConfig:
    decay: float | None = MISSING
    warmup: bool = MISSING
    evaluate: bool = MISSING


@dataclass
class SwaConfig:
    start: Any = MISSING  # an epoch count, a fraction of max_epochs, or None (utils/swa.py)
    lr: float | None = MISSING
    anneal_epochs: int = MISSING


@dataclass
class TrainerConfig:
    max_epochs: int = MISSING
    accumulate_grad_batches: int = MISSING
    gradient_clip_val: float | None = MISSING
    device: str = MISSING
    compile: bool = MISSING
    compile_mode: str = MISSING
    channels_last: bool | None = MISSING
    deterministic: bool = MISSING
    log_every_n_steps: int = MISSING
    val_every_n_epochs: int = MISSING
    monitor: str = MISSING
    monitor_mode: str = MISSING
    keep_top_k: int = MISSING
    cpu_threads: int | None = MISSING
    sync_batchnorm: bool = MISSING
    nonfinite: str = MISSING
    log_grad_norms: str = MISSING
    limit_train_batches: Any = MISSING
    limit_eval_batches: Any = MISSING
    overfit_batches: int = MISSING
    overfit_loss: float = MISSING
    detect_anomaly: bool = MISSING
    profile_steps: int = MISSING
    shapes_only: bool = MISSING
    write_outputs: bool = MISSING
    max_consecutive_skips: int = MISSING
    silence_guards: list[str] = MISSING
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    swa: SwaConfig = field(default_factory=SwaConfig)


@dataclass
class DistillConfig:
    teacher: str | None = MISSING  # a checkpoint file or run folder (utils/teacher.py)
    weights: str = MISSING
    temperature: float = MISSING
    alpha: float = MISSING


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
    task: Any = MISSING
    logger: Any = None  # one node per chosen backend (conf/logger/)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = MISSING
    run_name: str = MISSING
    resume: str | None = MISSING
    resume_allow_changes: bool = MISSING
    overwrite: bool = MISSING
    init_from: str | None = MISSING
    tune: str | None = MISSING
    cv: Any = MISSING  # cv=K: every fold of a K-fold cross-validation (utils/cross_validation.py)


ConfigStore.instance().store(name="train_schema", node=TrainConfig)


@dataclass
class DataOverrides:
    """Where the same data lives and how it is read; null keeps the checkpoint's value."""

    root: str | None = MISSING
    path: str | None = MISSING
    download: bool | None = MISSING
    num_workers: int | None = MISSING
    batch_size: int | None = MISSING
    cache: str | None = MISSING


@dataclass
class EvaluateConfig:
    ckpt: Any = MISSING
    split: str = MISSING
    config: str | None = MISSING
    weights: str = MISSING
    average: str | None = MISSING
    calibrate: str | None = MISSING
    threshold: str | None = MISSING
    export: str | None = MISSING
    onnx_exporter: str = MISSING
    device: str = MISSING
    precision: str = MISSING
    data: DataOverrides = field(default_factory=DataOverrides)
    runs: str = MISSING
    logger: Any = None  # logger=mlflow (conf/logger/)


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


@dataclass
class PredictConfig:
    ckpt: Any = MISSING
    input: Any = MISSING
    out: str = MISSING
    topk: int = MISSING
    threshold: Any = MISSING
    unseen: str = MISSING
    weights: str = MISSING
    device: str = MISSING
    batch_size: int = MISSING
    runs: str = MISSING


ConfigStore.instance().store(name="predict_schema", node=PredictConfig)


def resumed_run_name(resume: str | None, checkpoints_root: str, fresh: str) -> str:
    """``run_name`` when it is not given: resuming ``checkpoints/<name>/last.pt`` continues run
    ``<name>`` (same run dir, same checkpoint folder); otherwise ``fresh`` (a timestamp)."""
    if resume and resume != "auto":
        path = Path(resume).resolve()
        folder = path if path.is_dir() else path.parent
        try:
            return str(folder.relative_to(Path(checkpoints_root).resolve()))
        except ValueError:
            pass
    return fresh


OmegaConf.register_new_resolver("resumed_run_name", resumed_run_name, replace=True)

# Set by a sweep for its jobs (utils/sweep.py), which may compose their config in other
# processes and at other times, so that they all share one run name.
RUN_TIMESTAMP_ENV = "TORCHLOOM_RUN_TIMESTAMP"


def run_timestamp(pattern: str) -> str:
    """The run's start time, shared by every process of one run: a sweep's jobs take it from
    the environment; torchrun's ranks on one machine from their launcher's start time;
    ranks of a multi-machine run use the rendezvous id (``--rdzv-id``) when one was given."""
    if os.environ.get(RUN_TIMESTAMP_ENV):
        return os.environ[RUN_TIMESTAMP_ENV]
    if "LOCAL_RANK" in os.environ:  # under torchrun
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        machines = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        if machines > 1 and run_id != "none":
            return run_id
        started = _process_start_time(os.getppid())
        if started is not None:
            return datetime.fromtimestamp(started).strftime(pattern)
    return datetime.now().strftime(pattern)


def _process_start_time(pid: int) -> float | None:
    """Seconds since the epoch at which process ``pid`` started (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


OmegaConf.register_new_resolver("run_timestamp", run_timestamp, use_cache=True, replace=True)

_fresh_folders: dict[str, str] = {}  # this command's folder, however often Hydra resolves it


def fresh_folder(parent: str, name: str) -> str:
    """``<parent>/<name>``, or ``<name>_2``, ``_3``, ... : a folder this process created itself
    (an exclusive ``mkdir``), so two evaluate.py or predict.py started in the same second never
    share one. torchrun's ranks share their launcher's (one rank's folder for the run)."""
    key = f"{parent}/{name}"
    if "LOCAL_RANK" in os.environ or key in _fresh_folders:
        return _fresh_folders.get(key, key)
    for attempt in range(1, 10_000):
        folder = Path(parent) / (name if attempt == 1 else f"{name}_{attempt}")
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError:
            break  # an unwritable parent: Hydra's own mkdir names it
        _fresh_folders[key] = str(folder)
        return str(folder)
    return key


def forget_fresh_folders() -> None:
    """The command has ended (an in-process caller may run another one)."""
    _fresh_folders.clear()


OmegaConf.register_new_resolver("fresh_folder", fresh_folder, replace=True)
OmegaConf.register_new_resolver("default_monitor", default_monitor, replace=True)


def _number(cfg: DictConfig, key: str) -> float:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{key}={value!r} is not a number; pass e.g. {key}=1")
    return value


OPTIONAL_KEYS = (
    "optim.weight_decay",
    "optim.layer_decay",
)  # may be left out of a YAML (utils/optim.py)
NULL_ALLOWED = (
    "trainer.cpu_threads",
    "trainer.early_stopping.patience",
    "trainer.ema.decay",
    "optim.layer_decay",
)


def check_config(cfg: DictConfig) -> TrainerConfig:
    """Reject values that have the right type but make no sense, before any data is loaded.
    Returns ``cfg.trainer`` as a plain dataclass (the loop reads it every step)."""
    rules = [
        ("trainer.max_epochs", lambda v: v >= 0, "0 or more"),
        ("trainer.accumulate_grad_batches", lambda v: v >= 1, "1 or more"),
        ("trainer.log_every_n_steps", lambda v: v >= 1, "1 or more"),
        ("trainer.val_every_n_epochs", lambda v: v >= 1, "1 or more"),
        ("trainer.keep_top_k", lambda v: v >= 0, "0 or more"),
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
    for key, ok, expected in rules:
        if OmegaConf.select(cfg, key) is None and key in NULL_ALLOWED:
            continue
        if key in OPTIONAL_KEYS and OmegaConf.select(cfg, key, default=...) is ...:
            continue  # left out: its documented default (utils/optim.py)
        value = _number(cfg, key)
        if not (math.isfinite(value) and ok(value)):  # inf passes every comparison above
            raise UserError(f"{key}={value} is out of range: it must be {expected}")
    if cfg.trainer.log_grad_norms not in ("total", "per_layer"):
        raise UserError(
            f"trainer.log_grad_norms={cfg.trainer.log_grad_norms!r} must be total or per_layer"
        )
    if cfg.tune not in (None, "lr", "batch_size"):
        raise UserError(f"tune={cfg.tune!r} is unknown; use tune=lr or tune=batch_size")
    if cfg.cv is not None:
        from utils.cross_validation import check_cv

        check_cv(cfg)
    monitor_mode(cfg.trainer.monitor, cfg.trainer.monitor_mode)
    clip = cfg.trainer.gradient_clip_val
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise UserError(
            f"trainer.gradient_clip_val={clip} must be finite and greater than 0, or null for no "
            "clipping"
        )
    check_run_name(cfg.run_name)
    check_added_keys(cfg)
    check_groups(cfg)
    from utils.swa import check_swa
    from utils.teacher import check_settings

    check_swa(cfg.trainer.swa, cfg.trainer.max_epochs)  # before any data is read
    check_settings(cfg.distill)
    from data.mixing import Mixing

    Mixing.from_augment(OmegaConf.to_container(cfg.data.get("augment") or {}, resolve=True))
    return OmegaConf.to_object(cfg.trainer)


CONF = Path(__file__).resolve().parents[1] / "conf"
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
    for override in HydraConfig.get().overrides.task:
        if not override.startswith("+"):
            continue
        key = override.lstrip("+").partition("=")[0]
        if (CONF / key.replace(".", "/")).is_dir():
            continue  # a config group (+experiment=...), which Hydra checks
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
            guess = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {parent + '.' if parent else ''}{guess[0]}? " if guess else ""
            shown = override if len(override) <= 80 else f"{override[:77]}..."
            raise UserError(
                f"{shown}: nothing reads {key}; {hint}correct or remove it "
                "(conf/ shows every key that is read)"
            )


# Arguments train.py passes to each group's builder itself (the rest come from the YAML).
SUPPLIED = {
    "model": ("input_shape", "num_classes", "num_outputs"),
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
)  # read by utils/optim.py, not the optimizer


def check_groups(cfg: DictConfig) -> None:
    """Bind each group node to its builder's signature and run the builder's own argument
    checks; build the optimizer and schedule on a stand-in parameter, so torch's own checks
    (``Invalid beta parameter``) fail now, naming the key, not after the data is loaded."""
    from hydra._internal.utils import _locate

    from utils.arguments import check_node

    for group, supplied in SUPPLIED.items():
        node = OmegaConf.to_container(cfg[group], resolve=True)
        try:
            target = _locate(node["_target_"])
        except Exception:
            raise UserError(
                f"{group}._target_={node.get('_target_')!r} cannot be imported; check its module "
                "and name"
            ) from None
        if group == "optim":
            node = {k: v for k, v in node.items() if k not in OPTIM_KEYS_OF_OURS}
        check_node(group, node, target, supplied)
    _try_optimizer_and_schedule(cfg)


def _try_optimizer_and_schedule(cfg: DictConfig) -> None:
    import torch

    from utils.optim import build_optimizer

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
    from utils.schedulers import StepCounts

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


def check_run_name(name: str) -> str:
    """A run name is a relative path of plain segments (``exp1``, ``grid/3``): the run dir and
    the checkpoint folder stay inside ``paths.runs`` and ``paths.checkpoints``."""
    segments = str(name).split("/")
    if (
        not str(name)
        or any(segment in ("", ".", "..") for segment in segments)
        or any(bad in str(name) for bad in ("\\", "\0"))
    ):
        raise UserError(
            f"run_name={name!r} must be a relative path of plain names (like exp1 or grid/3), "
            "with no '..', '.', empty or absolute part; choose another run_name"
        )
    return str(name)


OmegaConf.register_new_resolver("checked_run_name", check_run_name, replace=True)
OmegaConf.register_new_resolver(
    "monitor_mode", lambda monitor, mode: monitor_mode(monitor, mode), replace=True
)


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain dicts, lists, strings and numbers (safe in a checkpoint)."""
    return OmegaConf.to_container(cfg, resolve=True)


def check_writable(path: Path, what: str) -> None:
    """``path`` can be created: its nearest existing ancestor is a writable folder."""
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {what} to {path}: {ancestor} is not a writable folder")


class CheckOutputDir(Callback):
    """Hydra creates the run dir before our code runs; check it first, so an unwritable
    ``paths.runs`` is one line naming the path, not a traceback; then claim it (utils/claim.py),
    before Hydra writes the run's ``.hydra/`` files into it: a run's folder, or a sweep's for
    the whole sweep (its jobs' folders are inside)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir", "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir", "sweep")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claims()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claims()

    @staticmethod
    def _check(config: DictConfig, key: str, what: str) -> None:
        try:
            directory = OmegaConf.select(config, key)  # resolving it checks run_name
            check_writable(Path(directory), "the run")
            if os.environ.get("RANK", "0") == "0":  # torchrun's other ranks are the same run
                RunClaim.take(Path(directory), what)
        except Exception as error:
            cause = user_error_in(error)
            if cause is None:
                raise
            print_error(cause)
            sys.exit(EXIT_USER_ERROR)


def output_dirs(cfg: DictConfig, run_dir: Path) -> tuple[Path, Path]:
    """The run dir Hydra made, and its checkpoint folder at the same place under
    ``paths.checkpoints`` (``<run_name>/`` for a run, ``<run_name>/<job>/`` in a sweep)."""
    try:
        relative = run_dir.resolve().relative_to(Path(cfg.paths.runs).resolve())
    except ValueError:  # hydra.run.dir was pointed outside paths.runs
        relative = Path(check_run_name(cfg.run_name))
    check_run_name(relative.as_posix())
    return run_dir, Path(cfg.paths.checkpoints) / relative


def build(node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, but a constructor refusing its config values reaches the user
    as one line (Hydra would wrap it in a multi-line InstantiationException)."""
    try:
        return instantiate(node, **kwargs)
    except MissingMandatoryValue as error:
        key = error.full_key or "a value"
        raise UserError(f"{key} is required (it is ??? in the config); pass {key}=...") from None
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
