"""The training step, and what an epoch of steps keeps count of: the loss sums and the NaN
watch, timing and data wait, and when the processes stop together.

The step body is :meth:`Loop.epoch`'s loop, in one place. Its order of operations is what
bit-identical resume relies on: forward and backward per micro-batch, then (every
``accumulate_grad_batches``) unscale, clip or measure, step, schedule, EMA, zero, count.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from utils.diagnose import debug
from utils.errors import UserError
from utils.fit.callbacks.hooks import Callbacks, StepView
from utils.fit.ema import WeightAverage
from utils.fit.loss_sums import LossSums
from utils.fit.nonfinite import NonFiniteWatch
from utils.fit.progress import data_wait_advice
from utils.fit.swa import AveragingSchedule, StochasticAverage
from utils.fit.teacher import Teacher
from utils.model.weights import unwrap
from utils.precision import Precision
from utils.schedulers import Schedule
from utils.system import distributed
from utils.system.memory import collect_cycles, cycle_collection_by_the_loop, out_of_memory
from utils.system.sharding import full_norm, memory_per_process

log = logging.getLogger("torchloom")
DATA_WAIT_WARNING = 0.2  # the share of training time spent waiting for batches that warns


@dataclass(frozen=True)
class Objective:
    """What a training step minimises: the task's loss (utils/tasks/), blended with a teacher's
    outputs when distilling (``distill.teacher``, utils/fit/teacher.py)."""

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    teacher: Teacher | None = None


@dataclass
class Parts:
    """What a training step changes and a checkpoint saves. ``model`` is the module as the
    step calls it (DDP or torch.compile wrappers allowed: checkpoints hold the unwrapped one)."""

    model: nn.Module
    optimizer: Any
    schedule: Schedule
    precision: Precision
    watch: NonFiniteWatch  # the NaN/Inf policy over the loss sums
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # the task's (utils/tasks.py)
    ema: WeightAverage | None = None  # trainer.ema: updated after each step, saved beside it
    swa: StochasticAverage | None = None  # trainer.swa: updated after each epoch, saved too
    teacher: Teacher | None = None  # distill.teacher: blended into the loss, never saved
    callbacks: Callbacks = field(default_factory=lambda: Callbacks([]))  # conf/callbacks/

    @classmethod
    def assemble(
        cls,
        modules: Any,
        optimizer: Any,
        schedule: Schedule,
        precision: Precision,
        objective: Objective,
        trainer: Any,
    ) -> Parts:
        """The parts around ``modules.step_model``: fresh loss sums on the model's device,
        the NaN watch over them (``trainer.nonfinite``, ``max_consecutive_skips``,
        ``accumulate_grad_batches``), and the weight average ``trainer.ema`` or ``trainer.swa``
        asks for (of the unwrapped model, so the same on every process); with SWA the
        schedule hands over to SWA's LR at ``trainer.swa.start`` (utils/fit/swa.py)."""
        losses = LossSums(precision.device, trainer.accumulate_grad_batches)
        watch = NonFiniteWatch(trainer.nonfinite, trainer.max_consecutive_skips, losses)
        ema = WeightAverage.of(trainer.ema, modules.model)
        swa = StochasticAverage.of(trainer.swa, modules.model, trainer.max_epochs)
        if ema and swa:
            raise UserError(
                "trainer.ema and trainer.swa each average the weights that are "
                "judged; choose one (set the other's decay or start to null)"
            )
        if swa and trainer.sync_batchnorm:  # its refit pass would be a collective per batch
            raise UserError(
                "trainer.swa refits BatchNorm statistics in each process and "
                "averages them; set trainer.sync_batchnorm=false with it"
            )
        if swa:
            schedule = AveragingSchedule(schedule, optimizer, trainer.swa, swa.start)
        return cls(
            modules.step_model,
            optimizer,
            schedule,
            precision,
            watch,
            objective.loss,
            ema,
            swa,
            objective.teacher,
        )

    @property
    def losses(self) -> LossSums:
        """The running loss sums (saved in checkpoints), read by the loop at its syncs."""
        return self.watch.losses

    def judged(self, eval_model: nn.Module, ema_config: Any) -> nn.Module:
        """The module validation, best.pt and the test judge: SWA's when it is on, the EMA's
        when it is on and ``trainer.ema.evaluate`` says so, else ``eval_model``."""
        if self.swa:
            return self.swa.module
        return self.ema.module if self.ema and ema_config.evaluate else eval_model


class Loop:
    def __init__(
        self, checkpointer: Any, trainer: Any, stop: Any, tracker: Any, progress: Any
    ) -> None:
        """Steps the parts ``checkpointer`` saves (utils/fit/checkpointer.py), from and into its
        state; a failure's message says what its last good checkpoint holds. Its points go
        to ``tracker`` (utils/tracking/tracker.py)."""
        self.checkpointer, self.parts, self.state = (
            checkpointer,
            checkpointer.parts,
            checkpointer.state,
        )
        self.saved = checkpointer.describe
        self.trainer, self.stop, self.tracker, self.progress = trainer, stop, tracker, progress
        self.train_seconds = 0.0  # inside epochs, evaluation excluded
        self.trained_steps = 0  # by this invocation (a resumed run counts from its resume)
        self.trained_samples = 0  # by this process, in this invocation (a partial batch too)
        self.trained_tokens = 0  # of a loss per token (task=causal_lm): its targets, counted
        self.counts_tokens = getattr(checkpointer.parts.loss, "tokens", False)
        self.stopped = False  # every process agreed to stop before the last epoch ended
        self.set_epoch = getattr(unwrap(self.parts.model), "set_epoch", None)

    def epochs(self, batches: Any, batch_size: int, done: Any) -> Iterator[int]:
        """Train epoch after epoch up to ``trainer.max_epochs`` or until ``done()`` (early
        stopping) or a callback's stop, with the progress bar shown and cycle collection by
        the loop; yields after each finished epoch (the caller then validates and saves). A
        callback's stop within an epoch saves last.pt there, and the run goes on to its test.
        When every process agrees on a signal's stop, last.pt holds the exact position and
        :class:`Interrupted` is raised (utils/fit/checkpointer.py ``stop_here``)."""
        state, device = self.state, self.parts.losses.device
        if state.batch_in_epoch > len(batches):
            raise UserError(
                f"the checkpoint's position, batch {state.batch_in_epoch} of epoch "
                f"{state.epoch + 1}, is past the end of an epoch of {len(batches)} "
                "batches (was it edited, or the data or batch size changed?); use "
                "init_from=... to start from its weights"
            )
        self.stopped = distributed.agree(self.stop.requested, device)  # a signal at start-up
        self.stop.stepping = True  # a signal from now on finishes a step
        with self.progress, cycle_collection_by_the_loop():
            while self.going_on(done):
                if not self.epoch(batches, batch_size):
                    self.stopped = not state.stopped_by
                    break
                state.next_epoch()
                yield state.epoch
                collect_cycles()  # also once an epoch, however long the logging window
                self.stopped = distributed.agree(self.stop.requested, device)
        if state.stopped_by:  # a callback's stop: its position saved, then the run's test
            self.checkpointer.save_on_stop()
        elif self.stopped:
            self.checkpointer.stop_here(self.stop)

    def going_on(self, done: Any) -> bool:
        state = self.state
        stop = self.stopped or done() or state.stopped_by or self.steps_done
        return state.epoch < self.trainer.max_epochs and not stop

    @property
    def steps_done(self) -> bool:
        """``trainer.max_steps`` optimizer steps are taken (the run's length in steps)."""
        return bool(self.trainer.max_steps) and self.state.global_step >= self.trainer.max_steps

    @property
    def status(self) -> str:
        """How training ended: finished (all of trainer.max_epochs) or stopped (early
        stopping, a callback); an interrupted run raised Interrupted instead."""
        return "finished" if self.state.epoch >= self.trainer.max_epochs else "stopped"

    def epoch(self, batches: Any, batch_size: int) -> bool:
        """Train from the state's data position to the end of its epoch, then log its loss,
        speed and data wait. Returns False when a stop was requested first; the state then
        holds the position to resume from."""
        state, progress, tracker = self.state, self.progress, self.tracker
        accumulate = self.trainer.accumulate_grad_batches
        epoch_start, step_before = time.perf_counter(), state.global_step
        samples_before, tokens_before = self.trained_samples, self.trained_tokens
        wait_before = progress.data_wait.seconds
        if state.batch_in_epoch == 0:  # a resumed epoch started before: not again
            self.parts.callbacks.epoch_start(state.epoch + 1)
        if self.set_epoch:  # a model that trains differently by epoch (freeze_backbone_epochs)
            self.set_epoch(state.epoch)
        try:
            finished = self._steps(batches)
        except torch.OutOfMemoryError:
            device = self.parts.losses.device
            raise out_of_memory(device, batch_size, accumulate, self.saved()) from None
        except RuntimeError as error:  # debug=anomaly names the op that made a NaN
            raise (debug.anomaly_error(error) or error) from None
        if finished:  # reading the loss waits for the device, so the clock below is true
            micro_batches = state.batch_in_epoch  # all of them, or those to trainer.max_steps
            losses = self.parts.losses
            epoch_loss = losses.epoch_mean(state.global_step, micro_batches)
            state.metrics["train/loss"] = distributed.all_mean(epoch_loss, losses.device)
        seconds = time.perf_counter() - epoch_start
        self.train_seconds += seconds
        self.trained_steps += state.global_step - step_before
        progress.update(state.epoch, state.global_step)  # where the bar stands, if it ends here
        if finished:
            samples = self.trained_samples - samples_before
            tracker.scalar("train/samples_per_second", samples / seconds, state.global_step)
            waited = (progress.data_wait.seconds - wait_before) / seconds
            tracker.scalar("train/data_wait_fraction", waited, state.global_step)
            speed = {"train/samples_per_second": samples / seconds}
            if self.counts_tokens:
                tokens = (self.trained_tokens - tokens_before) / seconds
                tracker.scalar("train/tokens_per_second", tokens, state.global_step)
                speed["train/tokens_per_second"] = tokens
            self.parts.callbacks.log(state, {**speed, "train/data_wait_fraction": waited})
        return finished

    def summary(self, data: Any) -> dict[str, float]:
        """Throughput, data wait and skipped steps over this invocation's training epochs;
        warns, saying what to change, when the loop waited for batches much of the time."""
        seconds = self.train_seconds
        samples = self.trained_samples
        waited = self.progress.data_wait.seconds / seconds if seconds else 0.0
        if waited > DATA_WAIT_WARNING:
            log.warning("warning: %s", data_wait_advice(waited, data))
        return {
            "train/samples_per_second": samples / seconds if seconds else 0.0,
            **(
                {"train/tokens_per_second": self.trained_tokens / seconds if seconds else 0.0}
                if self.counts_tokens
                else {}
            ),
            "train/data_wait_fraction": waited,
            "train/skipped_steps": self.state.skipped_steps,
            **memory_per_process(self.parts.model, self.parts.optimizer),  # under any strategy
        }

    def _steps(self, batches: Any) -> bool:
        """The step, from the data position in the state to the end of its epoch. The loss
        stays on the device; the host waits for it only on logging steps."""
        model, loss_of, teacher = self.parts.model, self.parts.loss, self.parts.teacher
        precision, watch, losses = self.parts.precision, self.parts.watch, self.parts.losses
        trainer, state, progress, stop = self.trainer, self.state, self.progress, self.stop
        model.train()
        accumulate = trainer.accumulate_grad_batches
        # Every optimizer step sees exactly `accumulate` micro-batches; a remainder is dropped.
        micro_batches = (len(batches) // accumulate) * accumulate
        start = state.batch_in_epoch
        timed_batches, window_start = 0, time.perf_counter()
        several_processes = distributed.is_distributed()
        max_steps = trainer.max_steps  # asked once: each call costs a step microseconds
        saves_within = self.checkpointer.saves_within_epoch
        batches_left = batches.epoch(state.epoch, start)
        if micro_batches < len(batches):
            batches_left = itertools.islice(batches_left, micro_batches - start)
        # On a small model each call around the step is a share of it (docs/speed.md): the
        # forward goes unwrapped when nothing wraps it (float32, one micro-batch a step, no
        # teacher), and a step that logs nothing is bare when nothing surrounds it.
        wraps_forward = precision.autocasts or accumulate > 1 or teacher is not None
        optimizer, schedule, bare_steps = self.parts.optimizer, self.parts.schedule, self.bare_steps
        for index, (images, labels) in enumerate(progress.data_wait.timed(batches_left), start):
            if wraps_forward:  # under DDP, only a step's last micro-batch all-reduces gradients
                with distributed.gradient_sync(model, sync=(index + 1) % accumulate == 0):
                    with precision.autocast():
                        outputs = model(images)
                        loss = loss_of(outputs, labels)
                        if teacher:  # distill.*: (1 − α)·loss + α·T²·KL to its outputs
                            loss = teacher.blend(loss, outputs, images)
                    precision.backward(loss / accumulate if accumulate > 1 else loss)
            else:
                loss = loss_of(model(images), labels)
                precision.backward(loss)
            losses.add(watch.observe(loss))  # summed, and checked for NaN/Inf, at the next sync
            timed_batches += 1
            self.trained_samples += len(labels)  # a shape: no wait for the device
            if self.counts_tokens:
                self.trained_tokens += labels.numel()
            state.batch_in_epoch = index + 1
            if (index + 1) % accumulate:
                continue

            log_due = (state.global_step + 1) % trainer.log_every_n_steps == 0
            if bare_steps and not log_due:  # _optimizer_step's order, with nothing between
                precision.step(optimizer)
                schedule.after_optimizer_step()
                optimizer.zero_grad(set_to_none=True)
                state.global_step += 1
            else:
                grad_norm = self._optimizer_step(log_due)
            if log_due:
                seconds = time.perf_counter() - window_start
                self._log_window(grad_norm, timed_batches * len(labels) / seconds, labels.device)
                timed_batches, window_start = 0, time.perf_counter()
            elif time.monotonic() >= progress.due:  # the bar's next redraw
                progress.update(state.epoch, state.global_step)
            # Several processes must stop at the same step: they agree when they sync anyway.
            stop_check_due = log_due or not several_processes
            if several_processes:
                signal = stop_check_due and distributed.agree(stop.requested, labels.device)
            else:
                signal = stop.requested
            if (signal or state.stopped_by) and index + 1 < micro_batches:
                return False
            if max_steps and state.global_step >= max_steps:  # inside the epoch: it ends here
                return True
            # trainer.checkpoint_every_*: last.pt inside the epoch (its end saves anyway)
            inside = saves_within and index + 1 < micro_batches  # asked before any collective
            if inside and self.checkpointer.due_within_epoch(stop_check_due):
                self.checkpointer.save_within_epoch()
        return True

    @property
    def bare_steps(self) -> bool:
        """Whether an optimizer step that logs nothing is the optimizer's and the schedule's
        step alone: nothing to unscale, clip, call back, average or skip (else
        :meth:`_optimizer_step`)."""
        parts, callbacks = self.parts, self.parts.callbacks
        extra = (
            parts.watch.policy == "skip" or parts.ema or callbacks.mutating or callbacks.unscaled
        )
        return not extra and self.trainer.gradient_clip_val is None

    def _optimizer_step(self, log_due: bool) -> torch.Tensor | None:
        """The optimizer step after the last micro-batch of a step: gradients unscaled to clip
        or measure them, the step taken (or skipped on a NaN/Inf loss), the schedule and the
        EMA moved on. Returns the gradients' total norm when it was measured."""
        model, optimizer, trainer = self.parts.model, self.parts.optimizer, self.trainer
        precision, state, grad_norm = self.parts.precision, self.state, None
        callbacks, view = self.parts.callbacks, None
        if callbacks.mutating:  # conf/callbacks/ entries with mutable: true
            view = StepView(unwrap(model), optimizer, precision.scaler, *state.position())
            callbacks.step("on_after_backward", view)  # gradients as backward left them
        if trainer.gradient_clip_val is not None or log_due or callbacks.unscaled:
            precision.scaler.unscale_(optimizer)  # clip and measure true gradients
            if trainer.gradient_clip_val is not None:
                max_norm = trainer.gradient_clip_val
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            elif log_due:  # measured only: no pass over every gradient to scale it by 1
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                grad_norm = torch.nn.utils.get_total_norm(grads)
            if log_due and trainer.log_grad_norms == "per_layer":
                for name, norm in per_layer_grad_norms(model).items():
                    self.tracker.scalar(f"grad_norm/{name}", norm, state.global_step + 1)
        if view:
            callbacks.step("on_before_optimizer_step", view)  # unscaled, clipped
        if self.parts.watch.step_allowed(state.global_step + 1, optimizer):
            precision.step(optimizer)
            self.parts.schedule.after_optimizer_step()  # the LR schedule counts the steps taken
            if view:
                callbacks.step("on_after_optimizer_step", view)  # before the EMA follows
            if self.parts.ema:
                self.parts.ema.update()  # toward the weights just written (utils/fit/ema.py)
        else:
            precision.discard_step()
            state.skipped_steps += 1  # saved with the state: a resumed run keeps counting
        optimizer.zero_grad(set_to_none=True)
        state.global_step += 1
        return grad_norm

    def _log_window(self, grad_norm: torch.Tensor, samples_per_second: float, device) -> None:
        """A logging step: the window's mean loss (the one host sync), checked for NaN/Inf,
        and the step's figures to the history and the progress bar."""
        state, tracker, losses = self.state, self.tracker, self.parts.losses
        step = state.global_step
        mean_loss = distributed.all_mean(losses.window_mean(step), device)  # sync
        self.parts.watch.check(step, self.parts, self.saved())
        tracker.scalar("train/loss", mean_loss, step)
        lr = self.parts.optimizer.param_groups[0]["lr"]
        tracker.scalar("train/lr", lr, step)
        tracker.scalar("train/grad_norm", full_norm(grad_norm).item(), step)
        tracker.scalar("train/skipped_steps", state.skipped_steps, step)
        self.parts.callbacks.log(state, {"train/loss": mean_loss, "train/lr": lr})
        self.progress.update(state.epoch, step, mean_loss, samples_per_second)
        collect_cycles()  # here, not at a random step (utils/system/memory.py)


def per_layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """The L2 norm of each parameter's gradient (``trainer.log_grad_norms=per_layer``), read
    from the device in one transfer."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return {}
    norms = torch.stack([grad.detach().float().norm() for _, grad in named]).tolist()
    return {name: norm for (name, _), norm in zip(named, norms, strict=True)}
