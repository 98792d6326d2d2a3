"""What a run saves, when and where, and how it continues from a checkpoint: one owner,
registered once with the parts it saves (timm's ``CheckpointSaver``, torchtitan's
``CheckpointManager``); train.py then calls ``start``, ``save_epoch``, ``stop_here`` and
``load_best``. Which top-k copies stay is :mod:`utils.fit.top_k`'s; the file mechanisms (atomic
writes, safe loading) are in :mod:`utils.checkpoint`. The callbacks hear of each file written
(``on_checkpoint``), and their state goes into each.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from utils.checkpoint.format import legacy_loss_sums, training_checkpoint
from utils.checkpoint.load import load_checkpoint, restoring
from utils.checkpoint.sharded import (
    consolidate,
    copy_sharded,
    load_whole,
    restore_sharded,
    restore_training,
    save_sharded,
    sharded_state,
)
from utils.config.monitor import Monitor
from utils.config.resolvers import in_sweep
from utils.config.secrets import redacted_argv
from utils.files import copy_atomic, save_atomic
from utils.fit.state import TrainState
from utils.fit.top_k import (
    checked_top_k,
    copy_of_epoch,
    keep_copies,
    own_top_k_file,
    prune_top_k,
    rank_top_k,
    top_k_name,
)
from utils.model.optim import hyperparameters
from utils.model.weights import load_weights, unwrap
from utils.system import distributed
from utils.system.cpu_math import cpu_numerics
from utils.system.seeding import all_rng_states, restore_rng
from utils.system.signals import Interrupted, continue_command, continue_sweep_command

log = logging.getLogger("torchloom")


class Checkpointer:
    def __init__(
        self, run: Any, context: Any, parts: Any, state: TrainState, monitor: Monitor, trainer: Any
    ) -> None:
        """For ``run`` (utils/run/start.py RunStart: its checkpoint folder, record and resume point)
        in the process ``context`` (whether it writes checkpoints; its rank), saving ``parts``
        (utils/fit/loop.py) and ``state``; ``trainer`` is the typed trainer config."""
        self.folder, self.run, self.context = run.checkpoint_dir, run, context
        self.parts, self.state, self.monitor, self.trainer = parts, state, monitor, trainer
        self.intact: tuple[Path, int | None] | None = None  # the last good checkpoint, epoch
        self.history: Any = None  # the run's tracker: what each checkpoint's history covers
        self.saved_at = time.monotonic()  # trainer.checkpoint_every_minutes counts from here

    @property
    def sharded(self) -> bool:
        """trainer.strategy=fsdp: checkpoints are folders of each process's shards."""
        return self.trainer.strategy == "fsdp"

    @property
    def last(self) -> Path:
        return self.folder / ("last" if self.sharded else "last.pt")

    @property
    def best(self) -> Path:
        return self.folder / ("best" if self.sharded else "best.pt")

    @property
    def writes(self) -> bool:
        return self.context.writes  # rank 0 of a run that writes outputs

    def describe(self) -> str:
        """What the last good checkpoint holds, for the messages of a run that fails."""
        if self.intact is None:
            return "no checkpoint was written yet"
        path, epoch = self.intact
        return f"{path} is intact" if epoch is None else f"{path} (epoch {epoch}) is intact"

    # --- Continuing ------------------------------------------------------------------------

    def start(self, init_from: str | None, history: Any = None) -> None:
        """Continue the checkpoint the run resumes, with its config changes applied; or start
        fresh (each process its own forward-pass RNG stream), from the weights of
        ``init_from`` when given. ``history`` is the run's tracker (utils/tracking/tracker.py): each
        checkpoint records how far it got, and it is sent on once the checkpoint is written."""
        self.history = history
        if self.run.resumed:
            self.resume(*self.run.resumed, self.run.changes)
            return
        self.context.seed_own_stream()
        if init_from:
            weights = load_checkpoint(init_from)["model"]
            if self.sharded:
                load_whole(self.parts.model, weights)
            else:
                load_weights(unwrap(self.parts.model), weights)
            if self.parts.ema:
                self.parts.ema.restart_from(self.parts.model)
            log.info("weights from %s; optimizer, schedule and counters start fresh", init_from)

    def resume(self, path: Path, checkpoint: dict, changes: Any) -> None:
        """Put ``checkpoint`` back into the parts and the state, with the config ``changes``
        applied (utils/run/resume_changes.py)."""
        parts, state = self.parts, self.state
        built = hyperparameters(parts.optimizer)  # as the new config builds them
        batch, world = state.global_batch, self.context.processes.world_size
        self._restore(path, checkpoint, reschedule=changes.reschedule)
        state.global_batch = batch  # this run's; the checkpoint's counted its position
        if changes.reschedule:
            with restoring("scheduler settings", path):
                parts.schedule.continue_changed(checkpoint["scheduler"], parts.optimizer, built)
        state.top_k = checked_top_k(state.top_k, self.folder)
        if self.writes:
            prune_top_k(self.folder, state.top_k, self.trainer.keep_top_k, state.epoch)
            self._finish_copies(path)
            self._announce(*self._copies_of_the_save())  # what the callbacks' state had not seen
        saved_world = checkpoint.get("world_size", 1)
        state.batch_in_epoch = distributed.rescale_position(
            state.batch_in_epoch,
            (saved_world, checkpoint.get("global_batch") or batch // world * saved_world),
            (world, batch),
            self.trainer.accumulate_grad_batches,
        )
        self.intact = (path, None)
        log.info(
            "resumed from %s: epoch %d, batch %d, step %d",
            path,
            state.epoch + 1,
            state.batch_in_epoch,
            state.global_step,
        )

    def _finish_copies(self, path: Path) -> None:
        """A kill after last.pt was written but before its copies: when the resumed last.pt
        is the run's best epoch (or one of its top-k), that copy is made now, since the
        resumed run never validates that epoch again."""
        if path.resolve() != self.last.resolve():
            return
        best, top_k_file = self._copies_of_the_save()
        if best and self.sharded:
            copy_sharded(self.last, self.best)
        elif best:
            copy_atomic(self.last, self.best)
        copy = own_top_k_file(self.folder, top_k_file) if top_k_file else None
        if copy and not copy.exists():
            copy_atomic(self.last, copy)

    def _copies_of_the_save(self) -> tuple[bool, str]:
        """(whether best.pt, which top-k file) the save of the resumed last.pt made of it."""
        state = self.state
        if state.batch_in_epoch:
            return False, ""
        best = state.best_epoch == state.epoch and state.best_metric is not None
        return best, copy_of_epoch(state.top_k, state.epoch)

    def _announce(self, best: bool, top_k_file: str) -> None:
        """The callbacks' ``on_checkpoint`` for last.pt and the copies just made of it. Their
        state in last.pt was taken before these calls, so a resume makes them again."""
        callbacks = self.parts.callbacks
        callbacks.checkpoint(self.last, "last")
        if best:
            callbacks.checkpoint(self.best, "best")
        if top_k_file:
            callbacks.checkpoint(self.folder / top_k_file, "top_k")

    def _restore(self, path: Path, checkpoint: dict[str, Any], reschedule: bool) -> None:
        """Put every piece of a training checkpoint back: weights, optimizer, schedule (unless
        the caller continues a changed one), loss scaler, the state, the loss sums, and — last,
        because building the model drew from it — this process's RNG. A loss scaler that the
        checkpoint's precision did not use starts fresh."""
        parts, scaler = self.parts, self.parts.precision.scaler
        if parts.teacher:
            parts.teacher.check_resumed(checkpoint.get("distill"), path)
        restore_training(path, checkpoint, parts.model, parts.optimizer, self.sharded)
        if not reschedule:
            with restoring("scheduler settings", path):
                parts.schedule.load_state_dict(checkpoint["scheduler"])
        if scaler.is_enabled() and not checkpoint["scaler"]:
            log.info("precision changed to float16: loss scaling starts at %g", scaler.get_scale())
        else:
            with restoring("loss scaler settings", path):
                scaler.load_state_dict(checkpoint["scaler"])
        self.state.load_state_dict(checkpoint)
        parts.callbacks.load_state_dict(checkpoint.get("callbacks"), path)  # before on_fit_start
        if self.state.stopped_by and not parts.callbacks.honours(self.state.stopped_by):
            self.state.stopped_by = None
        self._restore_averages(checkpoint)
        with restoring("loss sums", path):
            saved = checkpoint.get("losses") or legacy_loss_sums(checkpoint)
            ranks, processes = saved.get("ranks") or [], self.context.processes
            own = len(ranks) == processes.world_size  # each its own, as they were summed
            parts.losses.load_state_dict(ranks[processes.rank] if own else saved)
        with restoring("RNG states", path):
            restore_rng(checkpoint, self.context.processes)

    def _restore_averages(self, checkpoint: dict[str, Any]) -> None:
        """The weight averages the checkpoint holds. An EMA it lacks (trainer.ema turned on
        at a resume) starts at the restored weights; SWA's is always there (a resume cannot
        turn trainer.swa on, utils/run/resume_changes.py)."""
        if self.parts.swa:
            self.parts.swa.load_state_dict(checkpoint.get("swa"), "the checkpoint")
        ema = self.parts.ema
        if ema is None:
            return
        if checkpoint.get("ema") is None:
            ema.restart_from(self.parts.model)
            log.info("trainer.ema: the checkpoint holds no EMA; it starts at the resumed weights")
        else:
            ema.load_state_dict(checkpoint["ema"], "the checkpoint")

    # --- Saving ----------------------------------------------------------------------------

    def contents(
        self, rng: list[dict], groups: list | None = None, losses: list | None = None
    ) -> dict[str, Any]:
        """Everything that rebuilds and resumes the run, as a plain dict: the unwrapped model's
        weights, optimizer, schedule, loss scaler, the state and loss sums, the config, and the
        RNG and loss sums of every process (``rng``, ``losses``: one per rank). Sharded (``groups``: the optimizer's
        param groups), the weights and the optimizer's tensors are in the DCP files beside."""
        parts, record = self.parts, self.run.record
        sharded = groups is not None
        return training_checkpoint(
            model={} if sharded else unwrap(parts.model).state_dict(),
            optimizer={"state": {}, "param_groups": groups}
            if sharded
            else parts.optimizer.state_dict(),
            scheduler=parts.schedule.state_dict(),
            scaler=parts.precision.scaler.state_dict(),
            **self.state.state_dict(),
            losses={**parts.losses.state_dict(), "ranks": losses or []},
            ema=parts.ema.state_dict() if parts.ema else None,
            swa=parts.swa.state_dict() if parts.swa else None,
            distill=parts.teacher.record() if parts.teacher else None,  # its path, sha256
            monitor=self.monitor.name,
            config=record.resolved,
            overrides=record.overrides,
            classes=(record.inputs or {}).get("classes"),
            inputs=record.inputs,
            rng=rng[0],
            rng_per_rank=rng,
            world_size=len(rng),
            tracking=self.history.checkpoint_record() if self.history else None,
            callbacks=parts.callbacks.state_dict(),
            provenance=record.provenance,
            numerics=cpu_numerics(),  # a resume runs on the same threads (cpu_math.py)
        )

    def save(self) -> None:
        """Write ``last.pt`` (collective: every process's RNG stream goes in). Never from
        non-finite weights."""
        parts, state = self.parts, self.state
        parts.watch.check(state.global_step, parts, self.describe(), weights=True)
        rng = all_rng_states()
        losses = distributed.gathered(parts.losses.state_dict())  # each process's epoch so far
        if self.sharded:  # every process writes its shards, rank 0 the rest
            tensors, groups = sharded_state(parts.model, parts.optimizer)
            state = self.contents(rng, groups, losses) if self.writes else None
            save_sharded(tensors, state, self.last, self.writes)
        elif self.writes:  # one process writes the weights
            save_atomic(self.contents(rng, losses=losses), self.last)
        self.saved_at = time.monotonic()

    @property
    def saves_within_epoch(self) -> bool:
        """Whether last.pt is ever written inside an epoch (``trainer.checkpoint_every_*``)."""
        return bool(self.trainer.checkpoint_every_n_steps or self.trainer.checkpoint_every_minutes)

    def due_within_epoch(self, may_sync: bool) -> bool:
        """Whether last.pt is due inside the epoch, after the optimizer step just taken:
        every ``trainer.checkpoint_every_n_steps`` steps, or once
        ``trainer.checkpoint_every_minutes`` have passed since the last save (several
        processes agree on the clock only at steps where they sync anyway, ``may_sync``)."""
        trainer = self.trainer
        every, minutes = trainer.checkpoint_every_n_steps, trainer.checkpoint_every_minutes
        if every and self.state.global_step % every == 0:
            return True
        if not minutes or not may_sync:
            return False
        late = time.monotonic() - self.saved_at >= 60 * minutes
        return distributed.agree(late, self.context.device)

    def save_within_epoch(self) -> None:
        """last.pt at the exact position inside an epoch (resumed as one a stop signal
        wrote), and the history it covers sent on: a kill -9 loses only the steps since."""
        self.save()
        self.intact = (self.last, None)
        if self.writes:
            self._announce(best=False, top_k_file="")
        self.sent_on()

    def save_epoch(self, value: float | None) -> None:
        """At the end of an epoch: ``last.pt``, and when the epoch was validated (``value``
        is the monitored metric) ``best.pt`` if it is at least as good as the best so far and
        its top-k copy if it ranks. Copies are made after last.pt is complete, and top-k files
        that fall out are deleted last."""
        state, improved, top_k_file, dropped = self.state, False, "", []
        if value is not None:
            improved = self.monitor.at_least_as_good(value, state.best_metric)
            if improved:
                state.best_metric, state.best_epoch = value, state.epoch
            name = top_k_name(state.epoch, self.monitor.name, value)
            keep, dropped = rank_top_k(
                state.top_k, self.trainer.keep_top_k, name, value, self.monitor
            )
            top_k_file = name if keep else ""
        self.save()
        self.intact = (self.last, state.epoch)
        if self.writes and self.sharded:  # best/: a copy of last/ (no top-k: refused)
            if improved:
                copy_sharded(self.last, self.best)
        elif self.writes:  # best.pt, top-k: copies of last.pt
            keep_copies(self.folder, best=improved, top_k_file=top_k_file, dropped=dropped)
            self._announce(improved, top_k_file)
        self.sent_on()

    def sent_on(self) -> None:
        """last.pt and its copies are complete: the history they cover goes to the trackers
        that get points only then (utils/tracking/tracker.py)."""
        if self.writes and self.history:
            self.history.checkpoint_written(self.state.global_step)

    def save_on_stop(self) -> None:
        """A stop: the exact position, unless last.pt already holds it (all processes agree)."""
        unsaved = self.state.batch_in_epoch or not self.last.exists()
        if distributed.agree(
            bool(unsaved), self.context.device
        ):  # saving is collective: all or none
            self.save()
            if self.writes:
                self._announce(best=False, top_k_file="")
            self.sent_on()

    def stop_here(self, stop: Any) -> None:
        """A stop every process agreed on: the exact position in last.pt (and the history it
        covers), the command that continues the run; then :class:`Interrupted` (the tracked
        run is marked killed)."""
        context, record = self.context, self.run.record
        self.save_on_stop()
        if context.is_main:
            state = self.state
            command = (
                continue_sweep_command(record.resolved["run_name"], redacted_argv(sys.argv))
                if in_sweep()
                else continue_command(
                    record.overrides, self.last, context.processes, self.run.parent
                )
            )
            log.info(
                "stopped by %s at epoch %d, batch %d; continue with:\n  %s",
                stop.name or "a signal to another process",
                state.epoch + 1,
                state.batch_in_epoch,
                command,
            )
        self.parts.callbacks.fit_end("interrupted", self.state.metrics)
        distributed.barrier()  # no process leaves before last.pt is written: torchrun would kill the rest
        context.close()
        raise Interrupted

    def load_best(self) -> None:
        """The best epoch's weights into the model (and its EMA), for the final test (once
        every process can read a complete best.pt), and its val/ figures into the state: a
        run's metrics.json reports the val and test figures of one checkpoint, best.pt."""
        distributed.barrier()
        best = self.best
        if best.exists():
            checkpoint = load_checkpoint(best, whole_weights=not self.sharded)
            if self.sharded:
                restore_sharded(best, self.parts.model)
                if self.trainer.fsdp.consolidate:  # best.safetensors: the whole model, one file
                    consolidate(self.parts.model, self.folder, self.run.record, self.writes)
            else:
                load_weights(self.parts.model, checkpoint["model"])
            self._restore_averages(checkpoint)
            self.state.record(
                "val",
                {
                    name.removeprefix("val/"): value
                    for name, value in checkpoint.get("metrics", {}).items()
                    if name.startswith("val/")
                },
            )
