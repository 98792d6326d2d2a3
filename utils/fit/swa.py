"""``trainer.swa``: stochastic weight averaging (Izmailov et al., 2018), the model validation,
best.pt, the final test and the exports judge once it has begun.

``start: E`` (an epoch count, or a fraction of ``trainer.max_epochs``): the first E epochs
train as configured. From epoch E+1 on, the LR leaves the schedule: it anneals (cosine, over
``anneal_epochs`` epochs of optimizer steps) from where the schedule left it to ``lr`` and
stays there (each layer's ``lr`` scaled like its LR, ``optim.layer_decay``); ``lr: null``
keeps the schedule. At the end of each of those epochs the weights join an equal-weight
average, and the average's BatchNorm statistics are recomputed: a pass over the train split
in order and without augmentation, in train mode with ``momentum=None`` (a cumulative average
over the batches; under torchrun, averaged over the processes' shards). The momentum is put
back afterwards: setting it to 0 instead would freeze the statistics (Lightning #14866).

Before E the averaged model is a copy of the trained one, refreshed at each epoch's end, so the
model validation judges is the same object throughout. A checkpoint holds the average (its
weights with their statistics, and the number of epochs in it) beside the raw weights, and the
LR phase in ``scheduler``, so a resume on either side of E continues exactly; evaluate.py,
predict.py and the exports choose it with ``weights=swa`` (the default when it is there).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from utils.errors import UserError
from utils.model.weights import load_weights, unwrap
from utils.precision import Precision
from utils.schedulers import Schedule
from utils.system import distributed


def start_epoch(start: Any, max_epochs: int) -> int | None:
    """``trainer.swa.start`` as the number of epochs before averaging begins (None: off)."""
    if start is None:
        return None
    if isinstance(start, bool) or not isinstance(start, int | float) or not math.isfinite(start):
        raise UserError(
            f"trainer.swa.start={start!r} must be an epoch count or a fraction of "
            "trainer.max_epochs, or null for off"
        )
    epochs = int(start * max_epochs) if isinstance(start, float) and 0 < start < 1 else start
    if epochs != int(epochs) or not 0 <= epochs < max(max_epochs, 1):
        raise UserError(
            f"trainer.swa.start={start} must be a whole number of epochs from 0 to "
            f"{max_epochs - 1} (trainer.max_epochs={max_epochs}) or a fraction "
            "between 0 and 1"
        )
    return int(epochs)


def check_swa(config: Any, max_epochs: int) -> int | None:
    """``trainer.swa``'s settings (the config alone: checked before any data is read); the
    epoch averaging starts after, None when off."""
    epochs = start_epoch(config.start, max_epochs)
    if epochs is None:
        return None
    if config.lr is not None and not (math.isfinite(config.lr) and config.lr > 0):
        raise UserError(
            f"trainer.swa.lr={config.lr} must be greater than 0, or null to keep the schedule's LR"
        )
    if config.anneal_epochs < 0:
        raise UserError(f"trainer.swa.anneal_epochs={config.anneal_epochs} must be 0 or more")
    return epochs


class StochasticAverage:
    """The equal-weight average of the weights at the end of each epoch after ``start``."""

    def __init__(self, model: nn.Module, start: int) -> None:
        self.module = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.start, self.updates = start, 0
        trained = unwrap(model)
        self.pairs = list(
            zip(trained.state_dict().values(), self.module.state_dict().values(), strict=True)
        )

    @classmethod
    def of(cls, config: Any, model: nn.Module, max_epochs: int) -> StochasticAverage | None:
        """``trainer.swa`` for ``model`` (its unwrapped module); None when ``start`` is null."""
        epochs = check_swa(config, max_epochs)
        return None if epochs is None else cls(model, epochs)

    @torch.no_grad()
    def epoch_finished(self, epoch: int, batches: Iterable, precision: Precision) -> None:
        """After epoch ``epoch`` (counted from 1): before ``start``, the average is the trained
        model; after it, the weights join the average and its BatchNorm statistics are
        recomputed on ``batches`` (the train split, in order, unaugmented)."""
        if epoch <= self.start:
            for trained, averaged in self.pairs:
                averaged.copy_(trained)
            return
        self.updates += 1
        for trained, averaged in self.pairs:
            if averaged.is_floating_point():
                averaged.lerp_(trained, 1.0 / self.updates)
            else:  # counters
                averaged.copy_(trained)
        recompute_batchnorm(self.module, batches, precision)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: Any, where: str) -> None:
        """The average a checkpoint at ``where`` holds, its types checked (it is untrusted)."""
        updates = state.get("updates") if isinstance(state, dict) else None
        ok = (
            isinstance(state, dict)
            and isinstance(state.get("model"), dict)
            and isinstance(updates, int)
            and not isinstance(updates, bool)
            and updates >= 0
        )
        if not ok:
            raise UserError(
                f"{where}: its swa entry is not what torchloom writes (was it "
                "edited?); use init_from=... for its weights"
            )
        load_weights(self.module, state["model"])
        self.updates = updates


@torch.no_grad()
def recompute_batchnorm(model: nn.Module, batches: Iterable, precision: Precision) -> bool:
    """Recompute every BatchNorm's running statistics of ``model`` as the cumulative average
    over ``batches`` (momentum None), then put each momentum back; False when it has none.
    Under torchrun every process ends with the mean over all processes' statistics."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    norms = [m for m in norms if m.track_running_stats]
    if not norms:
        return False
    momenta = [m.momentum for m in norms]
    was_training = model.training
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative: every batch counts the same
    model.train()
    for inputs, _ in batches:
        with precision.autocast():
            model(inputs)
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum
        if distributed.is_distributed():
            for statistic in (norm.running_mean, norm.running_var):
                statistic.copy_(distributed.all_sum(statistic) / torch.distributed.get_world_size())
    model.train(was_training)
    return True


class AveragingSchedule:
    """The run's schedule until ``trainer.swa.start``, then SWA's: from the LR the schedule
    reached, a cosine anneal to ``trainer.swa.lr`` over ``anneal_epochs`` epochs of optimizer
    steps, then that LR. Counts the steps taken, so the phase is saved and resumed with it."""

    def __init__(self, schedule: Schedule, optimizer: Any, config: Any, start: int) -> None:
        self.base, self.optimizer = schedule, optimizer
        self.start_step = start * schedule.steps.per_epoch
        self.anneal_steps = config.anneal_epochs * schedule.steps.per_epoch
        self.lr = config.lr
        self.taken = 0
        self.lr_start: list[float] | None = None  # each group's LR when SWA's phase began

    def after_optimizer_step(self) -> None:
        self.taken += 1
        if self.taken < self.start_step or self.lr is None:
            self.base.after_optimizer_step()
            return
        groups = self.optimizer.param_groups
        if self.lr_start is None:
            self.lr_start = [group["lr"] for group in groups]
        done = (
            1.0
            if self.anneal_steps == 0
            else min(1.0, (self.taken - self.start_step + 1) / self.anneal_steps)
        )
        toward = (1 - math.cos(math.pi * done)) / 2
        for group, begun in zip(groups, self.lr_start, strict=True):
            target = self.lr * group.get("lr_scale", 1.0)
            group["lr"] = begun + (target - begun) * toward

    def after_validation(self, metrics: dict[str, float]) -> None:
        if self.taken < self.start_step or self.lr is None:  # SWA's LR is not reduced
            self.base.after_validation(metrics)

    def state_dict(self) -> dict:
        return {**self.base.state_dict(), "swa": {"taken": self.taken, "lr_start": self.lr_start}}

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state)
        phase = state["swa"]
        taken, begun = phase["taken"], phase["lr_start"]
        if not isinstance(taken, int) or isinstance(taken, bool) or taken < 0:
            raise ValueError("swa.taken")
        groups = len(self.optimizer.param_groups)  # one LR each: zip() would fail mid-step
        if begun is not None and not (
            isinstance(begun, list)
            and len(begun) == groups
            and all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in begun)
        ):
            raise ValueError("swa.lr_start")
        self.taken, self.lr_start = taken, begun

    def continue_changed(self, state: dict, optimizer: Any, built: list[dict]) -> None:
        self.base.continue_changed(state, optimizer, built)
        self.load_state_dict({**self.base.state_dict(), "swa": state["swa"]})
