"""The weights a run is judged by (the EMA's or SWA's average when on, else the trained ones),
scored on the validation split after an epoch and on the test split at the end: each split's
figures recorded in the run's state (``val/acc``, ``test/mae``) and sent to its history."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from utils.evaluation.metrics import evaluate, figures, outputs_of
from utils.precision import Precision


class Judge:
    def __init__(self, model: nn.Module, precision: Precision, task: Any, state: Any, out: Any):
        """``model`` as evaluation calls it, under ``precision``'s autocast; ``task`` says what
        is measured; the figures go into ``state`` (utils/fit/state.py) and ``out``'s history."""
        self.model, self.precision, self.task = model, precision, task
        self.state, self.out = state, out

    def validate(self, batches: Any) -> dict[str, float]:
        """The validation split's metrics, recorded; returns every latest metric by tag."""
        return self._record(
            "val", evaluate(self.model, batches.epoch(0), self.precision, self.task.scores())
        )

    def test(self, batches: Any) -> dict[str, float]:
        """The test split's single figures (detailed scores add calibration and ROC-AUC)."""
        scores = self.task.scores(detailed=True)
        return self._record(
            "test", figures(evaluate(self.model, batches.epoch(0), self.precision, scores))
        )

    def evidence(self, batches: Any, inputs: Any) -> dict | None:
        """What the report shows of the test split's predictions (the task's ``evidence``):
        one more pass over it, in every process; a language model's, text it writes."""
        if not self.task.shows_evidence:
            return self.task.sampled(self.model, inputs)
        outputs, targets = outputs_of(self.model, batches.epoch(0), self.precision)
        with torch.inference_mode():  # per-sample losses: no graph
            return self.task.evidence(outputs, targets)

    def _record(self, split: str, metrics: dict) -> dict[str, float]:
        self.state.record(split, metrics)
        self.out.scalars(split, metrics, self.state.global_step)
        return self.state.metrics
