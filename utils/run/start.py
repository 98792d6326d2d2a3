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
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from data.batching.batches import Placement
from utils.checkpoint.format import check_training_checkpoint
from utils.checkpoint.load import find_checkpoints, load_checkpoint, load_latest
from utils.checkpoint.record import InputRecord
from utils.checkpoint.sharded import is_sharded
from utils.config.resolvers import in_sweep
from utils.config.secrets import recorded, redacted_argv, scrub_yaml_files, secret_values
from utils.errors import UserError
from utils.files import prepare_dir, remove_stale_temporary_files
from utils.run import sweep
from utils.run.folders import (
    check_part_name,
    claim_new,
    earlier_parts,
    missing_folders,
    not_continued,
    output_dirs,
    part_of,
)
from utils.run.resume_changes import ResumeChanges, config_changes
from utils.system import distributed
from utils.system.cpu_math import resumed_threads, say_resumed_threads
from utils.system.device import configure_device, configure_threads, resolve_device
from utils.system.seeding import configure_determinism, seed_everything, seed_rank_stream
from utils.tracking.tracker import TrackedRun

log = logging.getLogger("torchloom")


@dataclass(frozen=True)
class RunRecord:
    """What a checkpoint records besides the state: the resolved config, the command line's
    overrides, and how inputs reach the model (utils/checkpoint/record.py InputRecord)."""

    # Not named `config`: the joblib launcher sends train.py's functions with cloudpickle,
    # which takes `torch.distributed.config` for a submodule train() uses when `distributed`
    # and `config` are both among its names, and cannot pickle it.
    resolved: dict
    overrides: list[str]
    inputs: dict | None = None  # InputRecord.to_dict(): shape, normalisation, targets, task
    provenance: dict | None = None  # what produced the run (utils/run/provenance.py)

    def with_inputs(self, inputs: dict) -> RunRecord:
        return RunRecord(self.resolved, self.overrides, inputs, self.provenance)

    def with_provenance(self, provenance: dict) -> RunRecord:
        return RunRecord(self.resolved, self.overrides, self.inputs, provenance)


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
    parent: str | None = None  # a cv fold's or a refit's: the run it is part of, continued whole

    @property
    def stored_inputs(self) -> InputRecord | None:
        """The resumed checkpoint's record of its inputs and targets (None for a fresh run or
        one saved before the record existed): a resumed regression run keeps the target scale
        it started with. Without a calibration evaluate.py stored there: it fitted the
        weights it saw, and training moves them on."""
        if not self.resumed or self.resumed[1].get("inputs") is None:
            return None
        path, checkpoint = self.resumed
        return InputRecord.read(checkpoint["inputs"], path).without_calibration()

    @property
    def stored_numerics(self) -> tuple[Path, Any] | None:
        """(the resumed checkpoint, its record of the CPU settings it trained with), or None
        for a fresh run (utils/system/cpu_math.py)."""
        if not self.resumed or "numerics" not in self.resumed[1]:
            return None
        return self.resumed[0], self.resumed[1]["numerics"]

    @property
    def stored_tracking(self) -> dict | None:
        """The resumed checkpoint's tracking record (utils/tracking/tracker.py): the tracked runs it
        continues and the points it holds; None for a fresh run."""
        return None if not self.resumed else self.resumed[1].get("tracking") or {}

    @property
    def tracked(self) -> TrackedRun:
        """The run as its history names it: run name, sweep job, config."""
        config = self.record.resolved
        job = str(HydraConfig.get().job.num) if in_sweep() else None
        return TrackedRun(
            config["run_name"], job, self.run_dir, config, Path(config["paths"]["runs"])
        )

    def remove_replaced(self) -> None:
        """``overwrite=true``: remove the earlier run's files, once this run is set up (so a
        run that fails at start-up loses nothing)."""
        if self.processes.is_main:
            remove_files(self.replaced)


HYDRA_FILES = ("config", "overrides", "hydra")


def start_run(cfg: DictConfig, trainer: Any, run_dir: Path | None = None) -> RunStart:
    """``run_dir``: where the run lives (a cross-validation's fold, a refit: part of the run
    ``<run_name>/..``); None: Hydra's run dir."""
    processes = distributed.processes_from_env()
    if not processes.is_main:
        log.setLevel(logging.WARNING)
    parent = str(cfg.run_name).rsplit("/", 1)[0] if run_dir is not None else None  # a part's
    run_dir, checkpoint_dir = output_dirs(
        cfg, run_dir or Path(HydraConfig.get().runtime.output_dir)
    )
    prepare_dir(run_dir, "the run")
    if trainer.write_outputs:  # debug=fast_dev_run writes no checkpoints or TensorBoard
        made = missing_folders(checkpoint_dir)  # removed again if the start fails
        prepare_dir(checkpoint_dir, "checkpoints")
        if processes.is_main:  # another paths.runs with these checkpoints: one run at a time
            claim_new(checkpoint_dir, "run", made)
            remove_stale_temporary_files(checkpoint_dir)
    secrets = secret_values(cfg)
    overrides = redacted_argv(sweep.job_overrides(), secrets)
    record = RunRecord(recorded(cfg), overrides)
    run = RunStart(processes, run_dir, checkpoint_dir, record, parent=parent)
    if processes.is_main:  # what Hydra wrote of the command line holds no credential either
        hydra_files = [run_dir / ".hydra" / f"{name}.yaml" for name in HYDRA_FILES]
        sweep_file = [run_dir.parent / "multirun.yaml"] if in_sweep() else []
        scrub_yaml_files([*hydra_files, *sweep_file], secrets)
    run.finished, resume = sweep.job_start(run_dir, cfg.resume, run.record.overrides)
    if run.finished is not None:
        return run
    if parent is None:
        check_part_name(cfg.run_name)
    run.resumed = resume_point(resume, checkpoint_dir, asked=cfg.resume is not None)
    if not run.resumed and not trainer.shapes_only:  # a new run, never over an earlier one
        auto = resume == "auto"  # that found nothing to continue
        run.replaced = (
            history(run_dir)  # a sweep's job, in a folder of its own
            if auto and in_sweep()
            else check_new_run(run_dir, checkpoint_dir, cfg.overwrite, parent is None, auto=auto)
        )
    if run.resumed:
        check_same_run(*run.resumed, checkpoint_dir)
        run.changes = check_resumable(
            *run.resumed,
            run.record.resolved,
            cfg.resume_allow_changes,
            run.record.overrides,
            processes.world_size,
        )
        for line in run.changes.applied + run.changes.need_allow:
            log.info("resume: applying the changed %s", line)
    return run


# --- Continue, replace or refuse -------------------------------------------------------------


def resume_point(
    resume: str | None, checkpoint_dir: Path, asked: bool = True
) -> tuple[Path, dict[str, Any]] | None:
    """What ``resume=`` names: a checkpoint file, a folder of them, or ``auto`` (the run's own
    folder if it holds a readable checkpoint, else a fresh start). ``asked``: the user gave
    ``resume=`` (a sweep's job resumes by itself, and a fresh one says nothing of it)."""
    if resume is None:
        return None
    if resume == "auto":
        found = load_latest(checkpoint_dir) if checkpoint_dir.is_dir() else None
        if found is None and asked:
            log.info("resume=auto: no checkpoint in %s yet; starting fresh", checkpoint_dir)
        return found
    path = Path(resume)
    if path.is_dir() and not is_sharded(path):  # a run's folder, not a sharded checkpoint
        found = load_latest(path)
        if found is None:
            raise UserError(f"resume={resume}: no readable checkpoint in that folder")
        return found
    return path, load_checkpoint(path, whole_weights=False)


# What an earlier run of the same name leaves that is worth keeping: its checkpoints and its
# final metrics. Its history files alone (TensorBoard events, metrics.csv: a run that ended
# before its first checkpoint) are removed, so two attempts never mix in one history.
SAVED_FILES = (
    ("checkpoints", "last.pt"),
    ("checkpoints", "best.pt"),
    ("checkpoints", "last"),  # sharded checkpoints (trainer.strategy=fsdp): folders
    ("checkpoints", "best"),
    ("checkpoints", "last.old"),
    ("checkpoints", "best.old"),
    ("checkpoints", "epoch=*.pt"),
    ("run", "metrics.json"),
    ("run", "oof.csv"),  # a cross-validation's out-of-fold predictions
)
HISTORY_FILES = ("events.out.tfevents.*", "metrics.csv", ".tracking.json")


def check_new_run(
    run_dir: Path,
    checkpoint_dir: Path,
    overwrite: bool,
    parts: bool = True,
    folds: int = 0,
    auto: bool = False,
) -> list[Path]:
    """A run that does not resume starts in folders without another run: an earlier run of
    the same name is refused (it would lose its best.pt and mix two runs' TensorBoard
    events). Returns the files to remove (with ``overwrite``, the earlier run's, and with
    ``parts`` its refit and folds but the first ``folds``, which a cv's folds replace each
    in its turn) once the new run is set up, so a new run that fails at start-up loses
    nothing. ``auto``: resume=auto found nothing this command continues (the earlier run
    stopped before its first checkpoint leaves only a history, removed)."""
    folders = {"run": run_dir, "checkpoints": checkpoint_dir}
    saved = [p for where, pattern in SAVED_FILES for p in sorted(folders[where].glob(pattern))]
    earlier = earlier_parts(run_dir, checkpoint_dir, folds) if parts else []
    held = saved or [f for part in earlier for f in sorted(part.rglob("*")) if f.is_file()]
    if held and not overwrite:
        how = f"{not_continued(earlier, folds)};" if auto else "continue it with resume=auto,"
        raise UserError(
            f"{_shown_path(run_dir)} already holds a run ({_shown_path(held[0])}); {how} "
            "choose a new run_name=..., or pass overwrite=true to replace it"
        )
    return saved + earlier + history(run_dir)


def history(run_dir: Path) -> list[Path]:
    """The history files in ``run_dir`` (:data:`HISTORY_FILES`): an attempt that ended before
    its first checkpoint leaves them alone, and the next attempt starts a history of its own."""
    return [path for pattern in HISTORY_FILES for path in sorted(run_dir.glob(pattern))]


def remove_files(paths: list[Path]) -> None:
    if paths:
        log.info(
            "removing %d files of an earlier run of this name: %s",
            len(paths),
            ", ".join(p.name for p in paths),
        )
    for path in paths:
        if path.is_dir() and not path.is_symlink():  # a sharded checkpoint the run wrote
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def check_same_run(path: Path, checkpoint: dict[str, Any], checkpoint_dir: Path) -> None:
    """A resume continues the run its checkpoint belongs to: a checkpoint from elsewhere may
    continue in a folder that holds no run, or one holding the same run (a moved copy: the
    same tracking token), never over another run's checkpoints and history."""
    if path.resolve().parent == checkpoint_dir.resolve() or not find_checkpoints(checkpoint_dir):
        return
    found = load_latest(checkpoint_dir)
    theirs = (found[1].get("tracking") or {}).get("token") if found else None
    ours = (checkpoint.get("tracking") or {}).get("token")
    if not (isinstance(ours, str) and ours and ours == theirs):
        stored = (checkpoint.get("config") or {}).get("run_name")
        named = (
            f"run_name={stored} (or leave run_name out)"
            if isinstance(stored, str)
            else ("its own run_name")
        )
        if isinstance(stored, str) and (whole := part_of(stored)) and whole[0]:  # its run's
            named = f"run_name={whole[0]} resume=auto (the run its {whole[1]} is part of)"
        raise UserError(
            f"refusing to resume {path} into {_shown_path(checkpoint_dir)}: that folder holds "
            f"another run, which it would overwrite; continue the checkpoint's run with {named}, "
            f"or start a new run from its weights with init_from={path}"
        )


def check_resumable(
    path: Path,
    checkpoint: dict[str, Any],
    config: dict,
    allow: bool,
    overrides: list[str],
    world: int = 1,
) -> ResumeChanges:
    """How the new config differs from the checkpoint's (:class:`ResumeChanges`), on ``world``
    processes. Refused: a change the saved state cannot carry (the optimizer or schedule type,
    the monitor); one of the model, data, batch size or seed unless ``allow`` (a batch size
    that keeps the global batch on another number of processes is no change of the run); in a
    sweep, a checkpoint of another job."""
    check_training_checkpoint(path, checkpoint)
    if in_sweep():
        sweep.check_same_job(path, checkpoint.get("overrides", []), overrides)

    changes = config_changes(checkpoint["config"], config)
    batch = (config.get("data") or {}).get("batch_size")
    if isinstance(batch, int) and batch * world == checkpoint.get("global_batch"):
        kept = [line for line in changes.need_allow if line.startswith("data.batch_size:")]
        changes.need_allow = [line for line in changes.need_allow if line not in kept]
        changes.applied += [
            f"{line} (the same global batch on {world} process(es))" for line in kept
        ]
    if changes.never:
        raise UserError(
            f"refusing to resume {path}: {'; '.join(changes.never)} cannot change on resume "
            f"(the saved optimizer, schedule and best-so-far state depend on it); start a new "
            f"run from its weights with init_from={path}"
        )
    if changes.need_allow and not allow:
        raise UserError(
            f"refusing to resume {path}: the config changed ({'; '.join(changes.need_allow)}); "
            "give each key its checkpoint's value to resume the run as it was, or pass "
            "resume_allow_changes=true to resume anyway"
        )
    return changes


@dataclass(frozen=True)
class RunContext:
    """The process a run computes in, and so the one answer to "which process am I, what do
    I write?": its place among torchrun's processes (joined; rank 0 reports), whether it
    ``writes`` the run's files (checkpoints, TensorBoard events: rank 0 of a run with
    ``trainer.write_outputs``), its device (with fast defaults) and its share of the CPU
    threads."""

    processes: distributed.Processes
    device: torch.device
    threads: int
    writes: bool = False
    seed: int = 0  # the run's seed (a training run's)

    @classmethod
    def open(
        cls,
        processes: distributed.Processes,
        device: str,
        cpu_threads: int | None = None,
        sharded: bool = False,
    ) -> RunContext:
        """``sharded``: trainer.strategy=fsdp, which needs a process group even alone."""
        joined = distributed.join(processes, resolve_device(device), alone_too=sharded)
        configure_device(joined)
        threads = configure_threads(cpu_threads, sweep.parallel_jobs())
        log.info(
            "device: %s, %d CPU threads, %d process(es)", joined, threads, processes.world_size
        )
        return cls(processes, joined, threads, writes=processes.is_main)

    @classmethod
    def for_training(
        cls,
        processes: distributed.Processes,
        trainer: Any,
        seed: int,
        resumed: tuple[Path, Any] | None = None,
    ) -> RunContext:
        """Seeded (the model's initial weights come from ``seed``), deterministic kernels if
        asked, then opened, on the CPU threads a ``resumed`` run (its checkpoint, and the
        settings it recorded) trained on unless trainer.cpu_threads says otherwise; it writes
        files when rank 0 and ``trainer.write_outputs``."""
        seed_everything(seed)
        configure_determinism(trainer.deterministic)
        sharded = trainer.strategy == "fsdp"
        path, recorded = resumed or (None, None)
        threads = resumed_threads(recorded, trainer.cpu_threads, path)
        opened = cls.open(processes, trainer.device, threads, sharded)
        if recorded is not None:
            say_resumed_threads(recorded, opened.threads, trainer.cpu_threads)
        writes = processes.is_main and trainer.write_outputs
        return cls(processes, opened.device, opened.threads, writes, seed)

    @property
    def is_main(self) -> bool:
        return self.processes.is_main

    def seed_own_stream(self) -> None:
        """A fresh run: this process's own stream for what the forward pass draws (rank 0
        keeps the run's), once the model is built the same way on every process."""
        seed_rank_stream(self.seed, self.processes.rank)

    def placement(self, channels_last: bool = False, members: int = 1) -> Placement:
        """Where this process's batches go, for a model of ``members`` that each take rows of
        their own."""
        processes = self.processes
        world = processes.world_size
        return Placement(self.device, channels_last, processes.rank, world, members)

    def close(self) -> None:
        distributed.close_processes()
