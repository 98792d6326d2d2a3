"""``task=classification``: one class a sample; cross-entropy over the classes, label smoothing
applied once, class weights; accuracy and top-5; predictions as the k most probable classes."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from utils.errors import UserError
from utils.evaluation.metrics import (
    ClassScores,
    measured_metrics,
)
from utils.tasks._base import Task, _mixing_words, _weight_tensor, log


class Classification(Task):
    def __init__(self, label_smoothing: float, class_weights: Any, loss: str = "ce") -> None:
        self.label_smoothing, self.class_weights, self.loss_kind = (
            label_smoothing,
            class_weights,
            loss,
        )
        self.data, self.device = None, torch.device("cpu")

    @property
    def decisions(self) -> int:  # a binary classifier's one threshold, on its second class
        return 1 if self.count == 2 else 0

    @staticmethod
    def probability(logits: torch.Tensor) -> torch.Tensor:
        """What a threshold is compared with: the second class's probability."""
        return torch.softmax(logits, dim=1)[:, 1]

    def measured(self) -> list[str]:
        return measured_metrics(self.count)

    def scores(self, detailed: bool = False) -> ClassScores:
        return ClassScores(self.count, confusion=detailed, calibrated=self.calibrated)

    def nll(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        return float(F.cross_entropy(logits, targets))

    def positives(self, targets: torch.Tensor) -> torch.Tensor:
        return (targets == 1)[:, None]  # the second class

    def loss(self) -> ClassificationLoss:
        """The loss over the classes, with its class weights: ``auto`` weighs each class by
        the inverse of its frequency in the train split (mean weight 1), logged."""
        classes, weights, data, device = self.count, self.class_weights, self.data, self.device
        if weights == "auto":
            counts = torch.bincount(data.train_targets(), minlength=classes).double()
            if (counts == 0).any():
                missing = (counts == 0).nonzero().flatten().tolist()
                raise UserError(
                    f"task.class_weights=auto: classes {missing} have no training "
                    "samples; give the weights as a list instead"
                )
            weights = (counts.sum() / (classes * counts)).tolist()
            log.info(
                "class weights (inverse train frequency): %s", " ".join(f"{w:.3g}" for w in weights)
            )
        weight = _weight_tensor(weights, "class_weights", ("class", "classes"), data, device)
        return ClassificationLoss(self.label_smoothing, weight, classes, self.loss_kind)


class ClassificationLoss:
    """Cross-entropy of logits against class indices or class probabilities, smoothed once;
    or (``task.loss=bce``, timm's ``--bce-loss``) binary cross-entropy of each class's logit
    against the smoothed one-hot (or mixed) targets, as timm's ``BinaryCrossEntropy``."""

    def __init__(
        self, label_smoothing: float, weight: torch.Tensor | None, classes: int, kind: str = "ce"
    ) -> None:
        self.label_smoothing, self.weight, self.classes = label_smoothing, weight, classes
        self.kind = kind

    def training_note(self, mixing: Any) -> str | None:
        """What train/loss measures when it is not what val/loss measures (None when it is)."""
        parts = _mixing_words(mixing)
        if self.label_smoothing:
            parts.append(f"with label smoothing {self.label_smoothing:g}")
        if self.weight is not None:
            parts.append("with class weights")
        if not parts and self.kind == "ce":
            return None
        what = "binary cross-entropy per class" if self.kind == "bce" else "cross-entropy"
        return (
            f"train/loss is the {what} " + ", ".join(parts) + "; val/loss and "
            "test/loss are the plain cross-entropy of the hard labels"
        )

    def smoothed(self, probabilities: torch.Tensor) -> torch.Tensor:
        """What soft targets train toward: ``(1 - ε) · target + ε / C`` (each row still sums to 1)."""
        if not self.label_smoothing:
            return probabilities
        return probabilities * (1 - self.label_smoothing) + self.label_smoothing / self.classes

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.kind == "bce":  # one-hot (or mixed) targets, smoothed, each class a yes/no
            if not targets.is_floating_point():
                targets = F.one_hot(targets, self.classes).to(logits.dtype)
            return F.binary_cross_entropy_with_logits(
                logits, self.smoothed(targets), weight=self.weight
            )
        # F.cross_entropy by attribute: the fault-injection tests replace it.
        if targets.is_floating_point():  # mixed: probabilities, smoothed here and only here
            return F.cross_entropy(logits, self.smoothed(targets), weight=self.weight)
        return F.cross_entropy(
            logits, targets, weight=self.weight, label_smoothing=self.label_smoothing
        )
