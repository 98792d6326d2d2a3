"""Learning-rate schedules, each with optional linear warmup.

Every schedule is a multiplier of ``optim.lr`` stepped after each optimizer step (so warmup and
decay have step resolution whatever the epoch length), except ``plateau``, which reduces the LR
after each validation when the monitored metric stops improving. ``Schedule`` hides that
difference from the loop: it calls ``after_optimizer_step()`` and ``after_validation(metrics)``.

Each ``conf/scheduler/*.yaml`` node maps to one builder below, its keys that builder's
arguments; the builder returns the function train.py finishes the schedule with once the
optimizer and the step counts exist: ``build(cfg.scheduler)(optimizer, steps)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR, ReduceLROnPlateau

from utils.config.arguments import (
    BELOW_ONE,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    UNIT_INTERVAL,
    checked,
    one_of,
)


class Schedule:
    def __init__(
        self,
        per_step: torch.optim.lr_scheduler.LRScheduler | None,
        plateau: ReduceLROnPlateau | None = None,
        monitor: str | None = None,
        warmup_steps: int = 0,
    ) -> None:
        self.per_step = per_step
        self.plateau = plateau
        self.monitor = monitor
        self.warmup_steps = warmup_steps
        self.steps: StepCounts | None = None  # the run's step counts, once started
        self.plain_multiplier = _plain_multiplier(per_step)  # stepped here, not by torch

    def after_optimizer_step(self) -> None:
        # With a plateau schedule the per-step part is only the warmup; stepping it afterwards
        # would overwrite the plateau's reductions.
        if self.per_step is None:
            return
        if self.plateau is None or self.per_step.last_epoch < self.warmup_steps:
            if self.plain_multiplier:
                _advance_multiplier(self.per_step)
            else:
                self.per_step.step()  # one-cycle, or LRs held as tensors

    def after_validation(self, metrics: dict[str, float]) -> None:
        if self.plateau is not None:
            self.plateau.step(metrics[self.monitor])

    def state_dict(self) -> dict:
        return {
            "per_step": self.per_step.state_dict() if self.per_step else None,
            "plateau": self.plateau.state_dict() if self.plateau else None,
        }

    def load_state_dict(self, state: dict) -> None:
        if self.per_step is not None:
            self.per_step.load_state_dict(state["per_step"])
        if self.plateau is not None:
            self.plateau.load_state_dict(state["plateau"])

    def continue_changed(self, state: dict, optimizer, built: list[dict]) -> None:
        """Resume a run whose optimizer, schedule or length changed (instead of
        :meth:`load_state_dict`, after the optimizer's state was loaded).

        The rule: from the step the checkpoint reached on, the run follows the new config as
        if it had been the config from the start. ``built`` holds the optimizer's param group
        hyperparameters as the new config built them (``optim.lr``, ``weight_decay``, betas,
        the schedule's ``initial_lr``/``max_lr``): they replace the checkpoint's, and the LR is
        this schedule's at the saved step — a longer cosine run is the longer curve at that
        step. A plateau schedule keeps the reductions it made so far, scaled to the new LR.
        """
        groups = optimizer.param_groups
        saved_lrs = [group["lr"] for group in groups]
        saved_peaks = [group.get("initial_lr", group["lr"]) for group in groups]
        for group, new in zip(groups, built, strict=True):
            group.update({key: value for key, value in new.items() if key != "lr"})
        if self.per_step is None:
            for group, new in zip(groups, built, strict=True):
                group["lr"] = new["lr"]
            return
        saved = state["per_step"]
        self.per_step.last_epoch, self.per_step._step_count = (
            saved["last_epoch"],
            saved["_step_count"],
        )
        if self.plateau is not None:
            tuned = {k: getattr(self.plateau, k) for k in ("factor", "patience", "min_lrs")}
            self.plateau.load_state_dict(state["plateau"])
            self.plateau.__dict__.update(tuned)
        past_warmup = self.per_step.last_epoch >= self.warmup_steps
        if self.plateau is not None and past_warmup:
            peaks = [group.get("initial_lr", group["lr"]) for group in groups]
            lrs = [
                lr * new / old for lr, new, old in zip(saved_lrs, peaks, saved_peaks, strict=True)
            ]
        elif self.per_step.last_epoch >= getattr(self.per_step, "total_steps", math.inf):
            lrs = saved_lrs  # a shortened one-cycle run past its end: nothing left to schedule
        else:
            self.per_step._get_lr_called_within_step = True  # get_lr at the saved step
            try:
                lrs = list(self.per_step.get_lr())
            finally:
                self.per_step._get_lr_called_within_step = False
        for group, lr in zip(groups, lrs, strict=True):
            group["lr"] = lr
        self.per_step._last_lr = lrs


def _plain_multiplier(schedule: torch.optim.lr_scheduler.LRScheduler | None) -> bool:
    """Whether ``schedule`` is a LambdaLR over plain float LRs, which
    :func:`_advance_multiplier` steps."""
    if type(schedule) is not LambdaLR:
        return False
    return all(type(group["lr"]) is float for group in schedule.optimizer.param_groups)


def _advance_multiplier(schedule: LambdaLR) -> None:
    """What ``LambdaLR.step()`` does, to the same LRs and the same state, without its
    per-call checks, warnings and context managers: they cost the default job's small model
    about 1% of its step on a CPU (paired epochs: docs/speed.md). The schedules below are a
    multiplier of each group's initial LR, set after every optimizer step."""
    schedule._step_count += 1
    schedule.last_epoch += 1
    step = schedule.last_epoch
    lrs = [base * f(step) for f, base in zip(schedule.lr_lambdas, schedule.base_lrs, strict=True)]
    for group, lr in zip(schedule.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    schedule._last_lr = lrs


def _with_warmup(warmup_steps: int, after: Callable[[int], float]) -> Callable[[int], float]:
    """Linear warmup from 1/(warmup_steps+1) of the LR to the full LR, then ``after``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        return after(step)

    return factor


@dataclass(frozen=True)
class StepCounts:
    """How many optimizer steps an epoch and the whole run take: what a schedule needs to
    know besides its YAML keys, known only once the data is built."""

    per_epoch: int
    total: int


# trainer.max_epochs=auto: AUTO_EPOCHS epochs, more for a small training set, until the run takes
# AUTO_STEPS optimizer steps (31 samples in one batch: 400 epochs), at most AUTO_MAX_EPOCHS.
AUTO_EPOCHS = 20
AUTO_STEPS = 400
AUTO_MAX_EPOCHS = 1000
FEW_STEPS = 100  # fewer optimizer steps than this rarely train a model from scratch


def epochs_for(max_epochs: int | str, steps_per_epoch: int) -> int:
    """``trainer.max_epochs``: a count, as given; ``auto``, fitted to the data's size (a
    small set needs many epochs of few steps to converge, a large one few of many)."""
    if max_epochs != "auto":
        return int(max_epochs)
    fitted = math.ceil(AUTO_STEPS / max(steps_per_epoch, 1))
    return min(AUTO_MAX_EPOCHS, max(AUTO_EPOCHS, fitted))


def _knowing_steps(start: Callable[[torch.optim.Optimizer, StepCounts], Schedule]) -> Callable:
    """``start``, whose schedule also keeps the run's step counts (trainer.swa's phase)."""

    def started(optimizer: torch.optim.Optimizer, steps: StepCounts) -> Schedule:
        schedule = start(optimizer, steps)
        schedule.steps = steps
        return schedule

    return started


# What each builder below returns: its YAML keys bound, finished in train.py with the
# optimizer and the step counts (``build(cfg.scheduler)(optimizer, steps)``).
ScheduleStart = Callable[[torch.optim.Optimizer, StepCounts], Schedule]


@checked("scheduler", warmup_steps=NON_NEGATIVE_INT, warmup_epochs=NON_NEGATIVE_INT)
def none(warmup_steps: int, warmup_epochs: int = 0) -> ScheduleStart:
    """The LR as configured; with no warmup there is nothing to step at all."""

    def start(optimizer, steps: StepCounts) -> Schedule:
        warmup = warmup_steps + warmup_epochs * steps.per_epoch  # scheduler.warmup_epochs
        if warmup == 0:
            return Schedule(None)
        return Schedule(LambdaLR(optimizer, _with_warmup(warmup, lambda step: 1.0)))

    return _knowing_steps(start)


@checked(
    "scheduler",
    warmup_steps=NON_NEGATIVE_INT,
    warmup_epochs=NON_NEGATIVE_INT,
    step_size=POSITIVE_INT,
    gamma=POSITIVE,
)
def step(warmup_steps: int, step_size: int, gamma: float, warmup_epochs: int = 0) -> ScheduleStart:
    """Multiply the LR by ``gamma`` every ``step_size`` epochs."""

    def start(optimizer, steps: StepCounts) -> Schedule:
        warmup = warmup_steps + warmup_epochs * steps.per_epoch  # scheduler.warmup_epochs

        def decay(step: int) -> float:
            return gamma ** (step // (step_size * steps.per_epoch))

        return Schedule(LambdaLR(optimizer, _with_warmup(warmup, decay)))

    return _knowing_steps(start)


@checked(
    "scheduler",
    warmup_steps=NON_NEGATIVE_INT,
    warmup_epochs=NON_NEGATIVE_INT,
    min_lr_ratio=UNIT_INTERVAL,
)
def cosine(warmup_steps: int, min_lr_ratio: float, warmup_epochs: int = 0) -> ScheduleStart:
    """Cosine decay from the LR to ``min_lr_ratio`` × LR over the steps after warmup."""

    def start(optimizer, steps: StepCounts) -> Schedule:
        warmup = warmup_steps + warmup_epochs * steps.per_epoch  # scheduler.warmup_epochs
        decay_steps = max(1, steps.total - warmup)

        def decay(step: int) -> float:
            progress = min(1.0, (step - warmup) / decay_steps)
            return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        return Schedule(LambdaLR(optimizer, _with_warmup(warmup, decay)))

    return _knowing_steps(start)


@checked(
    "scheduler",
    warmup_steps=NON_NEGATIVE_INT,
    warmup_epochs=NON_NEGATIVE_INT,
    div_factor=POSITIVE,
    final_div_factor=POSITIVE,
    anneal_strategy=one_of("cos", "linear"),
)
def onecycle(
    warmup_steps: int,
    div_factor: float,
    final_div_factor: float,
    anneal_strategy: str,
    warmup_epochs: int = 0,
) -> ScheduleStart:
    """torch's OneCycleLR peaking at ``optim.lr``; its rising phase is the warmup."""

    def start(optimizer, steps: StepCounts) -> Schedule:
        warmup = warmup_steps + warmup_epochs * steps.per_epoch  # scheduler.warmup_epochs
        max_lrs = [group["lr"] for group in optimizer.param_groups]
        total_steps = max(steps.total, 2)
        # peak LR at step warmup; at least 1: OneCycleLR divides by its rising phase's length
        pct_start = min((max(warmup, 1) + 1) / total_steps, 0.99)
        return Schedule(
            OneCycleLR(
                optimizer,
                max_lr=max_lrs,
                total_steps=total_steps,
                pct_start=pct_start,
                div_factor=div_factor,
                final_div_factor=final_div_factor,
                anneal_strategy=anneal_strategy,
                cycle_momentum=False,
            )
        )

    return _knowing_steps(start)


@checked(
    "scheduler",
    warmup_steps=NON_NEGATIVE_INT,
    warmup_epochs=NON_NEGATIVE_INT,
    mode=one_of("min", "max"),
    factor=BELOW_ONE,
    patience=NON_NEGATIVE_INT,
    min_lr=NON_NEGATIVE,
)
def plateau(
    warmup_steps: int,
    monitor: str,
    mode: str,
    factor: float,
    patience: int,
    min_lr: float,
    warmup_epochs: int = 0,
) -> ScheduleStart:
    """Multiply the LR by ``factor`` when ``monitor`` has not improved for ``patience``
    validations."""

    def start(optimizer, steps: StepCounts) -> Schedule:
        warm = warmup_steps + warmup_epochs * steps.per_epoch  # scheduler.warmup_epochs
        warmup = LambdaLR(optimizer, _with_warmup(warm, lambda step: 1.0))
        # A layer's floor is scaled like its LR (optim.layer_decay), so the ratios between
        # layers hold at the floor too.
        floors = [min_lr * group.get("lr_scale", 1.0) for group in optimizer.param_groups]
        reduce = ReduceLROnPlateau(
            optimizer, mode=mode, factor=factor, patience=patience, min_lr=floors
        )
        return Schedule(warmup, plateau=reduce, monitor=monitor, warmup_steps=warm)

    return _knowing_steps(start)
