"""What predict.py needs besides the weights: the checkpoint's record of its inputs (shape,
normalisation, targets, a table's columns, the task's own part), and the inputs to predict on,
read as the training data was.

:class:`InputRecord` is the record's one schema: :meth:`InputRecord.from_run` and
:meth:`InputRecord.to_dict` are its one writer (train.py, evaluate.py's safetensors export),
:meth:`InputRecord.read` its one reader, which checks it as untrusted data (train.py's resume,
evaluate.py and predict.py all read through it)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from data.batching.batches import BatchTransform, TokenIds
from data.batching.targets import KINDS, Targets
from data.images.imagefolder import decode, is_crop_pct
from data.tables.table import Columns, read_table
from data.text.dataset import predicted_texts
from data.text.tokenizer import from_record
from utils.config.trust import stored_floats
from utils.errors import UserError

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}
TABLE_EXTENSIONS = {".csv", ".tsv", ".tab"}
MAX_SAMPLE_ELEMENTS = 2**26  # values in one input (3 × 4,729 × 4,729): a bound on what is decoded


@dataclass(frozen=True)
class InputRecord:
    """How the training data reached the model: ``input_shape``, per-channel ``mean`` and
    ``std``, ``num_classes`` (the output's width) and their names, for a table its columns
    (data/tables/tabular.py), and the ``targets`` with what the task stored (a multi-label threshold,
    a regression target scale). A record written before other tasks existed is a classifier's."""

    input_shape: tuple[int, ...]
    mean: list[float]
    std: list[float]
    num_classes: int
    classes: list[str] | None
    table: dict | None
    targets: Any = None  # data/batching/targets.py Targets
    task: dict | None = None  # the task's own record (Task.record): threshold, target_scale
    pixels: bool = False  # uint8 images (the exports take them so); never stored, read from data
    crop_pct: float = 1.0  # images: the centre share evaluation kept (data.crop_pct)
    text: dict | None = None  # texts: the tokenizer and its settings (data/text/tokenizer.py)
    train_rows: int | None = None  # a table's training rows, which fitted its model's size
    mixing = None  # a record is never augmented: Task.check reads it like a dataset's
    name = "the checkpoint's inputs record"

    @classmethod
    def from_run(cls, data: Any, task: Any) -> InputRecord:
        """How ``data`` reaches the model (data/batching/dataset.py Data), and what the fitted ``task``
        (utils/tasks.py) needs to read the outputs back."""
        return cls(
            tuple(data.input_shape),
            list(data.mean),
            list(data.std),
            data.num_classes,
            data.classes,
            data.table,
            data.targets,
            task.record(),
            data.pixels,
            getattr(data, "crop_pct", 1.0),
            getattr(data, "text", None),
            getattr(data, "train_rows", None),
        )

    def to_dict(self) -> dict:
        """What a checkpoint's ``inputs`` holds; :meth:`read` reads it back."""
        return {
            "shape": list(self.input_shape),
            "mean": list(self.mean),
            "std": list(self.std),
            "num_classes": self.num_classes,
            "classes": self.classes,
            "table": self.table,
            "targets": self.targets.record(),
            **(self.task or {}),
            **({"crop_pct": self.crop_pct} if self.crop_pct != 1.0 else {}),
            **({"text": self.text} if self.text is not None else {}),
            **({"train_rows": self.train_rows} if self.train_rows is not None else {}),
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
            tuple(shape),
            list(record["mean"]),
            list(record["std"]),
            record["num_classes"],
            classes,
            record["table"],
            targets,
            task,
            crop_pct=_crop_pct(record, path),
            text=_text(record, path),
            train_rows=_train_rows(record, path),
        )

    def without_calibration(self) -> InputRecord:
        """This record less the calibration its task part holds (a temperature and thresholds
        belong to the weights they were fitted on)."""
        task = {k: v for k, v in (self.task or {}).items() if k != "calibration"}
        return dataclasses.replace(self, task=task)

    @property
    def class_names(self) -> list[str]:
        return self.targets.shown_names

    def transform(self, device: torch.device) -> Any:
        """What normalises inputs on ``device`` as the evaluation batches were
        (data/batching/dataset.py)."""

        kind = TokenIds if self.text is not None else BatchTransform
        return kind(self.mean, self.std, device)


def _crop_pct(record: dict, path: Path) -> float:
    """The record's centre share of images (data.crop_pct; absent: the whole image)."""
    crop_pct = record.get("crop_pct", 1.0)
    if not is_crop_pct(crop_pct):
        raise UserError(
            f"{path}: its inputs record's crop_pct={crop_pct!r} is not a share in [0.1, 1] "
            "(was it edited?)"
        )
    return float(crop_pct)


def _text(record: dict, path: Path) -> dict | None:
    """The record's tokenizer (texts), checked as untrusted data (data/text/tokenizer.py)."""
    if record.get("text") is None:
        return None
    from_record(record["text"], str(path))
    return record["text"]


def _train_rows(record: dict, path: Path) -> int | None:
    """The record's training rows (a whole number), or None: recorded before they were."""
    rows = record.get("train_rows")
    if rows is None or (isinstance(rows, int) and not isinstance(rows, bool) and 0 < rows < 2**63):
        return rows
    raise UserError(f"{path}: its inputs record's train_rows={str(rows)[:40]} is not a count")


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


def read_inputs(path: Path, record: InputRecord) -> tuple[list[str], torch.Tensor, list | None]:
    """(names, inputs, unseen) of ``path``: an image, a folder of images, or a table; uint8
    images [N, C, H, W] decoded as an image folder's are, or a table's features [N, F] with
    each row's categorical values training never saw (None for images)."""
    if not path.exists():
        raise UserError(f"input={path}: no such file or folder")
    if record.text is not None:  # texts: tokenized as training did (data/text/dataset.py)
        return (*predicted_texts(path, record.text), None)
    if path.is_file() and path.suffix.lower() in TABLE_EXTENSIONS:
        if record.table is None:
            raise UserError(
                f"input={path} is a table, but the checkpoint's model takes images "
                f"of shape {list(record.input_shape)}; give an image or a folder"
            )

        header, rows = read_table(path)
        columns = Columns.from_record(record.table)
        features = columns.features(header, rows, path)
        return [str(n) for n in range(1, len(rows) + 1)], features, columns.unseen(header, rows)
    if record.table is not None or len(record.input_shape) != 3:
        raise UserError(
            f"input={path}: the checkpoint's model takes a table's rows "
            f"({record.input_shape[0]} features); give a CSV file"
        )

    files = (
        [path]
        if path.is_file()
        else sorted(
            p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
        )
    )
    if not files:
        raise UserError(f"input={path}: no image files ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    channels, height, width = record.input_shape
    images = torch.stack(
        [decode(str(f), (height, width), channels, record.crop_pct) for f in files]
    )
    base = path if path.is_dir() else path.parent
    return [str(f.relative_to(base)) for f in files], images, None
