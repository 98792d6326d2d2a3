"""``calibrate=temperature`` and ``threshold=auto``: fitted on the validation split, always, and
shown on the split asked (test by default), so the figures after are honest (Guo et al. 2017's
protocol); the metrics before and after side by side.
"""

from __future__ import annotations

from typing import Any

from utils.errors import UserError
from utils.evaluation import tables
from utils.evaluation.calibration import Calibration
from utils.evaluation.metrics import outputs_of
from utils.precision import Precision


def calibrate_on_val(
    task: Any,
    model: Any,
    batches: tuple[Any, Any],
    precision: Precision,
    fit: tuple[tuple, str, str],
    out: Any,
) -> tuple[Any, dict, dict]:
    """(the task with a calibration fitted on the validation split, its detailed metrics on
    the split asked, those before): ``batches`` = (val's, the asked split's); ``fit`` = (what
    to fit, the weights the outputs come from, the split asked). Fitted on val, always, and
    shown on another split (test by default), so the figures after are honest (Guo et al.
    2017's protocol)."""
    (val, shown), (fitting, weights, split) = batches, fit
    outputs, targets = outputs_of(model, val.epoch(0), precision)
    calibrated: Calibration = task.calibrate(outputs, targets, fitting, weights)
    if split != "val":
        outputs, targets = outputs_of(model, shown.epoch(0), precision)
    before = scored(task.with_calibration(None), outputs, targets)
    task = task.with_calibration(calibrated)
    after = scored(task, outputs, targets)
    out.print(tables.calibration_table(before, after, split))
    shown = "val, the split it was fitted on: optimistic" if split == "val" else split
    out.print(f"calibration fitted on val, shown on {shown}: {calibrated.described()}")
    if fitting[1]:
        out.print("threshold=auto picks the F1-best threshold, which can lower accuracy")
    return task, after, {f"{split}/{k}": v for k, v in before.items() if isinstance(v, float)}


def scored(task: Any, outputs: Any, targets: Any) -> dict:
    """The task's detailed metrics of ``outputs`` (all of a split's, in one process)."""
    scores = task.scores(detailed=True)
    scores.add(outputs, targets)
    return scores.result(outputs.device)


def check_can_store(path: Any, inputs: dict | None, test_split: str) -> None:
    """A calibration is fitted on val and stored in the checkpoint's record: refuse a checkpoint
    with no record to store it in, or one whose val split was its test too."""
    if inputs is None:
        raise UserError(
            f"{path} holds no inputs record to store a calibration in (it "
            "was saved before predict.py); train it one more epoch with "
            "resume=... to write one"
        )
    if test_split != "test":  # its val split was its test too
        raise UserError(
            f"{path}: its run has no test split, so it reported its val "
            "split as its test; a calibration fitted there leaves no "
            "honest figure: give the data a test split (a test/ folder, "
            "data.split.test_path= or data.split.test=) and train again"
        )


def check_val_held_out(path: Any, config: Any, split: str, fitting: Any) -> None:
    """A refit's checkpoint (``trainer.train_on_val``: utils/run/refit.py) trained on its val
    rows: refuse scoring it there (``split=val``) or fitting a calibration there."""
    trainer = config.get("trainer") if isinstance(config, dict) else None
    if not isinstance(trainer, dict) or trainer.get("train_on_val", False) is False:
        return  # anything but false (an edited "true", 1) is taken as trained on val
    if split == "val" or fitting is not None:
        asked = "split=val would score" if fitting is None else "calibrate=/threshold= would fit"
        raise UserError(
            f"{path} trained on its val rows too (trainer.train_on_val: a refit), so "
            f"{asked} it on rows it learned; use the run's own best.pt (the folder "
            "above refit/) for that, and split=test for this one"
        )
