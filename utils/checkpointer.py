"""What a run saves, when and where, and how it continues from a checkpoint: one owner,
registered once with the parts it saves (timm's ``CheckpointSaver``, torchtitan's
``CheckpointManager``); train.py then calls ``resume``, ``save_epoch``, ``save_on_stop`` and
``load_best``. The mechanisms (atomic writes, safe loading, top-k names) are in
:mod:`utils.checkpoint`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils import distributed, sweep
from utils.checkpoint import (
    FORMAT_VERSION,
    checked_top_k,
    keep_copies,
    legacy_loss_sums,
    load_checkpoint,
    load_weights,
    prune_top_k,
    rank_top_k,
    restoring,
    save_atomic,
    top_k_name,
    unwrap,
)
from utils.ema import WeightAverage
from utils.errors import UserError
from utils.loss_sums import LossSums
from utils.monitor import Monitor
from utils.nonfinite import NonFiniteWatch
from utils.optim import hyperparameters
from utils.precision import Precision
from utils.schedulers import Schedule
from utils.seeding import all_rng_states, restore_rng, seed_rank_stream
from utils.signals import Interrupted, continue_command
from utils.state import TrainState

log = logging.getLogger("torchloom")


@dataclass
class Parts:
    """What a training step changes and a checkpoint saves. ``model`` is the module as the
    step calls it (DDP or torch.compile wrappers allowed: checkpoints hold the unwrapped one)."""

    model: nn.Module
    optimizer: Any
    schedule: Schedule
    precision: Precision
    watch: NonFiniteWatch  # its loss sums are saved too
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # the task's (utils/tasks.py)
    ema: WeightAverage | None = None  # trainer.ema: updated after each step, saved beside it

    @classmethod
    def assemble(
        cls, modules: Any, optimizer: Any, schedule: Schedule, precision: Precision,
        loss: Callable, trainer: Any,
    ) -> Parts:  # fmt: skip
        """The parts around ``modules.step_model``: fresh loss sums on the model's device,
        the NaN watch over them (``trainer.nonfinite``, ``max_consecutive_skips``,
        ``accumulate_grad_batches``), and the weight average ``trainer.ema`` asks for (of the
        unwrapped model, so the same on every process)."""
        losses = LossSums(precision.device, trainer.accumulate_grad_batches)
        watch = NonFiniteWatch(trainer.nonfinite, trainer.max_consecutive_skips, losses)
        ema = WeightAverage.of(trainer.ema, modules.model)
        return cls(modules.step_model, optimizer, schedule, precision, watch, loss, ema)

    def judged(self, eval_model: nn.Module, ema_config: Any) -> nn.Module:
        """The module validation, best.pt and the test judge: the EMA's when it is on and
        ``trainer.ema.evaluate`` says so, else ``eval_model``."""
        return self.ema.module if self.ema and ema_config.evaluate else eval_model


@dataclass(frozen=True)
class RunRecord:
    """What a checkpoint records besides the state: the resolved config, the command line's
    overrides, and how inputs reach the model (shape, normalisation, class names)."""

    # Not named `config`: the joblib launcher sends train.py's functions with cloudpickle,
    # which takes `torch.distributed.config` for a submodule train() uses when `distributed`
    # and `config` are both among its names, and cannot pickle it.
    resolved: dict
    overrides: list[str]
    inputs: dict | None = None  # Data.input_record(): shape, normalisation, class names

    def with_inputs(self, inputs: dict) -> RunRecord:
        return RunRecord(self.resolved, self.overrides, inputs)

    @property
    def keep_top_k(self) -> int:
        return self.resolved["trainer"]["keep_top_k"]


class Checkpointer:
    def __init__(
        self, folder: Path, parts: Parts, state: TrainState, monitor: Monitor, record: RunRecord,
        writes: bool,
    ) -> None:  # fmt: skip
        self.folder, self.parts, self.state = folder, parts, state
        self.monitor, self.record = monitor, record
        self.writes = writes  # rank 0 of a run that writes outputs (not debug=fast_dev_run)

    @property
    def last(self) -> Path:
        return self.folder / "last.pt"

    # --- Continuing ------------------------------------------------------------------------

    def start(self, run: Any, seed: int, init_from: str | None) -> None:
        """Continue the checkpoint ``run`` resumes with its config changes applied; or start
        fresh, from the weights of ``init_from`` when given."""
        self.resume(run.resumed, run.changes, seed)
        if init_from and not run.resumed:
            load_weights(unwrap(self.parts.model), load_checkpoint(init_from)["model"])
            if self.parts.ema:
                self.parts.ema.restart_from(self.parts.model)
            log.info("weights from %s; optimizer, schedule and counters start fresh", init_from)

    def resume(self, resumed: tuple[Path, dict] | None, changes, seed: int) -> None:
        """Put the checkpoint ``resumed`` back into the parts and the state, with the config
        ``changes`` applied; without one, give this process its own forward-pass RNG stream."""
        if resumed is None:
            seed_rank_stream(seed, distributed.rank())
            return
        path, checkpoint = resumed
        parts, state = self.parts, self.state
        built = hyperparameters(parts.optimizer)  # as the new config builds them
        self._restore(path, checkpoint, reschedule=changes.reschedule)
        if changes.reschedule:
            with restoring("scheduler settings", path):
                parts.schedule.continue_changed(checkpoint["scheduler"], parts.optimizer, built)
        state.top_k = checked_top_k(state.top_k, self.folder)
        if self.writes:
            prune_top_k(self.folder, state.top_k, self.record.keep_top_k, state.epoch)
        parts.watch.skipped = state.skipped_steps
        accumulate = self.record.resolved["trainer"]["accumulate_grad_batches"]
        state.batch_in_epoch = distributed.rescale_position(
            state.batch_in_epoch, checkpoint.get("world_size", 1), distributed.world_size(),
            accumulate,
        )  # fmt: skip
        parts.watch.saved = f"{path} is intact"
        log.info("resumed from %s: epoch %d, batch %d, step %d", path, state.epoch + 1,
                 state.batch_in_epoch, state.global_step)  # fmt: skip

    def _restore(self, path: Path, checkpoint: dict[str, Any], reschedule: bool) -> None:
        """Put every piece of a training checkpoint back: weights, optimizer, schedule (unless
        the caller continues a changed one), loss scaler, the state, the loss sums, and — last,
        because building the model drew from it — this process's RNG. A loss scaler that the
        checkpoint's precision did not use starts fresh."""
        parts, scaler = self.parts, self.parts.precision.scaler
        load_weights(parts.model, checkpoint["model"])
        try:
            parts.optimizer.load_state_dict(checkpoint["optimizer"])
        except (ValueError, KeyError) as error:
            raise UserError(
                f"the checkpoint's optimizer state does not fit this model's parameters "
                f"({error}); start from its weights with init_from=... instead"
            ) from None
        if not reschedule:
            with restoring("scheduler settings", path):
                parts.schedule.load_state_dict(checkpoint["scheduler"])
        if scaler.is_enabled() and not checkpoint["scaler"]:
            log.info("precision changed to float16: loss scaling starts at %g", scaler.get_scale())
        else:
            with restoring("loss scaler settings", path):
                scaler.load_state_dict(checkpoint["scaler"])
        self.state.load_state_dict(checkpoint)
        self._restore_ema(checkpoint)
        with restoring("loss sums", path):
            parts.watch.losses.load_state_dict(
                checkpoint.get("losses") or legacy_loss_sums(checkpoint)
            )
        with restoring("RNG states", path):
            restore_rng(checkpoint)

    def _restore_ema(self, checkpoint: dict[str, Any]) -> None:
        """The weight average the checkpoint holds; one it lacks (trainer.ema turned on at a
        resume) starts at the restored weights."""
        ema = self.parts.ema
        if ema is None:
            return
        if checkpoint.get("ema") is None:
            ema.restart_from(self.parts.model)
            log.info("trainer.ema: the checkpoint holds no EMA; it starts at the resumed weights")
        else:
            ema.load_state_dict(checkpoint["ema"], "the checkpoint")

    # --- Saving ----------------------------------------------------------------------------

    def contents(self, rng: list[dict]) -> dict[str, Any]:
        """Everything that rebuilds and resumes the run, as a plain dict: the unwrapped model's
        weights, optimizer, schedule, loss scaler, the state and loss sums, the config, and the
        RNG of every process (``rng``, one per rank)."""
        parts = self.parts
        return {
            "format_version": FORMAT_VERSION,
            "model": unwrap(parts.model).state_dict(),
            "optimizer": parts.optimizer.state_dict(),
            "scheduler": parts.schedule.state_dict(),
            "scaler": parts.precision.scaler.state_dict(),
            **self.state.state_dict(),
            "losses": parts.watch.losses.state_dict(),
            "ema": parts.ema.state_dict() if parts.ema else None,
            "monitor": self.monitor.name,
            "config": self.record.resolved,
            "overrides": self.record.overrides,
            "classes": (self.record.inputs or {}).get("classes"),
            "inputs": self.record.inputs,
            "rng": rng[0],
            "rng_per_rank": rng,
            "world_size": len(rng),
        }

    def save(self) -> None:
        """Write ``last.pt`` (collective: every process's RNG stream goes in). Never from
        non-finite weights."""
        parts, state = self.parts, self.state
        scaler = parts.precision.scaler
        parts.watch.check(state.global_step, parts.model, parts.optimizer, scaler, weights=True)
        rng = all_rng_states()
        state.skipped_steps = parts.watch.skipped
        if self.writes:  # one process writes the weights
            save_atomic(self.contents(rng), self.last)

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
                state.top_k, self.record.keep_top_k, name, value, self.monitor
            )
            top_k_file = name if keep else ""
        self.save()
        self.parts.watch.saved = f"{self.last} (epoch {state.epoch}) is intact"
        if self.writes:  # best.pt, top-k: copies of last.pt
            keep_copies(self.folder, best=improved, top_k_file=top_k_file, dropped=dropped)

    def save_on_stop(self, device) -> None:
        """A stop: the exact position, unless last.pt already holds it (all processes agree)."""
        unsaved = self.state.batch_in_epoch or not self.last.exists()
        if distributed.agree(bool(unsaved), device):  # saving is collective: all or none
            self.save()

    def stop_here(self, stop: Any, context: Any, out: Any) -> None:
        """A stop every process agreed on: the exact position in last.pt, the outputs
        flushed, the command that continues the run; then :class:`Interrupted`."""
        self.save_on_stop(context.device)
        out.close()
        if context.is_main:
            state = self.state
            command = (sweep.continue_command(self.record.resolved["run_name"]) if sweep.in_sweep()
                       else continue_command(self.record.overrides, self.last, context.processes))  # fmt: skip
            print(f"stopped by {stop.name or 'a signal to another process'} at epoch "
                  f"{state.epoch + 1}, batch {state.batch_in_epoch}; continue with:\n  {command}")  # fmt: skip
        distributed.barrier()  # no process leaves before last.pt is written: torchrun would kill the rest
        context.close()
        raise Interrupted

    def load_best(self) -> None:
        """The best epoch's weights into the model (and its EMA), for the final test (once
        every process can read a complete best.pt)."""
        distributed.barrier()
        best = self.folder / "best.pt"
        if best.exists():
            checkpoint = load_checkpoint(best)
            load_weights(self.parts.model, checkpoint["model"])
            self._restore_ema(checkpoint)
