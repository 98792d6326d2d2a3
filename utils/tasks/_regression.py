"""``task=regression``: numbers a sample; MSE, Huber or L1 on standardised targets, the target
scale kept in every checkpoint; MAE, RMSE and R² in the targets' own units."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from utils.config.trust import stored_floats
from utils.errors import UserError
from utils.evaluation import tables as eval_tables
from utils.evaluation.metrics import (
    VALUE_METRICS,
    ValueScores,
)
from utils.tasks._base import Task, log
from utils.text import cell


class TargetScale:
    """Regression targets as the model learns them: ``(y - mean) / std`` per target, and back.
    ``center`` is the train mean even when not standardising, so R²'s sums stay accurate."""

    def __init__(
        self, mean: list[float], std: list[float], center: list[float], device: torch.device
    ) -> None:
        self.count = len(mean)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device)
        self.std = torch.tensor(std, dtype=torch.float32, device=device)
        self.center = torch.tensor(center, dtype=torch.float64, device=device)
        self.identity = all(m == 0 for m in mean) and all(s == 1 for s in std)

    def apply(self, targets: torch.Tensor) -> torch.Tensor:
        return targets if self.identity else (targets - self.mean) / self.std

    def undo(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs if self.identity else outputs * self.std + self.mean

    def record(self) -> dict:
        return {
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "center": self.center.tolist(),
        }

    @classmethod
    def from_record(cls, record: Any, count: int, device: torch.device) -> TargetScale:
        """The scale a checkpoint stored (untrusted: checked)."""

        ok = isinstance(record, dict) and all(
            stored_floats(record.get(key), count, divisor=key == "std")
            for key in ("mean", "std", "center")
        )
        if not ok:
            raise UserError(
                "the checkpoint's target scale is not what torchloom writes (was it edited?)"
            )
        return cls(record["mean"], record["std"], record["center"], device)


class Regression(Task):
    targets = "values"
    name = "regression"
    unit = "values"
    outputs = "values (the dataset's targets)"
    monitor = "val/mae"
    mixes = False  # a blend of two targets is not a target
    distills = False  # values, not a distribution over classes
    quiet_guards = ("probability_outputs",)
    simple_models = "regressor"

    def __init__(self, loss: str, huber_delta: float, standardize_targets: bool) -> None:
        self.criterion, self.huber_delta = loss, huber_delta
        self.standardize_targets = standardize_targets
        self.scale: TargetScale | None = None
        self.data: Any = None

    def fitted(self, data: Any, device: torch.device, stored: dict | None = None) -> Regression:
        """Fitted to ``data`` on ``device``: the target scale of the train split, or the one a
        checkpoint ``stored`` (its :class:`utils.checkpoint.record.InputRecord`): evaluation undoes
        what training applied."""
        fitted = Regression(self.criterion, self.huber_delta, self.standardize_targets)
        fitted.fitted_to, fitted.data = self.check(data), data
        count = fitted.fitted_to.count
        if stored is not None:
            fitted.scale = TargetScale.from_record(stored.task.get("target_scale"), count, device)
            return fitted
        train = data.train_targets().double()
        center = train.mean(dim=0)
        std = train.std(dim=0).nan_to_num(1.0) if len(train) > 1 else torch.ones(count)
        std = torch.where(std > 0, std, torch.ones_like(std))
        if self.standardize_targets:
            fitted.scale = TargetScale(center.tolist(), std.tolist(), center.tolist(), device)
            log.info(
                "targets standardised with the train split's mean %s and std %s; "
                "predictions and metrics are in the targets' units",
                _shown(center),
                _shown(std),
            )
        else:
            fitted.scale = TargetScale([0.0] * count, [1.0] * count, center.tolist(), device)
        return fitted

    def measured(self) -> list[str]:
        return list(VALUE_METRICS)

    def scores(self, detailed: bool = False) -> ValueScores:
        loss = RegressionLoss(self.criterion, self.huber_delta, self.scale)
        return ValueScores(loss, self.scale, detailed)

    def record(self) -> dict:
        return {"target_scale": self.scale.record()}

    def evidence(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        """Predictions and targets in the targets' own units; a sample's loss is its mean
        absolute error over the targets."""
        predicted = self.portable(outputs).double()
        return {
            "estimate": predicted,
            "actual": targets.double(),
            "loss": (predicted - targets.double()).abs().mean(dim=1),
        }

    def shown_targets(self, targets: torch.Tensor) -> list[str]:
        return [";".join(f"{v:.3g}" for v in row) for row in targets.tolist()]

    def tables(self, out: Any, where: tuple[str, int | None], metrics: dict, split: str) -> dict:
        return eval_tables.value_tables(out, where[0], metrics, split, self.names)

    def target_cells(self, targets: torch.Tensor) -> list[str]:
        """Its values in full (``repr``), ``;`` between targets."""
        return [";".join(repr(v) for v in row) for row in targets.double().tolist()]

    def portable(self, outputs: torch.Tensor) -> torch.Tensor:
        """In the targets' own units: each fold's target scale is its own train part's."""
        return self.scale.undo(outputs.to(self.scale.mean.device)).cpu()

    def pooled_scores(self) -> ValueScores:
        """Scores of values in the targets' units (the loss too)."""
        count, center = self.scale.count, self.scale.center.tolist()
        identity = TargetScale([0.0] * count, [1.0] * count, center, torch.device("cpu"))
        return ValueScores(RegressionLoss(self.criterion, self.huber_delta, identity), identity)

    def decode(self, outputs: torch.Tensor, options: Any) -> tuple[list[str], list, list[str]]:
        """Each target's predicted value, in the targets' own units (the scale undone)."""
        names, values = self.names, self.scale.undo(outputs.to(self.scale.mean.device)).tolist()
        rows = [[repr(v) for v in row] for row in values]
        lines = [
            "  ".join(f"{n}={v:.6g}" for n, v in zip(names, row, strict=True)) for row in values
        ]
        return [cell(n) for n in names], rows, lines

    def exportable(
        self, model: nn.Module
    ) -> tuple[nn.Module, tuple[str, ...], torch.Tensor | None]:
        """The model with the target scale undone inside it, so an export's ``values`` are in
        the targets' own units; parity is measured in the model's (scaled) units."""
        return Unscaled(model, self.scale), ("values",), self.scale.std.detach().cpu()

    def loss(self) -> RegressionLoss:
        return RegressionLoss(self.criterion, self.huber_delta, self.scale)


class Unscaled(nn.Module):
    """A regression model whose outputs are in the targets' own units: ``model(x)·std + mean``
    (for exports, which carry no target scale beside them)."""

    def __init__(self, model: nn.Module, scale: TargetScale) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", scale.mean.detach().clone())
        self.register_buffer("std", scale.std.detach().clone())

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs) * self.std + self.mean


def _shown(values: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values.tolist()) + "]"


class RegressionLoss:
    """MSE, Huber or L1 between the outputs and the (scaled) targets, averaged over samples
    and targets."""

    def __init__(self, criterion: str, huber_delta: float, scale: TargetScale) -> None:
        self.criterion, self.huber_delta, self.scale = criterion, huber_delta, scale

    def training_note(self, mixing: Any) -> str | None:
        return None  # val/loss is the same criterion on the same scale

    def __call__(
        self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
    ) -> torch.Tensor:
        scaled = self.scale.apply(targets)
        if self.criterion == "mse":
            return F.mse_loss(outputs, scaled, reduction=reduction)
        if self.criterion == "l1":
            return F.l1_loss(outputs, scaled, reduction=reduction)
        return F.huber_loss(outputs, scaled, reduction=reduction, delta=self.huber_delta)
