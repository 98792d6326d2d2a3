"""Where a run stands: its counters, data position, best metric and top-k list.

A typed object instead of a dict of string keys (torchtitan's ``TrainState``). Its
:meth:`TrainState.state_dict` gives the checkpoint's top-level keys of these fields, as every
checkpoint so far has held them, so older checkpoints still resume.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class TrainState:
    epoch: int = 0  # epochs finished
    batch_in_epoch: int = 0  # micro-batches of the current epoch consumed
    global_step: int = 0  # optimizer steps taken or skipped
    best_metric: float | None = None
    best_epoch: int | None = None
    top_k: list = field(default_factory=list)  # [[value, file name], ...], best first
    metrics: dict = field(default_factory=dict)  # the latest train/ and val/ values
    skipped_steps: int = 0  # steps skipped for a non-finite loss (trainer.nonfinite=skip)
    early_stopping: dict = field(default_factory=dict)  # utils/fit/early_stopping.py's count
    elapsed_seconds: float = 0.0  # wall time of the run's earlier segments, to their last save
    stopped_by: dict | None = None  # a callback's stop: {callback, reason, epoch, step}
    global_batch: int = 0  # samples of one global micro-batch (per process × processes)

    def __post_init__(self) -> None:
        self.segment_started = time.perf_counter()  # this segment (process) of the run

    @classmethod
    def since(cls, started: float, global_batch: int = 0) -> TrainState:
        """A state whose segment began at ``started`` (``time.perf_counter()``), in global
        micro-batches of ``global_batch`` samples (what a resume's data position counts)."""
        state = cls(global_batch=global_batch)
        state.segment_started = started
        return state

    def segment_seconds(self) -> float:
        return time.perf_counter() - self.segment_started

    def total_seconds(self) -> float:
        """The run's wall time across every resume: earlier segments and this one."""
        return self.elapsed_seconds + self.segment_seconds()

    def state_dict(self) -> dict[str, Any]:
        return {**asdict(self), "elapsed_seconds": self.total_seconds()}

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Take each field from ``checkpoint`` (keys absent from older formats keep their
        fresh value)."""
        for name in (f.name for f in fields(self)):
            if name in checkpoint:
                setattr(self, name, checkpoint[name])
        self.elapsed_seconds = float(self.elapsed_seconds or 0.0)

    def position(self) -> tuple[int, int]:
        """(the optimizer step being taken, its epoch), both 1-based as the history shows them."""
        return self.global_step + 1, self.epoch + 1

    def next_epoch(self) -> None:
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def validation_due(self, every_n_epochs: int, max_epochs: int) -> bool:
        """After the epoch just finished: every ``every_n_epochs`` epochs, and after the last."""
        return self.epoch % every_n_epochs == 0 or self.epoch == max_epochs

    def record(self, split: str, metrics: dict[str, float]) -> None:
        """The latest ``split`` metrics, under their TensorBoard tags (``val/acc``)."""
        self.metrics.update({f"{split}/{name}": value for name, value in metrics.items()})

    def epoch_line(self, max_epochs: int) -> str:
        """The log line of the epoch just finished: its training loss and the latest val/."""
        metrics = self.metrics
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith("val/"))
        return f"epoch {self.epoch}/{max_epochs}  train/loss {metrics['train/loss']:.4f}  {shown}"
