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
Outputs in runs/eval/<timestamp>/: metrics.json and the task's tables (utils/evaluation/tables.py):
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

from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from utils.checkpoint.format import FORMAT_VERSION
from utils.checkpoint.load import checkpoint_to_evaluate, load_checkpoint, replace_inputs_record
from utils.checkpoint.record import InputRecord
from utils.checkpoint.stored import (
    average_checkpoints,
    check_stored_model,
    data_config,
    export_safetensors,
    model_config,
    read_checkpoint,
    reading_stored_data,
    task_config,
)
from utils.config.build import build
from utils.errors import UserError
from utils.evaluation import tables as tables
from utils.evaluation.calibration import Calibration
from utils.evaluation.export import EXPORTERS, export_model
from utils.evaluation.export import SUFFIXES as PROGRAM_SUFFIXES
from utils.evaluation.metrics import evaluate, outputs_of
from utils.files import save_atomic
from utils.fit.checkpointer import top_k_files
from utils.fit.swa import recompute_batchnorm
from utils.model.modules import Modules, model_shapes
from utils.model.weights import load_weights
from utils.precision import Precision
from utils.run.cli import one_line_errors, run_cli
from utils.run.outputs import Outputs, check_output
from utils.run.start import RunContext
from utils.system.distributed import processes_from_env
from utils.tracking.local import TensorBoard
from utils.tracking.mlflow import log_evaluation
from utils.tracking.tracker import Tracker, require


def checkpoint_files(ckpt: Any) -> list[Path]:
    """Files named by ``ckpt``: files as given; a run's folder → its best.pt (else last.pt,
    else its newest checkpoint); a sweep's folder → that of each job folder inside it."""
    entries = list(ckpt) if isinstance(ckpt, (list, tuple)) or OmegaConf.is_list(ckpt) else [ckpt]
    files: list[Path] = []
    for entry in (Path(str(e)) for e in entries):
        if entry.is_file():
            files.append(entry)
            continue
        if not entry.is_dir():
            raise UserError(f"ckpt={entry}: no such checkpoint file or folder")
        found = checkpoint_to_evaluate(entry)
        jobs = (
            [found]
            if found
            else [checkpoint_to_evaluate(p) for p in sorted(entry.iterdir()) if p.is_dir()]
        )
        jobs = [job for job in jobs if job]
        if not jobs:
            raise UserError(f"ckpt={entry}: no checkpoint in that folder or the ones in it")
        files += jobs
    return files


def export(
    modules: Modules,
    task: Any,
    stored: tuple[dict, InputRecord],
    path: Path,
    out: Outputs,
    exporter: str,
) -> None:
    """The evaluated weights to ``path``: a verified program (.pt2 with torch.export, .onnx
    with ``exporter``) holding what the record says (a regression model's outputs in the
    targets' units, a temperature and thresholds), or .safetensors with the ``stored`` config
    and the inputs record of the evaluated data and task (with the target scale) beside them."""
    suffix = path.suffix.lower()
    if suffix in PROGRAM_SUFFIXES:
        model, outputs, unit = task.exportable(modules.model)
        difference = export_model(model, modules.input_shape, path, outputs, unit, exporter)
        units = "" if unit is None else ", in the model's scaled units"
        calibrated = f"; {task.calibrated.described()}" if task.calibrated else ""
        runner = "onnxruntime" if suffix == ".onnx" else "torch.export.load"
        out.print(
            f"exported the model to {path} (outputs: {', '.join(outputs)}{calibrated}); "
            f"{runner} on batches of 1, 2 and 8 differs from PyTorch by at most "
            f"{difference:.1e} (fp32{units}, bar 1e-5)"
        )
    else:  # .safetensors (checked before anything was evaluated)
        config, record = stored
        export_safetensors(modules.model, config, record.to_dict(), path)
        out.print(f"exported weights to {path}")


def copies_to_average(cfg: DictConfig, files: list[Path]) -> list[Path] | None:
    """``average=top_k``: the top-k copies in the folder of the one checkpoint ``files`` names
    (a run's folder gives its best.pt); None without it."""
    if cfg.average not in (None, "top_k"):
        raise UserError(f"average={cfg.average} must be top_k (or null)")
    if cfg.average is None:
        return None
    if len(files) != 1 or cfg.logger or cfg.calibrate or cfg.threshold:
        raise UserError(
            "average=top_k takes one run's checkpoint folder (ckpt=checkpoints/<run>) "
            "and no calibrate=, threshold= or logger=; calibrate the averaged.pt it "
            "writes afterwards"
        )
    return top_k_files(files[0].parent)  # fewer than two: refused by the average itself


def keep_average(
    model: Any,
    stored: tuple[dict, dict | None],
    copies: list[Path],
    path: Path,
    refitted: str,
    out: Outputs,
) -> None:
    """The averaged weights (with their refitted statistics) as a checkpoint evaluate.py,
    predict.py and init_from read: the ``stored`` config and inputs record beside them."""
    config, inputs = stored
    save_atomic(
        {
            "format_version": FORMAT_VERSION,
            "model": model.state_dict(),
            "config": config,
            "inputs": inputs,
            "classes": (inputs or {}).get("classes"),
            "averaged_from": [str(p) for p in copies],
        },
        path,
    )
    out.print(
        f"averaged {len(copies)} top-k copies ({', '.join(p.name for p in copies)}) into "
        f"{path}{refitted}"
    )


def calibration_asked(cfg: DictConfig, files: list[Path], context: RunContext) -> tuple | None:
    """(fit a temperature, fit thresholds) when ``calibrate=`` or ``threshold=`` asks, checked
    before anything is read; None when neither does."""
    if cfg.calibrate not in (None, "temperature"):
        raise UserError(f"calibrate={cfg.calibrate} must be temperature (or null)")
    if cfg.threshold not in (None, "auto"):
        raise UserError(
            f"threshold={cfg.threshold} must be auto (or null); predict.py "
            "threshold=<p> sets one for its rows"
        )
    if cfg.calibrate is None and cfg.threshold is None:
        return None
    asked = "calibrate=temperature" if cfg.calibrate else "threshold=auto"
    if len(files) != 1 or files[0].suffix == ".safetensors":
        raise UserError(
            f"{asked} stores what it fits in one .pt checkpoint's record; ckpt names "
            f"{'an export' if len(files) == 1 else f'{len(files)} checkpoints'} "
            "(calibrate the .pt, then export it)"
        )
    if context.processes.world_size > 1:
        raise UserError(f"{asked} runs in one process: drop torchrun")
    return cfg.calibrate is not None, cfg.threshold is not None


def calibrate_on_val(
    task: Any,
    model: Any,
    batches: tuple[Any, Any],
    precision: Precision,
    fit: tuple[tuple, str, str],
    out: Outputs,
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


def training_run_logger(logger: Any) -> Any:
    """``logger=mlflow``: the node whose store receives each checkpoint's metrics; None
    without a logger. Other loggers track training runs only."""
    nodes = dict(logger or {})
    others = [name for name in nodes if name != "mlflow"]
    if others:
        raise UserError(
            f"logger={others[0]}: evaluate.py adds its metrics to the training "
            "run in MLflow only (logger=mlflow)"
        )
    if not nodes:
        return None
    require("mlflow", "mlflow", "logger=mlflow")
    return nodes["mlflow"]


def add_to_training_run(node: Any, path: Path, config: dict, metrics: dict, split: str) -> None:
    """The checkpoint's metrics into the MLflow run that trained it, as
    ``evaluate/<split>/<metric>`` at the checkpoint's step (``split``: for the message)."""
    checkpoint = load_checkpoint(path) if path.suffix != ".safetensors" else {}
    tracking = checkpoint.get("tracking") if isinstance(checkpoint.get("tracking"), dict) else {}
    backends = tracking.get("backends") if isinstance(tracking.get("backends"), dict) else {}
    run_id = (backends.get("mlflow") or {}).get("run_id")
    token = tracking.get("token")
    if "mlflow" not in backends:
        raise UserError(
            f"logger=mlflow: {path} was not trained with logger=mlflow, so there is "
            "no MLflow run to add its metrics to"
        )
    runs = Path(str((config.get("paths") or {}).get("runs", "runs")))
    step = checkpoint.get("global_step", 0)
    where = (runs, step if isinstance(step, int) else 0)
    run_id, uri = log_evaluation(node, (run_id, token), where, metrics, "evaluate")
    print(f"added the {split} metrics of {path} to MLflow run {run_id} ({uri})")


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    one_line_errors(evaluate_checkpoints, cfg)


def evaluate_checkpoints(cfg: DictConfig) -> None:
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise UserError("ckpt is required: python evaluate.py ckpt=checkpoints/<run_name>/best.pt")
    if cfg.split not in ("train", "val", "test"):
        raise UserError(f"split={cfg.split!r} must be train, val or test")
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    context = RunContext.open(processes_from_env(), cfg.device)  # each process takes a shard
    out = Outputs(run_dir, context.is_main, Tracker([TensorBoard()] if context.is_main else []))
    to_training_run = training_run_logger(cfg.logger)  # logger=mlflow: add to the run
    precision = Precision(cfg.precision, context.device)
    files = checkpoint_files(cfg.ckpt)
    if cfg.export and len(files) != 1:
        raise UserError(f"export takes one checkpoint; ckpt names {len(files)}")
    if cfg.onnx_exporter not in EXPORTERS:
        raise UserError(f"onnx_exporter={cfg.onnx_exporter!r} must be dynamo or torchscript")
    if cfg.export:  # never over the checkpoint it is made from
        check_output(
            Path(cfg.export), "export", files, suffixes=(*PROGRAM_SUFFIXES, ".safetensors")
        )
    fitting = calibration_asked(cfg, files, context)  # calibrate=temperature, threshold=auto
    copies = copies_to_average(cfg, files)  # average=top_k: a run's top-k copies, as one model
    out.track()
    results: dict[str, dict] = {}
    for index, path in enumerate(files):
        seen = path.stat()  # a calibration is stored only if no run replaced the file since
        averaged = copies is not None  # average=top_k
        config, weights, inputs, which = (
            average_checkpoints(copies, cfg.weights)
            if averaged
            else read_checkpoint(path, cfg.config, cfg.weights)
        )
        task = build(task_config(config))  # what it was trained to predict
        if fitting is not None and isinstance(inputs, dict):  # replaced, even if unreadable
            inputs = {key: value for key, value in inputs.items() if key != "calibration"}
        stored = None if inputs is None else InputRecord.read(inputs, path)
        data_node = data_config(config["data"], cfg.data, stored)
        with reading_stored_data(data_node, cfg.data):  # errors name the path, not its content
            data = build(data_node, **task.data_arguments(data_node))
        if stored is not None:  # normalised as trained, even on moved or new files
            data.follow_record(stored, path)
        task = task.fitted(data, context.device, stored)  # the target scale it trained on
        model_node = OmegaConf.create(model_config(config["model"]))
        shapes = model_shapes(data.input_shape, data.num_classes)
        check_stored_model(model_node, shapes, weights)  # before anything it asks is allocated
        modules = Modules.build(model_node, data, context.device, None, task)
        load_weights(modules.model, weights)
        placement = context.placement(modules.channels_last)
        if averaged:  # the average's BatchNorm statistics, from the train split; then kept
            train = data.batches("train", placement, seed=config["seed"], train=False)
            refitted = recompute_batchnorm(modules.model, train.epoch(0), precision)
            if context.is_main:
                keep_average(
                    modules.model,
                    (config, inputs),
                    copies,
                    run_dir / "averaged.pt",
                    "; BatchNorm statistics refitted on the train split" if refitted else "",
                    out,
                )
        batches = data.batches(cfg.split, placement, seed=config["seed"], train=False)
        if fitting is None:
            metrics = evaluate(
                modules.model, batches.epoch(0), precision, task.scores(detailed=True)
            )
            if task.calibrated is not None:  # stored by an earlier calibrate=/threshold=
                out.print(f"{path}: applying its stored calibration: {task.calibrated.described()}")
        else:  # fitted on val, stored in the record: what predict.py and the exports apply
            if inputs is None:
                raise UserError(
                    f"{path} holds no inputs record to store a calibration in (it "
                    "was saved before predict.py); train it one more epoch with "
                    "resume=... to write one"
                )
            if data.test_split != "test":  # its val split was its test too
                raise UserError(
                    f"{path}: its run has no test split, so it reported its val "
                    "split as its test; a calibration fitted there leaves no "
                    "honest figure: give the data a test split (a test/ folder, "
                    "data.split.test_path= or data.split.test=) and train again"
                )
            val = data.batches("val", placement, seed=config["seed"], train=False)
            task, metrics, before = calibrate_on_val(
                task, modules.model, (val, batches), precision, (fitting, which, cfg.split), out
            )
            if context.is_main:
                replace_inputs_record(path, {**inputs, **task.record()}, seen)
                out.print(f"stored in {path}'s record")
        where = (str(path), index if len(files) > 1 else None)  # title; the files' number
        results[str(path)] = task.tables(out, where, metrics, cfg.split)
        if task.calibrated is not None:  # what every figure above applied
            results[str(path)].update(calibration=task.calibrated.record())
        if fitting is not None:
            results[str(path)].update(before=before)
        if to_training_run is not None and context.is_main:
            add_to_training_run(to_training_run, path, config, results[str(path)], cfg.split)
        if cfg.export and context.is_main:
            export(
                modules,
                task,
                (config, InputRecord.from_run(data, task)),
                Path(cfg.export),
                out,
                cfg.onnx_exporter,
            )
    out.close()
    if len(results) > 1:
        out.print(tables.comparison(results, cfg.split))
    out.write_json("metrics.json", results)
    out.print(f"evaluation run dir: {run_dir}")
    context.close()


if __name__ == "__main__":
    run_cli(main, "evaluate")
