"""``task``: what the model is trained to predict, and so the loss the training step computes.

    python train.py task.label_smoothing=0.1 task.class_weights=auto

``task=classification`` (conf/task/classification.yaml): cross-entropy over the dataset's
classes. Targets reach the loss as class indices, or as probabilities over the classes when
MixUp/CutMix mixed the batch (data/mixing.py). Label smoothing is applied exactly once to
either: ``(1 - ε) · target + ε / C``. Validation and test always measure the plain
cross-entropy of the hard labels (utils/evaluation.py), so their losses compare across runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from utils.arguments import Rule, checked
from utils.errors import UserError

log = logging.getLogger("torchloom")

SMOOTHING = Rule(lambda v: isinstance(v, float | int) and not isinstance(v, bool) and 0 <= v < 1,
                 "at least 0 and below 1")  # fmt: skip
CLASS_WEIGHTS = Rule(
    lambda v: v is None or v == "auto" or (
        isinstance(v, Sequence) and not isinstance(v, str) and len(v) >= 1
        and all(isinstance(w, float | int) and not isinstance(w, bool) and w > 0 for w in v)
    ),
    "null, auto, or a list of one positive weight per class",
)  # fmt: skip


@checked("task", label_smoothing=SMOOTHING, class_weights=CLASS_WEIGHTS)
def classification(label_smoothing: float, class_weights: Any) -> Classification:
    """conf/task/classification.yaml."""
    return Classification(float(label_smoothing), class_weights)


class Classification:
    """Single-label classification; ``loss_for(data, device)`` finishes it for one run."""

    def __init__(self, label_smoothing: float, class_weights: Any) -> None:
        self.label_smoothing, self.class_weights = label_smoothing, class_weights

    def loss_for(self, data: Any, device: torch.device) -> ClassificationLoss:
        """The loss over ``data``'s classes, its class weights on ``device``: ``auto`` weighs
        each class by the inverse of its frequency in the train split (mean weight 1),
        logged once."""
        classes, weights = data.num_classes, self.class_weights
        if weights == "auto":
            counts = torch.bincount(data.train_labels(), minlength=classes).double()
            if (counts == 0).any():
                missing = (counts == 0).nonzero().flatten().tolist()
                raise UserError(f"task.class_weights=auto: classes {missing} have no training "
                                "samples; give the weights as a list instead")  # fmt: skip
            weights = (counts.sum() / (classes * counts)).tolist()
            log.info("class weights (inverse train frequency): %s",
                     " ".join(f"{w:.3g}" for w in weights))  # fmt: skip
        if weights is not None and len(weights) != classes:
            raise UserError(f"task.class_weights has {len(weights)} values; {data.name} has "
                            f"{classes} classes: give one per class, or auto")  # fmt: skip
        weight = None if weights is None else torch.tensor(weights, dtype=torch.float32,
                                                           device=device)  # fmt: skip
        return ClassificationLoss(self.label_smoothing, weight, classes)


class ClassificationLoss:
    """Cross-entropy of logits against class indices or class probabilities, smoothed once."""

    def __init__(self, label_smoothing: float, weight: torch.Tensor | None, classes: int) -> None:
        self.label_smoothing, self.weight, self.classes = label_smoothing, weight, classes

    def training_note(self, mixing: Any) -> str | None:
        """What train/loss measures when it is not what val/loss measures (None when it is)."""
        parts = []
        if mixing:
            epochs = (
                f"the first {mixing.mix_off_epoch} epochs"
                if mixing.mix_off_epoch
                else "every epoch"
            )
            parts.append(f"on MixUp/CutMix-mixed targets in {epochs}")
        if self.label_smoothing:
            parts.append(f"with label smoothing {self.label_smoothing:g}")
        if self.weight is not None:
            parts.append("with class weights")
        if not parts:
            return None
        return (
            "train/loss is the cross-entropy " + ", ".join(parts) + "; val/loss and "
            "test/loss are the plain cross-entropy of the hard labels"
        )

    def smoothed(self, probabilities: torch.Tensor) -> torch.Tensor:
        """What soft targets train toward: ``(1 - ε) · target + ε / C`` (each row still sums to 1)."""
        if not self.label_smoothing:
            return probabilities
        return probabilities * (1 - self.label_smoothing) + self.label_smoothing / self.classes

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # F.cross_entropy by attribute: the fault-injection tests replace it.
        if targets.is_floating_point():  # mixed: probabilities, smoothed here and only here
            return F.cross_entropy(logits, self.smoothed(targets), weight=self.weight)
        return F.cross_entropy(logits, targets, weight=self.weight,
                               label_smoothing=self.label_smoothing)  # fmt: skip
