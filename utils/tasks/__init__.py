"""``task``: what the model is trained to predict, and so the loss the training step computes,
what validation measures and which metric picks best.pt by default.

    python train.py task.label_smoothing=0.1 task.class_weights=auto
    python train.py task=multilabel data=image_csv data.root=photos data.manifest=tags.csv
    python train.py task=regression data=csv data.path=houses.csv data.target=price

- ``task=classification`` (conf/task/classification.yaml): one class a sample; cross-entropy
  over the classes. Targets reach the loss as class indices, or as probabilities over the
  classes when MixUp/CutMix mixed the batch (data/augmentation/mixing.py). Label smoothing is applied
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
- ``task=causal_lm``: each next token of a stream (data=corpus, model=gpt); cross-entropy over
  the vocabulary at every position, in nats per token; ``val/ppl`` and, where a token is a
  character or a byte, ``val/bpc`` or ``val/bpb``. Monitor: ``val/loss``.

A task is built from its config, then ``fitted`` to one dataset (or to a checkpoint's inputs
record, for predict.py) and device: its targets must be of the task's kind (data/batching/targets.py),
and the fitted task owns what the model's outputs mean, end to end: the loss, the scores
validation adds up (utils/evaluation/metrics.py), evaluate.py's tables, how a prediction row reads
(:meth:`decode`), the words the reports use, and its part of the inputs record
(utils/checkpoint/record.py). No other module asks which kind of task it is (tests/test_layering.py
checks): a new task is a module here and its YAML. The builders the YAML names
(``utils.tasks.classification``, ...) are defined here, so the paths checkpoints store stay.

    _base            Task: what every task shares; calibration, its record, Calibrated
    _classification  Classification, its loss
    _multilabel      MultiLabel, its loss, label sets from probabilities
    _regression      Regression, its loss, TargetScale, Unscaled
    _causal_lm       CausalLM, the next-token loss, the token sums of a split
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from utils.config.arguments import BELOW_ONE, POSITIVE, Rule, checked, one_of
from utils.config.trust import FLOAT32_MAX
from utils.tasks._base import Calibrated, Task
from utils.tasks._causal_lm import CausalLM
from utils.tasks._classification import Classification, ClassificationLoss
from utils.tasks._multilabel import MultiLabel, MultiLabelLoss
from utils.tasks._regression import Regression, RegressionLoss, TargetScale, Unscaled

__all__ = [
    "TASKS",
    "Calibrated",
    "CausalLM",
    "Classification",
    "ClassificationLoss",
    "MultiLabel",
    "MultiLabelLoss",
    "Regression",
    "RegressionLoss",
    "TargetScale",
    "Task",
    "Unscaled",
    "causal_lm",
    "classification",
    "default_monitor",
    "main_metrics",
    "multilabel",
    "regression",
]

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


@checked("task", label_smoothing=SMOOTHING, class_weights=CLASS_WEIGHTS, loss=one_of("ce", "bce"))
def classification(label_smoothing: float, class_weights: Any, loss: str = "ce") -> Classification:
    """conf/task/classification.yaml."""
    return Classification(float(label_smoothing), class_weights, loss)


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


def causal_lm() -> CausalLM:
    """conf/task/causal_lm.yaml."""
    return CausalLM()


TASKS = {
    "utils.tasks.causal_lm": CausalLM,
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
