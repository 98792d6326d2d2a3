"""How far a classifier's or a multi-label model's scores can be trusted, and the decisions
made from them: one temperature fitted on the validation split (``evaluate.py
calibrate=temperature``), thresholds chosen there (``threshold=auto``), the record a checkpoint
keeps of both, and the ranking figures (ROC-AUC) with ties counted exactly.

:class:`Calibration` is read from a checkpoint as untrusted data (:meth:`Calibration.read`); the
task (utils/tasks.py) applies it to its scores, predict.py's rows and the ONNX export, so every
figure evaluate.py prints after calibrating is what predict.py's rows give.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from utils.config.arguments import finite_number
from utils.errors import UserError

MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 1e3  # what a fit may return and a record may hold
SEARCH_STEPS = 80  # golden-section steps over log T: the bracket shrinks to ~1e-16 of itself


@dataclass(frozen=True)
class Calibration:
    """``temperature``: the model's logits are divided by it before softmax or sigmoid (1:
    none). ``thresholds``: the probability at or above which each label is predicted (a binary
    classifier: one, for its second class); None: the task's own. ``weights``: the weights it
    was fitted on (ema or raw), so it is applied to those only."""

    temperature: float = 1.0
    thresholds: tuple[float, ...] | None = None
    weights: str | None = None

    def logits(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs if self.temperature == 1.0 else outputs / self.temperature

    def record(self) -> dict:
        """What a checkpoint's inputs record keeps under ``calibration``."""
        thresholds = None if self.thresholds is None else list(self.thresholds)
        return {
            "temperature": self.temperature,
            "thresholds": thresholds,
            "weights": self.weights,
            "split": "val",
        }

    @classmethod
    def read(cls, record: Any, width: int, where: str) -> Calibration | None:
        """A checkpoint's ``calibration`` record (untrusted), for a model whose decisions take
        ``width`` thresholds (0: none may be stored); None when there is none. ``where``:
        the checkpoint, for the message."""
        if record is None:
            return None
        fix = (
            "evaluate.py ckpt=<it> split=val calibrate=temperature (or threshold=auto) replaces it"
        )
        if not isinstance(record, dict):
            raise UserError(f"{where}: its calibration record is not a mapping; {fix}")
        temperature, thresholds = record.get("temperature", 1.0), record.get("thresholds")
        if not (finite_number(temperature) and MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
            raise UserError(
                f"{where}: its calibration temperature {temperature!r} is not a "
                f"number from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}; {fix}"
            )
        if thresholds is not None:
            ok = isinstance(thresholds, list) and len(thresholds) == width and width > 0
            if not ok:
                count = len(thresholds) if isinstance(thresholds, list) else "no list of"
                raise UserError(
                    f"{where}: its calibration holds {count} thresholds and the "
                    f"model decides {width} (labels, or a binary classifier's one); {fix}"
                )
            bad = [t for t in thresholds if not (finite_number(t) and 0 < t < 1)]
            if bad:
                raise UserError(
                    f"{where}: its calibration threshold {bad[0]!r} is not between "
                    f"0 and 1 (both excluded); {fix}"
                )
            thresholds = tuple(float(t) for t in thresholds)
        weights = record.get("weights")
        if weights not in ("swa", "ema", "raw", None):
            raise UserError(
                f"{where}: its calibration names weights {weights!r} (swa, ema or raw); {fix}"
            )
        return cls(float(temperature), thresholds, weights)

    def described(self) -> str:
        """One line of what it applies."""
        parts = [f"temperature {self.temperature:.4g}"]
        if self.thresholds is not None:
            parts.append(
                "threshold"
                + ("s " if len(self.thresholds) > 1 else " ")
                + " ".join(f"{t:.4g}" for t in self.thresholds)
            )
        return ", ".join(parts) + f" (fitted on val, {self.weights or 'the stored'} weights)"


def fit_temperature(logits: torch.Tensor, nll: Callable[[torch.Tensor], float]) -> float:
    """The temperature T that minimises ``nll(logits / T)`` on these (validation) outputs.

    The NLL is convex in 1/T, so one minimum: golden-section search over log T in
    [:data:`MIN_TEMPERATURE`, :data:`MAX_TEMPERATURE`], in float64. T = 1 is kept unless the
    fit lowers the NLL, so calibration never makes the validation NLL worse. A fit that runs
    to the lower bound is refused: on outputs that are all right (a val split the model
    separates), a lower T always lowers the NLL, so the minimum is T → 0, which makes every
    later mistake certain (a test NLL of 5.9 where the raw model had 0.2, on texts)."""
    logits = logits.double()
    lo, hi = math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)
    ratio = (math.sqrt(5) - 1) / 2

    def cost(log_t: float) -> float:
        value = nll(logits / math.exp(log_t))
        return value if math.isfinite(value) else math.inf

    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    cost_a, cost_b = cost(a), cost(b)
    for _ in range(SEARCH_STEPS):
        if cost_a <= cost_b:
            hi, b, cost_b = b, a, cost_a
            a = hi - ratio * (hi - lo)
            cost_a = cost(a)
        else:
            lo, a, cost_a = a, b, cost_b
            b = lo + ratio * (hi - lo)
            cost_b = cost(b)
    best = a if cost_a <= cost_b else b
    if min(cost_a, cost_b) >= cost(0.0):
        return 1.0
    lowest = min(cost_a, cost_b)
    if cost(math.log(MIN_TEMPERATURE)) - lowest <= 1e-4 * lowest + 1e-9:  # flat down to it
        raise UserError(
            f"calibrate=temperature: the val split's {len(logits)} outputs are all right, so a "
            "lower temperature always lowers their NLL and the fit runs to its bound "
            f"(T={MIN_TEMPERATURE:g}), which would make every later mistake certain; nothing "
            "is fitted: validate on more or harder samples (data.split.val), or keep T=1"
        )
    return min(max(math.exp(best), MIN_TEMPERATURE), MAX_TEMPERATURE)


def f1_thresholds(
    probabilities: torch.Tensor, truth: torch.Tensor, default: float
) -> tuple[list[float], list[float]]:
    """(threshold, F1) of each column: the threshold at which ``p >= t`` has the highest F1
    on these (validation) samples, halfway between the lowest score predicted positive and the
    next lower one, so the F1 here is exactly what the threshold gives; among equal F1s the
    highest threshold. A column with no positive sample keeps ``default`` (its F1 is 0). The
    ``probabilities`` are compared as given: pass them in the precision predict.py uses."""
    thresholds, scores = [], []
    for column in range(probabilities.shape[1]):
        p, t = probabilities[:, column].double(), truth[:, column].double()
        positives = float(t.sum())
        if positives == 0:
            thresholds.append(default)
            scores.append(0.0)
            continue
        order = torch.argsort(p, descending=True, stable=True)
        p, t = p[order], t[order]
        last = torch.ones(len(p), dtype=torch.bool)  # the last sample of each distinct score
        last[:-1] = p[1:] != p[:-1]
        true_positives = t.cumsum(0)[last]
        predicted = torch.arange(1, len(p) + 1, dtype=torch.float64)[last]
        f1 = 2 * true_positives / (predicted + positives)
        cut = p[last]
        f1[cut <= 0] = -1  # a threshold is above 0: a score of 0 is never predicted
        best = int(torch.argmax(f1))  # the first of equal maxima: the highest threshold
        if f1[best] < 0:  # every score is 0
            thresholds.append(default)
            scores.append(0.0)
            continue
        below = float(cut[best + 1]) if best + 1 < len(cut) else 0.0
        thresholds.append((float(cut[best]) + below) / 2)
        scores.append(float(f1[best]))
    return thresholds, scores


def roc_aucs(scores: torch.Tensor, truth: torch.Tensor) -> list[float]:
    """Each column's area under the ROC curve: the chance that a positive sample scores above
    a negative one, a tie counting one half (the Mann-Whitney statistic from mid-ranks, so ties
    are exact); NaN for a column without both positives and negatives."""
    result = []
    for column in range(scores.shape[1]):
        s, t = scores[:, column].double(), truth[:, column] > 0.5
        positives, negatives = int(t.sum()), int((~t).sum())
        if positives == 0 or negatives == 0:
            result.append(float("nan"))
            continue
        _, inverse, counts = torch.unique(s, return_inverse=True, return_counts=True)
        ends = counts.cumsum(0).double()
        midranks = ends - (counts.double() - 1) / 2  # ranks from 1; ties share their mean
        rank_sum = float(midranks[inverse][t].sum())
        result.append((rank_sum - positives * (positives + 1) / 2) / (positives * negatives))
    return result
