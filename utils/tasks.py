"""``task``: what the model is trained to predict, and so the loss the training step computes,
what validation measures and which metric picks best.pt by default.

    python train.py task.label_smoothing=0.1 task.class_weights=auto
    python train.py task=multilabel data=image_csv data.root=photos data.manifest=tags.csv
    python train.py task=regression data=csv data.path=houses.csv data.target=price

- ``task=classification`` (conf/task/classification.yaml): one class a sample; cross-entropy
  over the classes. Targets reach the loss as class indices, or as probabilities over the
  classes when MixUp/CutMix mixed the batch (data/mixing.py). Label smoothing is applied
  exactly once to either: ``(1 - ε) · target + ε / C``. Validation and test always measure
  the plain cross-entropy of the hard labels, so their losses compare across runs. Monitor:
  ``val/acc``.
- ``task=multilabel``: a set of labels a sample, as a 0/1 row; binary cross-entropy with
  logits per label, with ``pos_weight`` (null | auto = negatives/positives of each label in
  the train split | a list); a label is predicted when its sigmoid reaches ``threshold``.
  Validation measures plain BCE. Monitor: ``val/map``.
- ``task=regression``: one or more numbers a sample; MSE, Huber or L1. With
  ``standardize_targets`` (the default) the model learns each target minus the train split's
  mean, over its std; predictions, MAE, RMSE and R² are in the targets' own units, and the
  scale is stored in every checkpoint, so evaluate.py and predict.py undo it the same way.
  Monitor: ``val/mae``.

A task is built from its config, then ``fitted`` to one dataset (or to a checkpoint's inputs
record, for predict.py) and device: its targets must be of the task's kind (data/targets.py),
and the fitted task owns what the model's outputs mean, end to end: the loss, the scores
validation adds up (utils/evaluation/metrics.py), evaluate.py's tables, how a prediction row reads
(:meth:`decode`), the words the reports use, and its part of the inputs record
(utils/checkpoint/record.py). No other module asks which kind of task it is (tests/test_layering.py
checks): a new task is a class here and its YAML.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from data.targets import TASK_OF, Targets, target_kinds
from utils.checkpoint.record import label_sets, top_classes
from utils.config.arguments import BELOW_ONE, POSITIVE, Rule, checked, one_of
from utils.config.trust import FLOAT32_MAX, stored_floats
from utils.errors import UserError
from utils.evaluation import tables as eval_tables
from utils.evaluation.calibration import Calibration, f1_thresholds, fit_temperature
from utils.evaluation.metrics import (
    LABEL_SET_METRICS,
    VALUE_METRICS,
    ClassScores,
    LabelSetScores,
    ValueScores,
    measured_metrics,
)
from utils.text import cell

log = logging.getLogger("torchloom")
MAX_OUTPUTS = 2**20  # classes, labels or values: a label of 10**9 is a mistake, not a class

SMOOTHING = Rule(
    lambda v: isinstance(v, float | int) and not isinstance(v, bool) and 0 <= v < 1,
    "at least 0 and below 1",
)


def _weights(what: str) -> Rule:
    return Rule(
        lambda v: (
            v is None
            or v == "auto"
            or (
                isinstance(v, Sequence)
                and not isinstance(v, str)
                and len(v) >= 1
                and all(POSITIVE.test(w) and w <= FLOAT32_MAX for w in v)
            )
        ),
        f"null, auto, or a list of one finite positive weight per {what}",
    )


CLASS_WEIGHTS, POS_WEIGHT = _weights("class"), _weights("label")
HINTS = {
    "classes": "class labels",
    "label_sets": "label sets (a;b labels in data=csv or data=image_csv, 0/1 columns, or a 0/1 "
    "y in data=tensors)",
    "values": "numbers (data=csv, data=tensors or data=image_csv)",
}


@checked("task", label_smoothing=SMOOTHING, class_weights=CLASS_WEIGHTS)
def classification(label_smoothing: float, class_weights: Any) -> Classification:
    """conf/task/classification.yaml."""
    return Classification(float(label_smoothing), class_weights)


@checked("task", pos_weight=POS_WEIGHT, threshold=BELOW_ONE)
def multilabel(pos_weight: Any, threshold: float) -> MultiLabel:
    """conf/task/multilabel.yaml."""
    return MultiLabel(pos_weight, float(threshold))


@checked(
    "task",
    loss=one_of("mse", "huber", "l1"),
    huber_delta=POSITIVE,
    standardize_targets=one_of(True, False),
)
def regression(loss: str, huber_delta: float, standardize_targets: bool) -> Regression:
    """conf/task/regression.yaml."""
    return Regression(loss, float(huber_delta), standardize_targets)


class Task:
    """What every task shares: the kind of targets it learns, a check that a dataset's
    targets are of that kind, and the words and defaults the rest of torchloom asks for."""

    targets = "classes"  # data/targets.py KINDS
    name = "classification"
    unit = "classes"  # the model's outputs, counted: "10 classes"
    outputs = "class scores (the dataset's classes)"  # what a model must output
    monitor = "val/acc"  # trainer.monitor's default: the main validation metric
    mixes = True  # MixUp/CutMix may blend its targets
    distills = True  # distill.teacher may teach it: its outputs are one distribution over classes
    quiet_guards: tuple[str, ...] = ()  # start-up guards (utils/model/guards.py) that do not apply
    fitted_to: Targets | None = None  # the targets of the data or record it was fitted to
    calibrated: Calibration | None = None  # a temperature and thresholds fitted on val

    def data_arguments(self, node: Any) -> dict[str, str]:
        """What the data builder of config ``node`` is passed besides its keys: the kind of
        ``targets`` to read, when it reads several (data/targets.py). A builder that cannot
        read this task's kind is refused before any data is read."""
        from hydra._internal.utils import _locate

        kinds = target_kinds(_locate(node["_target_"]))
        if self.targets not in kinds:
            raise UserError(
                f"task={self.name} learns {HINTS[self.targets]}, and "
                f"{node['_target_']} reads class labels only; use data=csv, "
                "data=tensors or data=image_csv"
            )
        return {"targets": self.targets} if len(kinds) > 1 else {}

    def check(self, data: Any) -> Targets:
        targets = data.targets
        if targets.kind != self.targets:
            raise UserError(
                f"task={self.name} learns {HINTS[self.targets]}, and {data.name} "
                f"gives {targets.kind.replace('_', ' ')} (for task="
                f"{TASK_OF[targets.kind]}); choose the task or data that match"
            )
        if data.mixing and not self.mixes:
            raise UserError(
                "data.augment.mixup_alpha and cutmix_alpha blend class targets, and "
                f"{data.name}'s targets are {targets.kind} (task={self.name}): set both to 0"
            )
        if targets.count > MAX_OUTPUTS:
            raise UserError(
                f"{data.name} gives {targets.count:,} {targets.kind.replace('_', ' ')}"
                f", more than the {MAX_OUTPUTS:,} a model output may have; class "
                "labels are indices 0..N-1 (check the labels, or data.num_classes)"
            )
        least = 2 if targets.kind == "classes" else 1  # one class is a constant, 100% "right"
        if targets.count < least:
            shown = f" ({', '.join(map(repr, targets.names))})" if targets.names else ""
            table = getattr(data, "table", None)
            where = f"column {table['target']!r}" if table else "the labels"
            raise UserError(
                f"{data.name}: {where} hold {targets.count} "
                f"{targets.kind.replace('_', ' ')}{shown}, and task={self.name} needs "
                f"{least} or more; check data.target or the data"
            )
        return targets

    def training_loss(self) -> Any:
        """What the training step computes (:meth:`loss`), logging what train/loss measures
        when it is not what val/loss measures (MixUp/CutMix, smoothing, weights)."""
        loss = self.loss()
        if note := loss.training_note(self.data.mixing):
            log.info(note)
        return loss

    @property
    def count(self) -> int:
        """How many outputs the model has (classes, labels or values; 0 before fitting)."""
        return self.fitted_to.count if self.fitted_to else 0

    @property
    def names(self) -> list[str]:
        """The names of the model's outputs (class, label or target names, else numbers)."""
        return self.fitted_to.shown_names

    def record(self) -> dict:
        """The task's part of the inputs record (utils/checkpoint/record.py): what evaluate.py and
        predict.py need to read outputs as training did (its calibration, if any, and what
        a task adds)."""
        return {"calibration": self.calibrated.record()} if self.calibrated else {}

    # --- Calibration (utils/evaluation/calibration.py): fitted on val by evaluate.py, kept in the record

    decisions = 0  # thresholds a calibration may choose: a binary classifier's 1, a label each

    def read_calibration(self, stored: Any) -> None:
        """The calibration a checkpoint's record (``stored``: an InputRecord) holds, checked
        as untrusted data; none when fitting to data."""
        if stored is not None:
            record = (stored.task or {}).get("calibration")
            self.calibrated = Calibration.read(record, self.decisions, "the checkpoint")

    def with_calibration(self, calibrated: Calibration | None) -> Task:
        """This fitted task with ``calibrated`` applied to its scores, rows and exports."""
        import copy

        task = copy.copy(self)
        task.calibrated = calibrated
        return task

    def calibrate(
        self, outputs: torch.Tensor, targets: torch.Tensor, fit: tuple[bool, bool], weights: str
    ) -> Calibration:
        """A :class:`Calibration` fitted on these (validation) ``outputs`` and ``targets``:
        ``fit`` = (a temperature, F1-best thresholds); ``weights``: the weights they came
        from. A task without probabilities (no :meth:`nll`) is refused."""
        if type(self).nll is Task.nll:
            raise UserError(
                f"calibrate=temperature and threshold=auto apply to class and label "
                f"scores; task={self.name} has none"
            )
        if fit[1] and not self.decisions:
            raise UserError(
                f"threshold=auto chooses a threshold for two classes (or with "
                f"task=multilabel); this model has {self.count} classes, and "
                "predicts the most probable"
            )
        temperature = fit_temperature(outputs, lambda z: self.nll(z, targets)) if fit[0] else 1.0
        if not fit[1]:
            return Calibration(temperature, None, weights)
        scores = self.probability(outputs.float() / temperature)  # in predict.py's precision
        positives, default = self.positives(targets), getattr(self, "threshold", 0.5)
        thresholds, _ = f1_thresholds(scores.reshape(len(outputs), -1), positives, default)
        return Calibration(temperature, tuple(thresholds), weights)

    def nll(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        """The mean negative log-likelihood of ``targets`` (what a temperature minimises)."""
        raise NotImplementedError

    def positives(self, targets: torch.Tensor) -> torch.Tensor:
        """[N, decisions] booleans: what each threshold decides correctly when it says yes."""
        raise NotImplementedError

    def shown_targets(self, targets: torch.Tensor) -> list[str]:
        """Each sample's target as the TensorBoard sample grid labels it: its class index (the
        larger share of a MixUp/CutMix-mixed one)."""
        if targets.is_floating_point():
            targets = targets.argmax(dim=1)
        return [str(t) for t in targets.tolist()]

    def tables(self, out: Any, where: tuple[str, int | None], metrics: dict, split: str) -> dict:
        """Print evaluate.py's tables of one checkpoint's detailed ``metrics`` through ``out``
        (``where``: its title, and its number among several checkpoints, else None), with the
        confusion matrix as a CSV and a TensorBoard image; returns its JSON-ready metrics."""
        title, index = where
        confusion = metrics["confusion"]
        out.tracker.image(f"confusion/{index or 0}", eval_tables.confusion_image(confusion), 0)
        name = "confusion.csv" if index is None else f"confusion-{index}.csv"
        out.write_text(name, eval_tables.confusion_csv(confusion))
        suffix = "" if index is None else f"-{index}"  # the reliability table and diagram
        rows = metrics["reliability"]
        out.write_text(f"reliability{suffix}.csv", eval_tables.reliability_csv(rows))
        diagram = eval_tables.reliability_image(rows)
        out.tracker.image(f"reliability/{index or 0}", diagram, 0)
        out.write_png(f"reliability{suffix}.png", diagram)
        return eval_tables.class_tables(out, title, metrics, split, self.names)

    def decode(self, outputs: torch.Tensor, options: Any) -> tuple[list[str], list, list[str]]:
        """(CSV header, CSV rows, one printed line a row) of predict.py for the model's
        ``outputs``: the ``options.topk`` classes and probabilities. Numbers are written in
        full (``repr``: they read back as the same float), names as spreadsheet text."""
        names = self.names
        if self.calibrated is not None:
            outputs = self.calibrated.logits(outputs)
        probabilities = torch.softmax(outputs, dim=1)
        if self.calibrated is not None and self.calibrated.thresholds:
            return self._decided(probabilities, self.calibrated.thresholds[0])
        k = min(options.topk, len(names))
        top = top_classes(probabilities, names, k)
        header = [f"{what}{i}" for i in range(1, k + 1) for what in ("class", "p")]
        rows = [[v for label, p in row for v in (cell(label), repr(p))] for row in top]
        return header, rows, ["  ".join(f"{label} {p:.3f}" for label, p in row) for row in top]

    def _decided(self, probabilities: torch.Tensor, threshold: float) -> tuple:
        """A binary classifier's rows at its stored threshold: the class decided (the second
        when its probability reaches ``threshold``), then both probabilities."""
        names = self.names
        chosen = (probabilities[:, 1] >= threshold).long().tolist()
        rows = [
            [cell(names[c]), *map(repr, row)]
            for c, row in zip(chosen, probabilities.tolist(), strict=True)
        ]
        lines = [
            f"{names[c]}  (p {names[1]} {row[1]:.3f}, threshold {threshold:.3g})"
            for c, row in zip(chosen, probabilities.tolist(), strict=True)
        ]
        return ["class", *(cell(f"p_{n}") for n in names)], rows, lines

    def exportable(
        self, model: nn.Module
    ) -> tuple[nn.Module, tuple[str, ...], torch.Tensor | None]:
        """(what an ONNX export holds, its outputs' names, the unit its parity is measured in;
        None: the outputs' own): the model's logits, divided by a stored temperature, and with
        stored thresholds also what is ``predicted`` (utils/evaluation/calibration.py)."""
        if self.calibrated is None:
            return model, ("logits",), None
        decides = self.calibrated.thresholds is not None
        return (
            Calibrated(model, self.calibrated, self.probability),
            (("logits", "predicted") if decides else ("logits",)),
            None,
        )

    def target_cells(self, targets: torch.Tensor) -> list[str]:
        """Each sample's target as a CSV cell (cv=K's oof.csv): its class name."""
        names = self.names
        return [cell(names[t]) for t in targets.tolist()]

    def portable(self, outputs: torch.Tensor) -> torch.Tensor:
        """The outputs in units every fold of a cross-validation shares, so the folds' outputs
        pool (:meth:`pooled_scores`): the outputs themselves, unless a task says otherwise."""
        return outputs

    def pooled_scores(self) -> Any:
        """The scores of :meth:`portable` outputs pooled over folds (cv=K's out-of-fold
        metrics)."""
        return self.scores()


class Classification(Task):
    def __init__(self, label_smoothing: float, class_weights: Any) -> None:
        self.label_smoothing, self.class_weights = label_smoothing, class_weights
        self.data, self.device = None, torch.device("cpu")

    def fitted(self, data: Any, device: torch.device, stored: dict | None = None) -> Classification:
        fitted = Classification(self.label_smoothing, self.class_weights)
        fitted.fitted_to = self.check(data)
        fitted.data, fitted.device = data, device
        fitted.read_calibration(stored)
        return fitted

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
        return ClassificationLoss(self.label_smoothing, weight, classes)


def _weight_tensor(
    weights: list | None, key: str, what: tuple[str, str], data: Any, device: torch.device
) -> torch.Tensor | None:
    """``task.<key>``'s weights, one per class or label of ``data`` (``what``: the word and its
    plural), on ``device``."""
    if weights is None:
        return None
    if len(weights) != data.targets.count:
        raise UserError(
            f"task.{key} has {len(weights)} values; {data.name} has "
            f"{data.targets.count} {what[1]}: give one per {what[0]}, or auto"
        )
    return torch.tensor(weights, dtype=torch.float32, device=device)


def _mixing_words(mixing: Any) -> list[str]:
    if not mixing:
        return []
    epochs = f"the first {mixing.mix_off_epoch} epochs" if mixing.mix_off_epoch else "every epoch"
    return [f"on MixUp/CutMix-mixed targets in {epochs}"]


class ClassificationLoss:
    """Cross-entropy of logits against class indices or class probabilities, smoothed once."""

    def __init__(self, label_smoothing: float, weight: torch.Tensor | None, classes: int) -> None:
        self.label_smoothing, self.weight, self.classes = label_smoothing, weight, classes

    def training_note(self, mixing: Any) -> str | None:
        """What train/loss measures when it is not what val/loss measures (None when it is)."""
        parts = _mixing_words(mixing)
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
        return F.cross_entropy(
            logits, targets, weight=self.weight, label_smoothing=self.label_smoothing
        )


class MultiLabel(Task):
    targets = "label_sets"
    name = "multilabel"
    distills = False  # independent sigmoids, not one distribution over classes
    unit = "labels"
    outputs = "label scores (the dataset's labels)"
    monitor = "val/map"
    quiet_guards = ("probability_outputs",)  # softmax before cross-entropy: a classifier's

    def __init__(self, pos_weight: Any, threshold: float) -> None:
        self.pos_weight, self.threshold = pos_weight, threshold
        self.data, self.device = None, torch.device("cpu")

    def fitted(self, data: Any, device: torch.device, stored: dict | None = None) -> MultiLabel:
        fitted = MultiLabel(self.pos_weight, self.threshold)
        fitted.fitted_to = self.check(data)
        fitted.data, fitted.device = data, device
        fitted.read_calibration(stored)
        return fitted

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


class Calibrated(nn.Module):
    """A model whose logits are divided by a stored temperature, and, with stored thresholds,
    that also outputs what is predicted at them: a binary classifier's class index, or each
    label as 0/1 (for exports, which carry no record beside them)."""

    def __init__(self, model: nn.Module, calibrated: Calibration, probability: Any) -> None:
        super().__init__()
        self.model, self.probability = model, probability
        self.temperature = calibrated.temperature
        thresholds = calibrated.thresholds
        self.decides = thresholds is not None
        self.register_buffer("thresholds", torch.tensor(thresholds or [0.5]))

    def forward(self, inputs: torch.Tensor) -> Any:
        logits = self.model(inputs) / self.temperature
        if not self.decides:
            return logits
        return logits, (self.probability(logits) >= self.thresholds).long()


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


TASKS = {
    "utils.tasks.classification": Classification,
    "utils.tasks.multilabel": MultiLabel,
    "utils.tasks.regression": Regression,
}


def default_monitor(task_target: str) -> str:
    """The main validation metric of the task built by ``task_target`` (``val/loss`` for a
    builder torchloom does not know)."""
    task = TASKS.get(str(task_target))
    return task.monitor if task else "val/loss"


def main_metrics(split: str) -> tuple[str, ...]:
    """Each task's main metric on ``split`` (``test/acc``, ``test/map``, ``test/mae``)."""
    return tuple(f"{split}/{task.monitor.split('/', 1)[1]}" for task in TASKS.values())
