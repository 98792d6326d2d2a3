"""What a dataset's targets are, and so which ``task`` can learn them (utils/tasks.py).

- ``classes``: one class index per sample, int64 [N] in [0, C) (``task=classification``);
- ``label_sets``: a set of labels per sample, a 0/1 float32 matrix [N, L] (``task=multilabel``);
- ``values``: one or more numbers per sample, float32 [N, T] (``task=regression``);
- ``next_tokens``: each token's next one in a stream of ids, int64 (``task=causal_lm``), the
  count the vocabulary's size.

Every data path holds targets as one tensor per split, batched by the same slices as the
inputs, so a task changes nothing in how batches are cut, shuffled or resumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from utils.errors import UserError

KINDS = ("classes", "label_sets", "values", "next_tokens")
TASK_OF = {
    "classes": "classification",
    "label_sets": "multilabel",
    "values": "regression",
    "next_tokens": "causal_lm",
}
SET_SEPARATOR = ";"  # a manifest's or a CSV cell's label set: cat;dog


@dataclass(frozen=True)
class Targets:
    """The kind of target, how many there are per sample (classes, labels or values: the
    width of the model's output), and their names when known."""

    kind: str
    count: int
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"target kind {self.kind!r} is not one of {KINDS}")
        if self.names is not None and len(self.names) != self.count:
            raise ValueError(f"{len(self.names)} target names for {self.count} targets")

    @property
    def class_names(self) -> list[str] | None:
        """Class or label names, as the inputs record's ``classes`` holds them (None for
        values, whose names are in :meth:`record`)."""
        return list(self.names) if self.names and self.kind != "values" else None

    @property
    def shown_names(self) -> list[str]:
        return list(self.names) if self.names else [str(i) for i in range(self.count)]

    def check(self, targets: torch.Tensor, where: str) -> None:
        """``targets`` of one split are of this kind; say which split and value if not."""
        if self.kind in ("classes", "next_tokens"):
            check_labels(targets, self.count, where)
            return
        if not targets.is_floating_point() or targets.dim() != 2 or targets.shape[1] != self.count:
            raise UserError(
                f"{where}: {self.kind.replace('_', ' ')} must be float [N, "
                f"{self.count}], not {targets.dtype} {list(targets.shape)}"
            )
        if not bool(torch.isfinite(targets).all()):
            row = int((~torch.isfinite(targets)).any(dim=1).nonzero()[0])
            raise UserError(f"{where}: the target of sample {row} is NaN or Inf; clean it")
        if self.kind == "label_sets" and not bool(((targets == 0) | (targets == 1)).all()):
            row = int(((targets != 0) & (targets != 1)).any(dim=1).nonzero()[0])
            raise UserError(
                f"{where}: label sets must be 0/1, and sample {row} has {targets[row].tolist()}"
            )

    def random(self, n: int, device: torch.device, input_shape: tuple = ()) -> torch.Tensor:
        """``n`` targets of this kind (tune=batch_size tries a step on them); next tokens are
        one for each position of an input of ``input_shape``."""
        if self.kind == "next_tokens":
            return torch.randint(0, self.count, (n, *input_shape), device=device)
        if self.kind == "classes":
            return torch.randint(0, self.count, (n,), device=device)
        values = torch.rand(n, self.count, device=device)
        return values.round() if self.kind == "label_sets" else values

    def record(self) -> dict:
        return {
            "kind": self.kind,
            "count": self.count,
            "names": list(self.names) if self.names else None,
        }


def reads_targets(*kinds: str, classes: bool = True):
    """Declare the kinds of target a data builder reads besides class labels (or, not
    ``classes``, instead of them): it is then passed ``targets=<kind>`` (the task's) when it
    reads several. Builders without it read class labels only."""

    def declare(builder):
        builder.target_kinds = ("classes", *kinds) if classes else kinds
        return builder

    return declare


def target_kinds(builder) -> tuple[str, ...]:
    """The kinds of target a data builder reads."""
    return getattr(builder, "target_kinds", ("classes",))


def check_labels(labels: torch.Tensor, num_classes: int, where: str) -> None:
    """Labels must be integers in [0, num_classes); say which dataset and value if not."""
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dim() != 1:
        raise UserError(
            f"{where}: class labels must be integers [N], got {labels.dtype} "
            f"{list(labels.shape)} (task=multilabel and task=regression take "
            "float targets)"
        )
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        index = int(bad.nonzero()[0])
        raise UserError(
            f"{where}: label {int(labels[index])} at index {index} is outside [0, {num_classes}); "
            f"fix the labels or set the number of classes"
        )


def label_set(text: str) -> list[str]:
    """``"cat;dog"`` → ``["cat", "dog"]``; an empty cell is the empty set."""
    return [part.strip() for part in text.split(SET_SEPARATOR) if part.strip()]


def multi_hot(sets: Sequence[Sequence[str]], names: Sequence[str]) -> torch.Tensor:
    """Label sets → a 0/1 float32 matrix with one column per name."""
    column = {name: i for i, name in enumerate(names)}
    matrix = torch.zeros(len(sets), len(names))
    for row, labels in enumerate(sets):
        for label in labels:
            matrix[row, column[label]] = 1.0
    return matrix


def sorted_names(values: set[str]) -> list[str]:
    """Class or label names in order: integers numerically, anything else alphabetically."""
    try:
        return sorted(values, key=int)
    except ValueError:
        return sorted(values)
