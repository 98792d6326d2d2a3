"""What every task shares (:class:`Task`): the kind of targets it learns, the check that a
dataset's targets are of that kind, calibration and its record, the words the reports use, and
the model wrapped with its calibration for an export."""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from data.batching.targets import TASK_OF, Targets, target_kinds
from utils import plots
from utils.config.build import builder_of
from utils.errors import UserError
from utils.evaluation import tables as eval_tables
from utils.evaluation.calibration import Calibration, f1_thresholds, fit_temperature
from utils.text import cell

log = logging.getLogger("torchloom")
MAX_OUTPUTS = 2**20  # classes, labels or values: a label of 10**9 is a mistake, not a class
HINTS = {
    "classes": "class labels",
    "label_sets": "label sets (a;b labels in data=csv or data=image_csv, 0/1 columns, or a 0/1 "
    "y in data=tensors)",
    "values": "numbers (data=csv, data=tensors or data=image_csv)",
    "next_tokens": "the next token of a stream (data=corpus)",
}


def top_classes(
    probabilities: torch.Tensor, names: list[str], k: int
) -> list[list[tuple[str, float]]]:
    """The ``k`` most probable classes of each row, by name, most probable first."""
    values, indices = probabilities.topk(k, dim=1)
    return [
        [(names[i], p) for i, p in zip(row_i, row_p, strict=True)]
        for row_i, row_p in zip(indices.tolist(), values.tolist(), strict=True)
    ]


class Task:
    """What every task shares: the kind of targets it learns, a check that a dataset's
    targets are of that kind, and the words and defaults the rest of torchloom asks for."""

    targets = "classes"  # data/batching/targets.py KINDS
    name = "classification"
    unit = "classes"  # the model's outputs, counted: "10 classes"
    outputs = "class scores (the dataset's classes)"  # what a model must output
    monitor = "val/acc"  # trainer.monitor's default: the main validation metric
    mixes = True  # MixUp/CutMix may blend its targets
    distills = True  # distill.teacher may teach it: its outputs are one distribution over classes
    quiet_guards: tuple[str, ...] = ()  # start-up guards (utils/model/guards.py) that do not apply
    fitted_to: Targets | None = None  # the targets of the data or record it was fitted to
    calibrated: Calibration | None = None  # a temperature and thresholds fitted on val
    shows_evidence = True  # a report shows its test predictions (:meth:`evidence`)
    simple_models: str | None = "classifier"  # the baselines' kind (utils/evaluation/baselines.py)

    def data_arguments(self, node: Any, stored: Any = None) -> dict[str, Any]:
        """What the data builder of config ``node`` is passed besides its keys: the kind of
        ``targets`` to read, when it reads several (data/batching/targets.py), and what the
        kind of input of the checkpoint ``stored`` (its checked inputs record, when a run
        resumes) hands a builder that takes it (data/batching/inputs.py builder_hints: texts'
        stored tokenizer, never one refitted). A builder that cannot read this task's kind is
        refused before any data is read."""
        import inspect

        builder = builder_of(node)
        hints = stored.inputs.builder_hints() if stored is not None else {}
        taken = inspect.signature(builder).parameters
        supplied = {key: value for key, value in hints.items() if key in taken}
        kinds = target_kinds(builder)
        if self.targets not in kinds:
            if kinds == ("classes",):
                reads, use = "class labels only", "use data=csv, data=tensors or data=image_csv"
            else:
                reads, use = HINTS[kinds[0]], f"use task={TASK_OF[kinds[0]]}"
            raise UserError(
                f"task={self.name} learns {HINTS[self.targets]}, and "
                f"{node['_target_']} reads {reads}; {use}"
            )
        return {**supplied, **({"targets": self.targets} if len(kinds) > 1 else {})}

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
            raise UserError(
                f"{data.name}: {data.inputs.targets_in()} hold {targets.count} "
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
        return MembersLoss(loss)

    @property
    def count(self) -> int:
        """How many outputs the model has (classes, labels or values; 0 before fitting)."""
        return self.fitted_to.count if self.fitted_to else 0

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """What a model outputs for one sample of ``input_shape``: one score per output."""
        return (self.count,)

    @property
    def names(self) -> list[str]:
        """The names of the model's outputs (class, label or target names, else numbers)."""
        return self.fitted_to.shown_names

    def record(self) -> dict:
        """The task's part of the inputs record (utils/checkpoint/record.py): what evaluate.py and
        predict.py need to read outputs as training did (its calibration, if any, and what
        a task adds)."""
        return {"calibration": self.calibrated.record()} if self.calibrated else {}

    def fitted(self, data: Any, device: torch.device, stored: Any = None) -> Task:
        """This task's settings fitted to ``data`` on ``device`` (its targets checked to be of
        the task's kind), with the calibration a checkpoint's record ``stored`` holds. A task
        with more to fit (a regression's target scale) extends it."""
        fitted = copy.copy(self)
        fitted.fitted_to = self.check(data)
        fitted.data, fitted.device, fitted.calibrated = data, device, None
        fitted.read_calibration(stored)
        return fitted

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

    def evidence(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any] | None:
        """What a report shows of a split's predictions (``outputs`` and ``targets`` of every
        sample, on the CPU) as plain arrays by name; each picture of utils/report/ is drawn
        where the arrays it needs are there. Classes: each sample's target, predicted class,
        its probability and loss, and a binary classifier's positive-class ``scores`` with
        their ``truth``. Every task gives each sample's ``loss`` (its worst are shown)."""
        probabilities = torch.softmax(outputs.float(), dim=1)
        confidence, predicted = probabilities.max(dim=1)
        shown = {
            "target": targets.long(),
            "predicted": predicted,
            "confidence": confidence,
            "loss": F.cross_entropy(outputs.float(), targets.long(), reduction="none"),
        }
        if self.count == 2:  # the ranking of the second class: ROC and PR curves
            shown.update(scores=probabilities[:, 1:], truth=(targets == 1)[:, None].float())
        return shown

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
        diagram = plots.reliability(rows)
        out.tracker.image(f"reliability/{index or 0}", plots.as_image(diagram), 0)
        out.write_bytes(f"reliability{suffix}.png", diagram)
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

    def forward(self, *inputs: torch.Tensor) -> Any:  # a text model's (ids, mask) too
        logits = self.model(*inputs) / self.temperature
        if not self.decides:
            return logits
        return logits, (self.probability(logits) >= self.thresholds).long()


class MembersLoss:
    """A training loss that also takes the outputs ``[N, k, ...]`` of a model of k members
    (models/tabular/ in training): the mean of the members' losses (TabM's training), each
    against the same targets, or against its own where the batch gave each member its own
    rows (targets ``[N, k]`` class indices or ``[N, k, ...]`` values:
    :func:`member_targets`); ``[N, ...]`` outputs go through as they are."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def training_note(self, mixing: Any) -> str | None:
        return self.inner.training_note(mixing)

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor, *args: Any) -> torch.Tensor:
        if outputs.dim() == 3:
            if not member_targets(targets, outputs):  # every member against the same ones
                targets = targets.unsqueeze(1).expand(-1, outputs.shape[1], *targets.shape[1:])
            outputs, targets = outputs.flatten(0, 1), targets.flatten(0, 1)
        return self.inner(outputs, targets, *args)


def member_targets(targets: torch.Tensor, outputs: torch.Tensor) -> bool:
    """Whether ``targets`` hold each of the k members' own (a batch of
    ``model.share_batches=false``): ``[N, k]`` class indices, or ``[N, k, ...]`` values
    beside outputs ``[N, k, ...]``; shared targets are ``[N]`` indices or ``[N, ...]`` values."""
    own_classes = targets.dim() == 2 and not targets.is_floating_point()
    return tuple(targets.shape[:2]) == tuple(outputs.shape[:2]) and (
        own_classes or targets.dim() == 3
    )
