"""``task=multilabel``: a set of labels a sample; binary cross-entropy per label with
``pos_weight``; mAP and F1; predictions as the labels whose probability reaches a threshold."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from utils.config.arguments import BELOW_ONE
from utils.errors import UserError
from utils.evaluation import tables as eval_tables
from utils.evaluation.metrics import (
    LABEL_SET_METRICS,
    LabelSetScores,
)
from utils.tasks._base import Task, _mixing_words, _weight_tensor, log
from utils.text import cell


def label_sets(
    probabilities: torch.Tensor, names: list[str], thresholds: list[float]
) -> list[list[tuple[str, float]]]:
    """Each row's labels whose probability reaches its threshold, most probable first."""
    rows = []
    for row in probabilities.tolist():
        chosen = [(names[i], p) for i, p in enumerate(row) if p >= thresholds[i]]
        rows.append(sorted(chosen, key=lambda pair: -pair[1]))
    return rows


class MultiLabel(Task):
    targets = "label_sets"
    name = "multilabel"
    distills = False  # independent sigmoids, not one distribution over classes
    unit = "labels"
    outputs = "label scores (the dataset's labels)"
    monitor = "val/map"
    quiet_guards = ("probability_outputs",)  # softmax before cross-entropy: a classifier's
    simple_models = None  # no baseline of label sets (yet)

    def __init__(self, pos_weight: Any, threshold: float) -> None:
        self.pos_weight, self.threshold = pos_weight, threshold
        self.data, self.device = None, torch.device("cpu")

    @property
    def decisions(self) -> int:  # a threshold a label
        return self.count

    probability = staticmethod(torch.sigmoid)  # what a label's threshold is compared with

    def measured(self) -> list[str]:
        return list(LABEL_SET_METRICS)

    def scores(self, detailed: bool = False) -> LabelSetScores:
        return LabelSetScores(self.count, self.threshold, detailed, self.calibrated)

    def record(self) -> dict:
        return {"threshold": self.threshold, **super().record()}

    def nll(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        return float(F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype)))

    def positives(self, targets: torch.Tensor) -> torch.Tensor:
        return targets > 0.5  # a label with no positive validation sample keeps task.threshold

    def evidence(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        """Each label's scores and truth (ROC and PR curves), and each sample's mean BCE."""
        truth = targets.float()
        loss = F.binary_cross_entropy_with_logits(outputs.float(), truth, reduction="none")
        return {
            "scores": torch.sigmoid(outputs.float()),
            "truth": truth,
            "loss": loss.mean(dim=1),
        }

    def shown_targets(self, targets: torch.Tensor) -> list[str]:
        """Its labels' indices, a;b (- for none)."""
        return [
            ";".join(str(i) for i, on in enumerate(row) if on >= 0.5) or "-"
            for row in targets.tolist()
        ]

    def tables(self, out: Any, where: tuple[str, int | None], metrics: dict, split: str) -> dict:
        return eval_tables.label_tables(out, where[0], metrics, split, self.names)

    def target_cells(self, targets: torch.Tensor) -> list[str]:
        """Its label set, ``a;b`` (empty for none)."""
        names = self.names
        return [
            cell(";".join(names[i] for i, on in enumerate(row) if on >= 0.5))
            for row in targets.tolist()
        ]

    def decode(self, outputs: torch.Tensor, options: Any) -> tuple[list[str], list, list[str]]:
        """The label set at the thresholds (``options.threshold`` for every label, else the
        calibration's one a label, else the task's), then every label's probability (with a
        stored temperature applied)."""
        thresholds = [self.threshold] * self.count
        if self.calibrated is not None:
            outputs = self.calibrated.logits(outputs)
            thresholds = list(self.calibrated.thresholds or thresholds)
        if options.threshold is not None:
            if not BELOW_ONE.test(options.threshold):
                raise UserError(f"threshold={options.threshold} must be above 0 and below 1")
            thresholds = [float(options.threshold)] * self.count
        names, probabilities = self.names, torch.sigmoid(outputs)
        chosen = label_sets(probabilities, names, thresholds)
        rows = [
            [cell(";".join(n for n, _ in sets)), *map(repr, row)]
            for sets, row in zip(chosen, probabilities.tolist(), strict=True)
        ]
        shown_at = f"{thresholds[0]:g}" if len(set(thresholds)) == 1 else "its thresholds"
        lines = [
            "  ".join(f"{n} {p:.3f}" for n, p in sets) or f"(none at {shown_at})" for sets in chosen
        ]
        return ["labels", *(cell(f"p_{n}") for n in names)], rows, lines

    def loss(self) -> MultiLabelLoss:
        """BCE with logits per label; ``pos_weight=auto`` weighs each label's positives by its
        negatives/positives in the train split (logged)."""
        weights, data, device = self.pos_weight, self.data, self.device
        if weights == "auto":
            train = data.train_targets()
            positives = train.double().sum(dim=0)
            if (positives == 0).any():
                missing = (positives == 0).nonzero().flatten().tolist()
                raise UserError(
                    f"task.pos_weight=auto: labels {missing} have no positive "
                    "training sample; give the weights as a list instead"
                )
            weights = ((len(train) - positives) / positives).tolist()
            log.info(
                "positive weights (negatives/positives of each label): %s",
                " ".join(f"{w:.3g}" for w in weights),
            )
        return MultiLabelLoss(
            _weight_tensor(weights, "pos_weight", ("label", "labels"), data, device)
        )


class MultiLabelLoss:
    """Binary cross-entropy with logits, averaged over samples and labels."""

    def __init__(self, pos_weight: torch.Tensor | None) -> None:
        self.pos_weight = pos_weight

    def training_note(self, mixing: Any) -> str | None:
        parts = _mixing_words(mixing) + (
            ["with positive weights"] if self.pos_weight is not None else []
        )
        if not parts:
            return None
        return (
            "train/loss is the binary cross-entropy " + ", ".join(parts) + "; val/loss "
            "and test/loss are the plain binary cross-entropy"
        )

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits, targets, pos_weight=self.pos_weight)
