"""``distill.*``: knowledge distillation (Hinton et al., 2015) from a trained checkpoint.

    python train.py model=mlp distill.teacher=checkpoints/<cnn_run>/best.pt
    python train.py model=mlp distill.teacher=checkpoints/<cnn_run> distill.alpha=0.7

Each training step's loss is ``(1 − α)·task + α·T²·KL(teacher/T ‖ student/T)``: the task's own
loss on the (possibly mixed) targets, and the KL divergence from the teacher's softened class
distribution to the student's, averaged over the batch (``batchmean``) and multiplied by T² so
its gradients keep their size whatever the temperature. Under MixUp/CutMix the teacher sees the
mixed batch the student sees. Validation, best.pt and the test judge the student on the task
alone (``val/loss`` is the task's loss).

The teacher is rebuilt from its checkpoint as untrusted data, by the rules evaluate.py and
predict.py follow (utils/checkpoint/rebuild.py). It must predict the same classes (task=classification,
the same class names); inputs are re-normalised from the student's statistics to those its own
record holds when they differ, and must have the same shape. It runs in eval mode under
``inference_mode``, is never wrapped in DDP or compiled and never saved: the student's
checkpoint records its path and sha256, and a resume whose teacher file has other contents is
refused. Multi-label and regression students are refused: for those a teacher's outputs are
not a distribution over classes, and matching them would be another loss, not this one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from utils.checkpoint.load import checkpoint_to_evaluate
from utils.checkpoint.rebuild import rebuild
from utils.checkpoint.stored import WEIGHTS
from utils.errors import UserError
from utils.files import file_sha256


class Teacher:
    def __init__(
        self, model: nn.Module, renormalize: tuple | None, config: Any, file: tuple[Path, str]
    ) -> None:
        self.model = model.eval().requires_grad_(False)
        self.renormalize = renormalize  # (scale, shift) from the student's inputs to its own
        self.temperature, self.alpha = float(config.temperature), float(config.alpha)
        self.path, self.sha256 = file

    @classmethod
    def of(
        cls, config: Any, data: Any, task: Any, device: torch.device, own_folder: Path
    ) -> Teacher | None:
        """``distill`` for a student of ``task`` on ``data`` (None when ``teacher`` is null);
        the teacher may not be a file of this run (``own_folder``), which the run rewrites."""
        if config.teacher is None:
            return None

        check_settings(config)
        if not task.distills:
            raise UserError(
                f"distill.teacher distils class probabilities; this run's task is "
                f"{task.name} (task=classification only)"
            )
        path = teacher_file(Path(str(config.teacher)))
        if path.resolve().parent == Path(own_folder).resolve():
            raise UserError(
                f"distill.teacher={path} is a checkpoint of this run, which it "
                "rewrites; name another run's checkpoint"
            )
        try:
            sha256 = file_sha256(path)
        except OSError as error:
            raise UserError(f"distill.teacher={path}: cannot read it ({error.strerror})") from None
        rebuilt = rebuild(path, config.weights, device)
        record = rebuilt.record
        if not rebuilt.task.distills:
            raise UserError(
                f"distill.teacher={path} was trained for {rebuilt.task.name}; a "
                "teacher is a classifier"
            )
        data.check_encoded_as(record, f"distill.teacher={path}", "distil from it")  # as evaluate.py
        if record.num_classes != data.num_classes or (
            record.classes and data.classes and list(record.classes) != list(data.classes)
        ):
            raise UserError(
                f"distill.teacher={path} predicts other classes ({record.num_classes}) "
                f"than this data has ({data.num_classes}); a teacher must know the "
                "same classes, in the same order"
            )
        if tuple(record.input_shape) != tuple(data.input_shape):
            raise UserError(
                f"distill.teacher={path} takes inputs of shape "
                f"{list(record.input_shape)}, this data {list(data.input_shape)}"
            )
        renormalize = _renormalization(data, record, device)
        return cls(rebuilt.model, renormalize, config, (path, sha256))

    def blend(
        self, loss: torch.Tensor, outputs: torch.Tensor, inputs: torch.Tensor
    ) -> torch.Tensor:
        """``(1 − α)·loss + α·T²·KL``, the teacher's outputs taken on the same ``inputs`` (each
        member's own rows, ``[N, k, ...]``, where the members draw their own batches)."""
        own_rows = outputs.dim() == 3 and inputs.dim() == 3  # only a table's model has members
        if own_rows:
            inputs = inputs.flatten(0, 1)
        with torch.inference_mode():
            if self.renormalize is not None:
                scale, shift = self.renormalize
                inputs = inputs * scale + shift
            taught = self.model(inputs)
        taught = taught.float().clone()  # out of inference mode: autograd may keep it
        if own_rows:  # k members' outputs, each on its own rows (models/tabular/)
            outputs = outputs.flatten(0, 1)
        elif outputs.dim() == 3:  # k members' outputs (models/tabular/): each is taught
            k = outputs.shape[1]
            outputs, taught = outputs.flatten(0, 1), taught.repeat_interleave(k, dim=0)
        return (1 - self.alpha) * loss + self.alpha * self.divergence(outputs, taught)

    def divergence(self, outputs: torch.Tensor, taught: torch.Tensor) -> torch.Tensor:
        """T²·KL(teacher/T ‖ student/T), averaged over the batch."""
        t = self.temperature
        student = F.log_softmax(outputs.float() / t, dim=1)
        teacher = F.log_softmax(taught / t, dim=1)
        return F.kl_div(student, teacher, reduction="batchmean", log_target=True) * t * t

    def record(self) -> dict[str, str]:
        """What a checkpoint keeps of its teacher: never its weights."""
        return {"teacher": str(self.path), "sha256": self.sha256}

    def check_resumed(self, stored: Any, where: Path) -> None:
        """A resume continues with the teacher file it was trained with."""
        stored_sha = stored.get("sha256") if isinstance(stored, dict) else None
        if isinstance(stored_sha, str) and stored_sha != self.sha256:
            raise UserError(
                f"cannot resume {where} with distill.teacher={self.path}: its "
                f"contents (sha256 {self.sha256[:12]}…) are not the teacher the run "
                f"was trained with (sha256 {stored_sha[:12]}…); restore that file or "
                "start a new run"
            )


def check_settings(config: Any) -> None:
    temperature, alpha = config.temperature, config.alpha
    if not (math.isfinite(temperature) and temperature > 0):
        raise UserError(
            f"distill.temperature={temperature} must be greater than 0 (1 = the "
            "teacher's own probabilities; 2 to 8 is usual)"
        )
    if not (math.isfinite(alpha) and 0 <= alpha <= 1):
        raise UserError(
            f"distill.alpha={alpha} must be from 0 to 1 (the share of the loss "
            "that follows the teacher)"
        )
    if config.weights not in WEIGHTS:
        raise UserError(f"distill.weights={config.weights!r} must be auto, swa, ema or raw")


def teacher_file(path: Path) -> Path:
    """A checkpoint file as given; a run's folder → its best.pt (else last.pt, else newest)."""

    if path.is_dir():
        found = checkpoint_to_evaluate(path)
        if found is None:
            raise UserError(f"distill.teacher={path}: no checkpoint in that folder")
        return found
    if not path.is_file():
        raise UserError(f"distill.teacher={path}: no such checkpoint file or folder")
    return path


def _renormalization(data: Any, record: Any, device: torch.device) -> tuple | None:
    """(scale, shift) taking inputs normalised with the student's statistics to the teacher's
    (``x·std_s/std_t + (mean_s − mean_t)/std_t`` per channel); None when they agree."""
    if list(data.mean) == list(record.mean) and list(data.std) == list(record.std):
        return None
    view = (-1, *([1] * (len(data.input_shape) - 1)))
    student_mean, student_std, teacher_mean, teacher_std = (
        torch.tensor(list(v), dtype=torch.float32, device=device).view(view)
        for v in (data.mean, data.std, record.mean, record.std)
    )
    return student_std / teacher_std, (student_mean - teacher_mean) / teacher_std
