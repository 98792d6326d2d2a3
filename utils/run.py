"""Where a run lives and how it starts: its folders, and whether it is a re-run sweep's finished
job (skipped), continues a checkpoint (with which config changes), or starts afresh (never over
an earlier run of the same name); then the process it runs in (:class:`RunContext`: rank,
device, threads), shared by train.py and evaluate.py.

    run = start_run(cfg, trainer)
    if run.finished is not None:
        return run.finished
    context = RunContext.for_training(run.processes, trainer, cfg.seed)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from data.batches import Placement
from utils import distributed, sweep
from utils.checkpoint import (
    check_new_run,
    check_resumable,
    prepare_dir,
    remove_files,
    remove_stale_temporary_files,
    resume_point,
)
from utils.checkpointer import RunRecord
from utils.config import output_dirs, to_plain
from utils.device import configure_device, configure_threads, resolve_device
from utils.resume_changes import ResumeChanges
from utils.seeding import configure_determinism, seed_everything

log = logging.getLogger("torchloom")


@dataclass
class RunStart:
    processes: distributed.Processes  # under torchrun: this rank; rank 0 alone reports
    run_dir: Path
    checkpoint_dir: Path
    record: RunRecord  # the resolved config and the command line's overrides
    resumed: tuple[Path, dict[str, Any]] | None = None  # the checkpoint to continue
    changes: ResumeChanges | None = None  # how the config differs from the checkpoint's
    replaced: list[Path] = field(default_factory=list)  # overwrite=true: remove once set up
    finished: float | None = None  # a re-run sweep's finished job: its value; skip it

    @property
    def stored_inputs(self) -> dict | None:
        """The resumed checkpoint's record of its inputs and targets (None for a fresh run):
        a resumed regression run keeps the target scale it started with."""
        inputs = self.resumed[1].get("inputs") if self.resumed else None
        return inputs if isinstance(inputs, dict) else None

    def remove_replaced(self) -> None:
        """``overwrite=true``: remove the earlier run's files, once this run is set up (so a
        run that fails at start-up loses nothing)."""
        if self.processes.is_main:
            remove_files(self.replaced)


def start_run(cfg: DictConfig, trainer: Any) -> RunStart:
    processes = distributed.processes_from_env()
    if not processes.is_main:
        log.setLevel(logging.WARNING)
    run_dir, checkpoint_dir = output_dirs(cfg, Path(HydraConfig.get().runtime.output_dir))
    prepare_dir(run_dir, "the run")
    if trainer.write_outputs:  # debug=fast_dev_run writes no checkpoints or TensorBoard
        prepare_dir(checkpoint_dir, "checkpoints")
        if processes.is_main:
            remove_stale_temporary_files(checkpoint_dir)
    run = RunStart(
        processes, run_dir, checkpoint_dir, RunRecord(to_plain(cfg), sweep.job_overrides())
    )
    run.finished, resume = sweep.job_start(run_dir, cfg.resume, run.record.overrides)
    if run.finished is not None:
        return run
    if resume is None and not trainer.shapes_only:  # never silently over an earlier run
        run.replaced = check_new_run(run_dir, checkpoint_dir, cfg.overwrite)
    run.resumed = resume_point(resume, checkpoint_dir)
    if run.resumed:
        run.changes = check_resumable(*run.resumed, run.record.resolved, cfg.resume_allow_changes,
                                      run.record.overrides)  # fmt: skip
        for line in run.changes.applied + run.changes.need_allow:
            log.info("resume: applying the changed %s", line)
    return run


@dataclass(frozen=True)
class RunContext:
    """The process a run computes in: its place among torchrun's processes (joined), its
    device (with fast defaults), and its share of the CPU threads."""

    processes: distributed.Processes
    device: torch.device
    threads: int

    @classmethod
    def open(
        cls, processes: distributed.Processes, device: str, cpu_threads: int | None = None
    ) -> RunContext:
        joined = distributed.join(processes, resolve_device(device))
        configure_device(joined)
        threads = configure_threads(cpu_threads, sweep.parallel_jobs())
        log.info("device: %s, %d CPU threads, %d process(es)", joined, threads,
                 processes.world_size)  # fmt: skip
        return cls(processes, joined, threads)

    @classmethod
    def for_training(cls, processes: distributed.Processes, trainer: Any, seed: int) -> RunContext:
        """Seeded (the model's initial weights come from ``seed``), deterministic kernels if
        asked, then opened."""
        seed_everything(seed)
        configure_determinism(trainer.deterministic)
        return cls.open(processes, trainer.device, trainer.cpu_threads)

    @property
    def is_main(self) -> bool:
        return self.processes.is_main

    def placement(self, channels_last: bool = False) -> Placement:
        """Where this process's batches go."""
        processes = self.processes
        return Placement(self.device, channels_last, processes.rank, processes.world_size)

    def close(self) -> None:
        distributed.close_processes()
