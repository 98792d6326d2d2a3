"""Where a run lives and how it starts: its folders, and whether it is a re-run sweep's finished
job (skipped), continues a checkpoint (with which config changes), or starts afresh (never over
an earlier run of the same name).

    run = start_run(cfg, trainer)
    if run.finished is not None:
        return run.finished
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from utils import distributed, sweep
from utils.checkpoint import (
    check_new_run,
    check_resumable,
    prepare_dir,
    remove_stale_temporary_files,
    resume_point,
)
from utils.checkpointer import RunRecord
from utils.config import ResumeChanges, output_dirs, to_plain

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
