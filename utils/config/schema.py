"""The typed schema of the keys the commands read (train, evaluate, predict).

Values live in ``conf/*.yaml``; the dataclasses here only give types, so a wrong type
(``trainer.max_epochs=ten``) fails at composition with Hydra's message naming the key. Importing
this module registers ``train_schema``, ``evaluate_schema`` and ``predict_schema`` in Hydra's
ConfigStore.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# The YAML files these types describe: conf/ at the project's root.
CONF = Path(__file__).resolve().parents[2] / "conf"


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
    start: Any = MISSING  # an epoch count, a fraction of max_epochs, or None (utils/fit/swa.py)
    lr: float | None = MISSING
    anneal_epochs: int = MISSING


@dataclass
class FsdpConfig:
    blocks: Any = MISSING  # auto, or module class names
    reshard_after_forward: bool = MISSING
    cpu_offload: bool = MISSING
    consolidate: bool = MISSING


@dataclass
class TrainerConfig:
    max_epochs: Any = MISSING  # a count, or auto (utils/schedulers.py epochs_for)
    max_steps: int | None = None  # a run's length in optimizer steps (utils/model/guards.py)
    val_every_n_steps: int | None = None  # data=corpus: a round of this many steps an epoch
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
    checkpoint_every_n_steps: int | None = MISSING
    checkpoint_every_minutes: float | None = MISSING
    cpu_threads: int | None = MISSING
    sync_batchnorm: bool = MISSING
    strategy: str = MISSING
    activation_checkpointing: bool = MISSING
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
    refit: Any = MISSING  # auto, true or false (utils/run/refit.py)
    train_on_val: bool = MISSING
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    swa: SwaConfig = field(default_factory=SwaConfig)
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)


@dataclass
class DistillConfig:
    teacher: str | None = MISSING  # a checkpoint file or run folder (utils/fit/teacher.py)
    weights: str = MISSING
    temperature: float = MISSING
    alpha: float = MISSING


@dataclass
class ProvenanceConfig:
    save_diff: bool = MISSING


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
    callbacks: Any = field(default_factory=dict)  # name → a callback entry (utils/fit/callbacks/)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    provenance: ProvenanceConfig = field(default_factory=ProvenanceConfig)
    seed: int = MISSING
    run_name: str = MISSING
    resume: str | None = MISSING
    resume_allow_changes: bool = MISSING
    overwrite: bool = MISSING
    init_from: str | None = MISSING
    tune: str | None = MISSING
    report: bool = MISSING  # runs/<run>/report.html (utils/report/)
    baselines: bool = (
        MISSING  # scikit-learn's models beside the run (utils/evaluation/baselines.py)
    )
    cv: Any = (
        MISSING  # cv=K: every fold of a K-fold cross-validation (utils/run/cross_validation.py)
    )


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
    cache_dir: str | None = MISSING
    cache_max_gb: float | None = MISSING
    shard_cache_gb: Any = MISSING
    shard_cache_dir: str | None = MISSING
    tokenizer_cache: str | None = MISSING


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
    report: bool = MISSING  # report.html beside metrics.json (utils/report/evaluation.py)
    data: DataOverrides = field(default_factory=DataOverrides)
    runs: str = MISSING
    logger: Any = None  # logger=mlflow (conf/logger/)


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


@dataclass
class PredictConfig:
    ckpt: Any = MISSING
    input: Any = MISSING
    out: str | None = MISSING
    topk: int = MISSING
    threshold: Any = MISSING
    unseen: str = MISSING
    weights: str = MISSING
    device: str = MISSING
    batch_size: int = MISSING
    runs: str = MISSING
    prompt: str | None = None  # a language model's prompt (utils/evaluation/sampling.py)
    prompts: str | None = None  # a file of prompts, one a line
    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = 200
    seed: int = 1337


ConfigStore.instance().store(name="predict_schema", node=PredictConfig)


@dataclass
class ShardConfig:
    data: Any = MISSING
    task: Any = MISSING
    out: str = MISSING
    rows_per_group: int = MISSING
    rows_per_file: int = MISSING
    tokens_per_row: int = MISSING
    images: str = MISSING


ConfigStore.instance().store(name="shard_schema", node=ShardConfig)
