"""Evaluate saved checkpoints, rebuilding model and data from each checkpoint alone.

    python evaluate.py ckpt=checkpoints/<run_name>/best.pt             # the test split
    python evaluate.py ckpt=checkpoints/<run_name> split=val           # the run's best.pt
    python evaluate.py ckpt=[a.pt,b.pt]                                # a comparison table
    python evaluate.py ckpt=checkpoints/<sweep_name>                   # every job of a sweep
    python evaluate.py ckpt=best.pt data.root=/mnt/datasets            # data moved elsewhere
    python evaluate.py ckpt=best.pt weights=raw                        # not the EMA (trainer.ema)
    python evaluate.py ckpt=best.pt export=model.pt2                   # torch.export, dynamic batch
    python evaluate.py ckpt=best.pt export=model.onnx                  # verified with onnxruntime
    python evaluate.py ckpt=best.pt export=model.safetensors           # weights without pickle
    python evaluate.py ckpt=model.safetensors                          # and back
    python evaluate.py ckpt=best.pt calibrate=temperature threshold=auto   # fit on val, show test
    python evaluate.py ckpt=checkpoints/<run_name> average=top_k       # its top-k copies as one
    python evaluate.py ckpt=best.pt weights=swa                        # trainer.swa's average
    torchrun --nproc_per_node=2 evaluate.py ckpt=best.pt               # each process a shard

The stored config is data read from a file, so it is untrusted: it may hold no interpolation,
and only the exact builders named in torchloom's own conf/ files are instantiated from it
(utils/config/trust.py). It never downloads unless data.download=true is given here.
Outputs in runs/eval/<timestamp>/: metrics.json, report.html (its pictures) and the task's tables (utils/evaluation/tables.py):
for classification also a confusion-matrix CSV per checkpoint and TensorBoard images of the
confusion matrices; for multilabel each label's AP, precision, recall and F1; for regression
each target's errors and residuals, in the targets' own units (the checkpoint's target scale).

``calibrate=temperature`` fits one temperature on the validation split, ``threshold=auto`` the
threshold of best F1 of a binary classifier or of each label, there too; the metrics before and
after are shown on the split asked (the test split by default), and the calibration is stored
in the checkpoint's record, so evaluate.py, predict.py and the exports apply it
(utils/evaluation/calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from utils.checkpoint.load import load_checkpoint, replace_inputs_record
from utils.checkpoint.rebuild import rebuild_model
from utils.checkpoint.record import InputRecord
from utils.checkpoint.stored import (
    average_checkpoints,
    data_config,
    keep_average,
    read_checkpoint,
    reading_stored_data,
    task_config,
)
from utils.config.build import build
from utils.errors import UserError
from utils.evaluation import tables
from utils.evaluation.export import export_evaluated
from utils.evaluation.fit_calibration import (
    calibrate_on_val,
    check_can_store,
    check_val_held_out,
)
from utils.evaluation.metrics import evaluate
from utils.fit.swa import recompute_batchnorm
from utils.precision import Precision
from utils.preflight.evaluate import EvaluatePlan, check_evaluate
from utils.report.evaluation import write_evaluation_report
from utils.run import provenance
from utils.run.cli import one_line_errors, run_cli
from utils.run.outputs import Outputs
from utils.run.start import RunContext
from utils.system.distributed import processes_from_env
from utils.tracking.local import TensorBoard
from utils.tracking.mlflow import add_to_training_run
from utils.tracking.tracker import Tracker


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    one_line_errors(evaluate_checkpoints, cfg)


@dataclass
class Evaluation:
    """What every checkpoint of one evaluate.py command shares."""

    cfg: DictConfig
    plan: EvaluatePlan  # the checkpoints, and what the command asks beyond their metrics
    context: RunContext  # the device; under torchrun, which shard this process takes
    precision: Precision
    out: Outputs


@dataclass
class Evaluated:
    """A checkpoint rebuilt on the data it is evaluated on."""

    path: Path
    config: dict  # its stored config, checked as untrusted data
    inputs: dict | None  # its inputs record
    weights: str  # which of its weights: swa, ema, raw or export
    task: Any  # fitted to the data, with the target scale it trained on
    data: Any
    modules: Any
    checkpoint: dict  # the file as loaded once (its provenance); {} for an export


def evaluate_checkpoints(cfg: DictConfig) -> None:
    """Pre-flight → for each checkpoint: rebuild on its data → (average) → metrics, or a
    calibration fitted on val → tables → (add to its MLflow run, export) → the comparison."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    context = RunContext.open(processes_from_env(), cfg.device)  # each process takes a shard
    plan = check_evaluate(cfg, context)
    out = Outputs(run_dir, context.is_main, Tracker([TensorBoard()] if context.is_main else []))
    run = Evaluation(cfg, plan, context, Precision(cfg.precision, context.device), out)
    out.track()
    results: dict[str, dict] = {}
    asked = cfg.split
    for index, path in enumerate(plan.files):
        seen = path.stat()  # a calibration is stored only if no run replaced the file since
        evaluated = rebuilt_on_data(run, path)
        cfg.split = chosen_split(asked, evaluated.data, path)
        check_val_held_out(path, evaluated.config, cfg.split, plan.fitting)  # a refit's
        if plan.copies is not None:  # average=top_k: BatchNorm refitted on train; then kept
            refit_and_keep_average(run, evaluated, run_dir / "averaged.pt")
        task, metrics, before = judged(run, evaluated, seen)
        where = (str(path), index if len(plan.files) > 1 else None)  # title; the files' number
        results[str(path)] = result = task.tables(out, where, metrics, cfg.split)
        checkpoint = evaluated.checkpoint
        result.update(provenance.split_check(checkpoint, path, evaluated.data, cfg.split))
        if task.calibrated is not None:  # what every figure above applied
            result.update(calibration=task.calibrated.record())
        if before is not None:
            result.update(before=before)
        if plan.to_training_run is not None and context.is_main:  # logger=mlflow
            node, config = plan.to_training_run, evaluated.config
            add_to_training_run(node, checkpoint, path, config, result, cfg.split)
        if cfg.export and context.is_main:
            stored = (evaluated.config, InputRecord.from_run(evaluated.data, task))
            exported = Path(cfg.export)
            export_evaluated(evaluated.modules, task, stored, exported, out, cfg.onnx_exporter)
    out.close()
    if len(results) > 1:
        out.print(tables.comparison(results, cfg.split))
    out.write_json("metrics.json", results)
    if cfg.report:  # report.html beside it
        out.report(lambda: write_evaluation_report(run_dir, results))
    out.print(f"evaluation run dir: {run_dir}")
    context.close()


def rebuilt_on_data(run: Evaluation, path: Path) -> Evaluated:
    """The checkpoint at ``path`` (or the average of the top-k copies ``average=top_k``
    names), its data read as it was trained on (normalised by its record, even moved or new
    files) and its model rebuilt from the file alone."""
    cfg, plan = run.cfg, run.plan
    checkpoint = load_checkpoint(path) if path.suffix != ".safetensors" else {}  # read once
    config, weights, inputs, which = (
        average_checkpoints(plan.copies, cfg.weights)
        if plan.copies is not None
        else read_checkpoint(path, cfg.config, cfg.weights, checkpoint or None)
    )
    task = build(task_config(config))  # what it was trained to predict
    if plan.fitting is not None and isinstance(inputs, dict):  # replaced, even if unreadable
        inputs = {key: value for key, value in inputs.items() if key != "calibration"}
    stored = None if inputs is None else InputRecord.read(inputs, path)
    data_node = data_config(config["data"], cfg.data, stored)
    with reading_stored_data(data_node, cfg.data):  # errors name the path, not its content
        data = build(data_node, **task.data_arguments(data_node, stored))
    if stored is not None:
        data.follow_record(stored, path)
    task = task.fitted(data, run.context.device, stored)  # the target scale it trained on
    modules = rebuild_model(config, weights, data, run.context.device, task)
    return Evaluated(path, config, inputs, which, task, data, modules, checkpoint)


def chosen_split(asked: str, data: Any, path: Path) -> str:
    """The split ``split=`` names: ``auto`` is the one training tested on (test, or val when
    the data has no test split, as the run recorded); a split the data lacks is one line."""
    if asked == "auto":
        return data.test_split
    if data.splits.get(asked) is None:
        raise UserError(
            f"split={asked}: the data {path} was trained on has no {asked} split (training "
            f"tested on {data.test_split}); pass split={data.test_split}, or leave split=auto"
        )
    return asked


def refit_and_keep_average(run: Evaluation, evaluated: Evaluated, kept: Path) -> None:
    """The average's BatchNorm statistics, refitted on the train split; then the averaged
    weights kept at ``kept`` (rank 0)."""
    model, seed = evaluated.modules.model, evaluated.config["seed"]
    placement = run.context.placement(evaluated.modules.channels_last)
    train = evaluated.data.batches("train", placement, seed=seed, train=False)
    refitted = recompute_batchnorm(model, train.epoch(0), run.precision)
    if run.context.is_main:
        said = "; BatchNorm statistics refitted on the train split" if refitted else ""
        stored = (evaluated.config, evaluated.inputs)
        keep_average(model, stored, run.plan.copies, kept, said, run.out)


def judged(run: Evaluation, evaluated: Evaluated, seen: Any) -> tuple[Any, dict, dict | None]:
    """(the task as it scored, its detailed metrics on the split asked, the metrics before a
    calibration): the stored calibration applied, or one fitted on val (``calibrate=``,
    ``threshold=``) and stored in the checkpoint's record for predict.py and the exports."""
    cfg, out, task, path = run.cfg, run.out, evaluated.task, evaluated.path
    model, seed = evaluated.modules.model, evaluated.config["seed"]
    placement = run.context.placement(evaluated.modules.channels_last)
    batches = evaluated.data.batches(cfg.split, placement, seed=seed, train=False)
    if run.plan.fitting is None:
        metrics = evaluate(model, batches.epoch(0), run.precision, task.scores(detailed=True))
        if task.calibrated is not None:  # stored by an earlier calibrate=/threshold=
            out.print(f"{path}: applying its stored calibration: {task.calibrated.described()}")
        return task, metrics, None
    check_can_store(path, evaluated.inputs, evaluated.data.test_split)
    val = evaluated.data.batches("val", placement, seed=seed, train=False)
    fit = (run.plan.fitting, evaluated.weights, cfg.split)
    task, metrics, before = calibrate_on_val(task, model, (val, batches), run.precision, fit, out)
    if run.context.is_main:
        replace_inputs_record(path, {**evaluated.inputs, **task.record()}, seen)
        out.print(f"stored in {path}'s record")
    return task, metrics, before


if __name__ == "__main__":
    run_cli(main, "evaluate")
