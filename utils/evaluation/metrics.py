"""Evaluating a model on a split: what each task measures (utils/tasks.py makes the scores).

- classification: ``loss`` (cross-entropy), ``acc``, ``acc_top5`` (more than 5 classes);
  detailed (evaluate.py, the end of training): ``nll``, ``brier``, ``ece``, ``mce``, and for two
  classes ``auroc`` and ``ap`` of the second;
- multilabel: ``loss`` (binary cross-entropy per label), ``map`` (mean average precision over
  the labels that occur), ``f1_micro``, ``f1_macro`` and ``subset_acc`` (every label right),
  the last three at the task's threshold (or a calibration's, one a label); detailed: ``auroc``;
- regression: ``loss`` (the training criterion, in the units the model is trained in), and in
  the targets' own units ``mae``, ``rmse`` and ``r2``, each averaged over the targets.

Sums stay on the device; there is one host synchronisation, at the end. Under torchrun each
process evaluates its shard and the sums are added across processes (average precision, which
ranks every sample, gathers the shards' scores), so every process gets the figures of the
whole split.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from utils.evaluation.calibration import Calibration, roc_aucs
from utils.precision import Precision
from utils.system.distributed import all_rows, all_sum
from utils.system.sharding import device_of, evened, without_grad

TOP5 = "acc_top5"
LABEL_SET_METRICS = ["loss", "map", "f1_micro", "f1_macro", "subset_acc"]
VALUE_METRICS = ["loss", "mae", "rmse", "r2"]


def measured_metrics(num_classes: int) -> list[str]:
    """What classification measures for ``num_classes`` classes: top-5 accuracy only when
    there are more than 5."""
    return ["loss", "acc"] + ([TOP5] if num_classes > 5 else [])


def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    precision: Precision,
    scores: Any,
) -> dict:
    """The task's metrics over every sample of ``batches``, in eval mode: ``scores`` (from
    the task's ``scores()``) adds up each batch's outputs and targets."""
    with without_grad(model):
        return _evaluate(model, batches, precision, scores)


def _evaluate(model: nn.Module, batches: Any, precision: Precision, scores: Any) -> dict:
    was_training = model.training
    model.eval()
    device = device_of(model)
    for inputs, targets in evened(batches, model):  # FSDP: as many calls in every process
        with precision.autocast():
            outputs = model(inputs)
        if targets is not None:
            scores.add(outputs.float(), targets)
    model.train(was_training)
    return scores.result(device)


def figures(metrics: dict) -> dict:
    """The single numbers of detailed ``metrics`` (what a run's log and metrics.json hold):
    without the confusion matrix, the reliability table and per-label or per-target lists."""
    return {key: value for key, value in metrics.items() if isinstance(value, float)}


def outputs_of(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], precision: Precision
) -> tuple[torch.Tensor, torch.Tensor]:
    """(outputs, targets) of every sample of ``batches`` in order, in eval mode, fp32 on the
    CPU; under torchrun the processes' shards in rank order, so every process has them all."""
    with without_grad(model):
        return _outputs_of(model, batches, precision)


def _outputs_of(model: nn.Module, batches: Any, precision: Precision) -> tuple:
    was_training = model.training
    model.eval()
    outputs, targets = [], []
    for inputs, target in evened(batches, model):  # FSDP: as many calls in every process
        with precision.autocast():
            output = model(inputs).float()
        if target is not None:
            outputs.append(output)
            targets.append(target)
    model.train(was_training)
    device = device_of(model)
    joined = torch.cat(outputs) if outputs else torch.zeros(0, device=device)
    return all_rows(joined).cpu(), all_rows(torch.cat(targets) if targets else joined).cpu()


CALIBRATION_BINS = 15


def calibration(
    confidence: torch.Tensor, correct: torch.Tensor, bins: int = CALIBRATION_BINS
) -> dict:
    """Expected and maximum calibration error of top-1 ``confidence`` against ``correct``,
    over ``bins`` equal-width bins ``(lo, hi]``: the first also holds a confidence of 0 and the
    last is closed at 1, so float32 softmax's saturated 1.0 counts (no hidden extra bin).
    ECE = Σ (n_b / N) · |accuracy_b − confidence_b|; MCE = the largest gap of a non-empty bin.
    ``reliability``: each bin's lo, hi, count, accuracy and mean confidence."""
    confidence = confidence.double().cpu().nan_to_num(0.0, 0.0, 0.0)  # NaN outputs: no confidence
    correct = correct.double().cpu()
    index = (torch.ceil(confidence * bins) - 1).clamp(0, bins - 1).long()
    count = torch.bincount(index, minlength=bins).double()
    hits = torch.bincount(index, weights=correct, minlength=bins)
    sure = torch.bincount(index, weights=confidence, minlength=bins)
    filled = count > 0
    accuracy = torch.where(filled, hits / count.clamp(min=1), torch.zeros_like(count))
    mean_confidence = torch.where(filled, sure / count.clamp(min=1), torch.zeros_like(count))
    gap = (accuracy - mean_confidence).abs()
    total = max(1.0, float(count.sum()))
    rows = [
        {
            "lo": b / bins,
            "hi": (b + 1) / bins,
            "count": int(count[b]),
            "accuracy": float(accuracy[b]),
            "confidence": float(mean_confidence[b]),
        }
        for b in range(bins)
    ]
    return {
        "ece": float((count / total * gap).sum()),
        "mce": float(gap[filled].max()) if bool(filled.any()) else 0.0,
        "reliability": rows,
    }


class ClassScores:
    """Loss and top-1/top-5 hits; with ``confusion`` (evaluate.py's detailed scores), the
    confusion matrix (rows: true class, columns: predicted) and how far the probabilities can
    be trusted: NLL, the Brier score, ECE and MCE (:func:`calibration`) and the reliability
    table; for two classes also ROC-AUC and average precision of the second class.

    A ``calibrated`` model's logits are divided by its temperature first, and a binary
    classifier with a threshold predicts its second class when that class's probability
    reaches it (utils/evaluation/calibration.py), as predict.py's rows do."""

    def __init__(
        self, classes: int, confusion: bool = False, calibrated: Calibration | None = None
    ) -> None:
        self.classes, self.confusion, self.calibrated = classes, confusion, calibrated
        self.top_k = 5 if TOP5 in measured_metrics(classes) else 1
        thresholds = calibrated.thresholds if calibrated else None
        self.threshold = thresholds[0] if thresholds and classes == 2 else None
        self.sums: torch.Tensor | None = None  # [loss, top-1 hits, top-k hits]
        self.counts: torch.Tensor | None = None  # confusion counts, flattened
        self.kept: list[torch.Tensor] = []  # detailed: [confidence, correct, brier(, p, y)] rows
        self.count = 0

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        if self.calibrated is not None:
            logits = self.calibrated.logits(logits)
        top = logits.topk(self.top_k, dim=1).indices
        if self.threshold is not None:  # the second class at or above its threshold
            top = (torch.softmax(logits, dim=1)[:, 1:] >= self.threshold).long()
        hits = top == labels[:, None]
        batch = torch.stack(
            [
                F.cross_entropy(logits, labels, reduction="sum"),
                hits[:, 0].sum().float(),
                hits.any(dim=1).sum().float(),
            ]
        )
        self.sums = batch if self.sums is None else self.sums + batch
        if self.confusion:
            pairs = labels * self.classes + top[:, 0]
            counts = torch.bincount(pairs, minlength=self.classes * self.classes)
            self.counts = counts if self.counts is None else self.counts + counts
            probabilities = torch.softmax(logits, dim=1)
            confidence, most = probabilities.max(dim=1)
            brier = (probabilities - F.one_hot(labels, self.classes)).square().sum(dim=1)
            columns = [confidence, (most == labels).float(), brier]  # top-1's calibration
            if self.classes == 2:  # the ranking of the second class (ROC-AUC, AP)
                columns += [probabilities[:, 1], (labels == 1).float()]
            self.kept.append(torch.stack(columns, dim=1))
        self.count += len(labels)

    def result(self, device: torch.device) -> dict:
        sums = self.sums if self.sums is not None else torch.zeros(3, device=device)
        count = int(all_sum(torch.tensor(self.count, device=sums.device)).item())
        if count == 0:
            return {}
        loss, acc, acc_top_k = (all_sum(sums) / count).tolist()
        metrics = {"loss": loss, "acc": acc}
        if self.top_k == 5:
            metrics[TOP5] = acc_top_k
        if self.confusion:
            counts = self.counts
            if counts is None:  # this process's shard was empty; the others' still count
                counts = torch.zeros(self.classes**2, dtype=torch.long, device=sums.device)
            metrics["confusion"] = all_sum(counts).view(self.classes, self.classes).cpu()
            width = 5 if self.classes == 2 else 3
            kept = torch.cat(self.kept) if self.kept else torch.zeros(0, width, device=sums.device)
            kept = all_rows(kept).cpu()
            metrics.update({"nll": loss, "brier": float(kept[:, 2].double().mean())})
            if self.classes == 2:
                metrics["auroc"] = roc_aucs(kept[:, 3:4], kept[:, 4:5])[0]
                metrics["ap"] = average_precisions(kept[:, 3:4], kept[:, 4:5])[0]
            metrics.update(calibration(kept[:, 0], kept[:, 1]))
        return metrics


def per_class_scores(confusion: torch.Tensor) -> dict[str, list[float]]:
    """Precision, recall and F1 of each class from a confusion matrix (rows: true class).
    A class never predicted (or never present) scores 0 rather than dividing by zero."""
    confusion = confusion.double()
    hits = confusion.diagonal()
    precision = hits / confusion.sum(dim=0).clamp(min=1)
    recall = hits / confusion.sum(dim=1).clamp(min=1)
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    return {"precision": precision.tolist(), "recall": recall.tolist(), "f1": f1.tolist()}


class LabelSetScores:
    """Per-label counts at ``threshold`` (true and false positives, false negatives), exact
    matches and the binary cross-entropy; the sigmoid scores are kept for average precision.
    ``detailed``: also each label's AP, ROC-AUC, precision, recall, F1 and support (and the
    mean ROC-AUC). A ``calibrated`` model's logits are divided by its temperature first, and
    its thresholds, one a label, replace ``threshold`` (utils/evaluation/calibration.py)."""

    def __init__(
        self,
        labels: int,
        threshold: float,
        detailed: bool = False,
        calibrated: Calibration | None = None,
    ) -> None:
        self.labels, self.detailed, self.calibrated = labels, detailed, calibrated
        chosen = calibrated.thresholds if calibrated and calibrated.thresholds else [threshold]
        cut = torch.tensor(chosen, dtype=torch.float64)
        self.cut = (cut / (1 - cut)).log().float()  # sigmoid(z) >= t  <=>  z >= cut
        self.sums: torch.Tensor | None = None  # [loss, exact matches]
        self.counts: torch.Tensor | None = None  # [3, labels]: tp, fp, fn
        self.scores: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []
        self.count = 0

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        if self.calibrated is not None:
            logits = self.calibrated.logits(logits)
        if self.cut.device != logits.device:
            self.cut = self.cut.to(logits.device)
        predicted, truth = logits >= self.cut, targets > 0.5
        loss = F.binary_cross_entropy_with_logits(logits, targets.float(), reduction="sum")
        batch = torch.stack([loss / self.labels, (predicted == truth).all(dim=1).sum().float()])
        counts = torch.stack(
            [(predicted & truth).sum(0), (predicted & ~truth).sum(0), (~predicted & truth).sum(0)]
        )
        self.sums = batch if self.sums is None else self.sums + batch
        self.counts = counts if self.counts is None else self.counts + counts
        self.scores.append(torch.sigmoid(logits))
        self.targets.append(truth)
        self.count += len(targets)

    def result(self, device: torch.device) -> dict:
        sums = self.sums if self.sums is not None else torch.zeros(2, device=device)
        device = sums.device
        counts = self.counts
        if counts is None:
            counts = torch.zeros(3, self.labels, dtype=torch.long, device=device)
        empty = torch.zeros(0, self.labels, device=device)
        scores = all_rows(torch.cat(self.scores) if self.scores else empty)
        truth = all_rows(torch.cat(self.targets).float() if self.targets else empty)
        count = int(all_sum(torch.tensor(self.count, device=device)).item())
        if count == 0:
            return {}
        loss, exact = (all_sum(sums) / count).tolist()
        tp, fp, fn = all_sum(counts).double().cpu()
        precision_at = average_precisions(scores.cpu(), truth.cpu())
        present = [ap for ap in precision_at if not math.isnan(ap)]
        f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)  # a label never present nor predicted: 0
        metrics = {
            "loss": loss,
            "map": sum(present) / len(present) if present else float("nan"),
            "f1_micro": float(2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp(min=1)),
            "f1_macro": float(f1.mean()),
            "subset_acc": exact,
        }
        if self.detailed:
            aucs = roc_aucs(scores.cpu(), truth.cpu())
            ranked = [auc for auc in aucs if not math.isnan(auc)]
            metrics["auroc"] = sum(ranked) / len(ranked) if ranked else float("nan")
            metrics["per_label"] = {
                "ap": precision_at,
                "auroc": aucs,
                "precision": (tp / (tp + fp).clamp(min=1)).tolist(),
                "recall": (tp / (tp + fn).clamp(min=1)).tolist(),
                "f1": f1.tolist(),
                "support": (tp + fn).long().tolist(),
            }
        return metrics


def average_precisions(scores: torch.Tensor, truth: torch.Tensor) -> list[float]:
    """Each label's average precision, ``Σ (R_n − R_{n−1}) · P_n`` over the distinct score
    thresholds from the highest down (tied scores count as one threshold, as scikit-learn's
    ``average_precision_score``); NaN for a label with no positive sample."""
    result = []
    for label in range(scores.shape[1]):
        s, t = scores[:, label].double(), truth[:, label].double()
        positives = float(t.sum())
        if positives == 0:
            result.append(float("nan"))
            continue
        order = torch.argsort(s, descending=True, stable=True)
        s, t = s[order], t[order]
        true_positives, false_positives = t.cumsum(0), (1 - t).cumsum(0)
        last = torch.ones(len(s), dtype=torch.bool)  # the last sample of each threshold
        last[:-1] = s[1:] != s[:-1]
        true_positives, false_positives = true_positives[last], false_positives[last]
        precision = true_positives / (true_positives + false_positives)
        recall = true_positives / positives
        gained = recall - torch.cat([recall.new_zeros(1), recall[:-1]])
        result.append(float((gained * precision).sum()))
    return result


class ValueScores:
    """Regression errors in the targets' own units, from sums per target: absolute and
    squared errors, and the targets' sum and sum of squares about ``scale.mean`` (R²); the
    ``loss`` is the training criterion. ``detailed``: also each target's figures, its mean
    residual (bias), and the median, 90th percentile and largest absolute error."""

    def __init__(self, loss: Any, scale: Any, detailed: bool = False) -> None:
        self.loss, self.scale, self.detailed = loss, scale, detailed
        self.sums: torch.Tensor | None = None  # [loss, 0...] and [5, targets] in float64
        self.per_target: torch.Tensor | None = None
        self.residuals: list[torch.Tensor] = []
        self.count = 0

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        predicted = self.scale.undo(outputs).double()
        error, centred = predicted - targets.double(), targets.double() - self.scale.center
        per_target = torch.stack(
            [
                error.abs().sum(0),
                error.square().sum(0),
                error.sum(0),
                centred.sum(0),
                centred.square().sum(0),
            ]
        )
        loss = self.loss(outputs, targets, reduction="sum").double() / targets.shape[1]
        self.sums = loss if self.sums is None else self.sums + loss
        self.per_target = per_target if self.per_target is None else self.per_target + per_target
        if self.detailed:
            self.residuals.append(error.float())
        self.count += len(targets)

    def result(self, device: torch.device) -> dict:
        width = self.scale.count
        loss = self.sums if self.sums is not None else torch.zeros((), device=device)
        device = loss.device
        sums = self.per_target
        if sums is None:
            sums = torch.zeros(5, width, dtype=torch.float64, device=device)
        count = int(all_sum(torch.tensor(self.count, device=device)).item())
        residuals = None
        if self.detailed:
            empty = torch.zeros(0, width, device=device)
            residuals = all_rows(torch.cat(self.residuals) if self.residuals else empty).cpu()
        if count == 0:
            return {}
        absolute, squared, bias, centred, centred_sq = (all_sum(sums) / count).cpu()
        spread = centred_sq - centred.square()  # the targets' variance
        mae, rmse = absolute, squared.sqrt()
        r2 = torch.where(spread > 0, 1 - squared / spread, torch.full_like(spread, math.nan))
        metrics = {
            "loss": float(all_sum(loss) / count),
            "mae": float(mae.mean()),
            "rmse": float(rmse.mean()),
            "r2": float(r2.mean()),
        }
        if residuals is not None:
            magnitude = residuals.abs().double()
            metrics["per_target"] = {
                "mae": mae.tolist(),
                "rmse": rmse.tolist(),
                "r2": r2.tolist(),
                "bias": bias.tolist(),
                "median_abs_error": magnitude.median(dim=0).values.tolist(),
                "p90_abs_error": magnitude.quantile(0.9, dim=0).tolist(),
                "max_abs_error": magnitude.max(dim=0).values.tolist(),
            }
        return metrics
