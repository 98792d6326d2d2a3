"""What predict.py needs besides the weights: the checkpoint's record of its inputs (shape,
normalisation, targets, the kind of input's own part — a table's columns, a tokenizer, an
image's centre share — and the task's own part), and the inputs to predict on, read as the
training data was.

:class:`InputRecord` is the record's one schema: :meth:`InputRecord.from_run` and
:meth:`InputRecord.to_dict` are its one writer (train.py, evaluate.py's safetensors export),
:meth:`InputRecord.read` its one reader, which checks it as untrusted data (train.py's resume,
evaluate.py and predict.py all read through it); the kind of input (data/kinds.py) checks
and reads its own part."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from data.batching.inputs import HINTS
from data.batching.targets import KINDS, Targets
from data.kinds import stored_inputs
from utils.config.trust import stored_floats
from utils.errors import UserError

MAX_SAMPLE_ELEMENTS = 2**26  # values in one input (3 × 4,729 × 4,729): a bound on what is decoded


@dataclass(frozen=True, kw_only=True)
class InputRecord:
    """How the training data reached the model: ``input_shape``, per-channel ``mean`` and
    ``std``, ``num_classes`` (the output's width) and their names, the kind of input
    (``inputs``, data/batching/inputs.py: what it records, how it is read and exported), and
    the ``targets`` with what the task stored (a multi-label threshold, a regression target
    scale). A record written before other tasks existed is a classifier's."""

    input_shape: tuple[int, ...]
    mean: list[float]
    std: list[float]
    num_classes: int
    classes: list[str] | None
    inputs: Any  # data/batching/inputs.py Inputs
    targets: Any = None  # data/batching/targets.py Targets
    task: dict | None = None  # the task's own record (Task.record): threshold, target_scale
    mixing = None  # a record is never augmented: Task.check reads it like a dataset's
    name = "the checkpoint's inputs record"

    @classmethod
    def from_run(cls, data: Any, task: Any) -> InputRecord:
        """How ``data`` reaches the model (data/batching/dataset.py Data), and what the fitted ``task``
        (utils/tasks.py) needs to read the outputs back."""
        return cls(
            input_shape=tuple(data.input_shape),
            mean=list(data.mean),
            std=list(data.std),
            num_classes=data.num_classes,
            classes=data.classes,
            inputs=data.inputs.fixed(data.splits["train"]),  # its training rows, as they are
            targets=data.targets,
            task=task.record(),
        )

    def to_dict(self) -> dict:
        """What a checkpoint's ``inputs`` holds; :meth:`read` reads it back. ``table`` keeps
        its place for every kind (None but for a table's rows), as records always held it."""
        return {
            "shape": list(self.input_shape),
            "mean": list(self.mean),
            "std": list(self.std),
            "num_classes": self.num_classes,
            "classes": self.classes,
            "table": None,
            "targets": self.targets.record(),
            **(self.task or {}),
            **self.inputs.record(),
        }

    @classmethod
    def read(cls, record: Any, path: Path) -> InputRecord:
        """A checkpoint's ``inputs`` (untrusted: checked), from the file ``path``."""
        if record is None:
            raise UserError(
                f"{path} holds no record of its inputs (it was saved before "
                "predict.py); evaluate.py reads it, or train it one more epoch "
                "with resume=... to write one"
            )
        shape, classes = record.get("shape") if isinstance(record, dict) else None, None
        ok = (
            isinstance(record, dict)
            and isinstance(shape, list)
            and len(shape) >= 1
            and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)
            and stored_floats(record.get("mean"), shape[0])
            and stored_floats(record.get("std"), shape[0], divisor=True)
            and isinstance(record.get("num_classes"), int)
            and record["num_classes"] > 0
            and isinstance(record.get("table"), dict | type(None))
        )
        if ok:
            classes = record.get("classes")
            ok = classes is None or (
                isinstance(classes, list)
                and len(classes) == record["num_classes"]
                and all(isinstance(c, str) for c in classes)
            )
        if not ok:
            raise UserError(
                f"{path}: its inputs record is not what torchloom writes (was it edited?)"
            )
        if math.prod(shape) > MAX_SAMPLE_ELEMENTS:
            raise UserError(
                f"{path}: its inputs record asks for inputs of shape {shape}, more "
                f"than {MAX_SAMPLE_ELEMENTS:,} values each; refusing (was it edited?)"
            )
        targets = _targets(record, path)
        task = {
            key: record[key]
            for key in ("threshold", "target_scale", "calibration")
            if key in record
        }
        return cls(
            input_shape=tuple(shape),
            mean=list(record["mean"]),
            std=list(record["std"]),
            num_classes=record["num_classes"],
            classes=classes,
            inputs=stored_inputs(record, path),
            targets=targets,
            task=task,
        )

    def without_calibration(self) -> InputRecord:
        """This record less the calibration its task part holds (a temperature and thresholds
        belong to the weights they were fitted on)."""
        task = {k: v for k, v in (self.task or {}).items() if k != "calibration"}
        return dataclasses.replace(self, task=task)

    @property
    def class_names(self) -> list[str]:
        return self.targets.shown_names

    def model_hints(self) -> dict[str, Any]:
        """What the recorded data hands a model's builder (no train split: the weights hold
        what was fitted to it)."""
        hints = self.inputs.model_hints(self.input_shape, None, self.mean, self.std)
        return {**dict.fromkeys(HINTS), **hints}

    def transform(self, device: torch.device) -> Any:
        """What normalises inputs on ``device`` as the evaluation batches were
        (data/batching/dataset.py)."""
        return self.inputs.transform(self.mean, self.std, device)

    def read_inputs(self, path: Path) -> tuple[list[str], torch.Tensor, list | None]:
        """(names, inputs, unseen) of ``path``, read as this record's kind of input reads
        a file (an image or a folder of them, a table, texts): inputs [N, ...] as the model's
        data held them, and for a table each row's categorical values training never saw."""
        if not path.exists():
            raise UserError(f"input={path}: no such file or folder")
        return self.inputs.read_raw(path, self.input_shape)


def _targets(record: dict, path: Path) -> Any:

    stored = record.get("targets") or {
        "kind": "classes",
        "count": record["num_classes"],
        "names": record.get("classes"),
    }
    names = stored.get("names") if isinstance(stored, dict) else None
    ok = (
        isinstance(stored, dict)
        and stored.get("kind") in KINDS
        and stored.get("count") == record["num_classes"]
        and (
            names is None
            or (
                isinstance(names, list)
                and len(names) == record["num_classes"]
                and all(isinstance(n, str) for n in names)
            )
        )
    )
    if not ok:
        raise UserError(f"{path}: its targets record is not what torchloom writes (was it edited?)")
    return Targets(stored["kind"], stored["count"], tuple(names) if names else None)
