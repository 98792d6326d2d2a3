"""Predict with a saved checkpoint: the model and the evaluation transform come from the
checkpoint alone, never from the data it was trained on.

    python predict.py ckpt=checkpoints/<run_name>/best.pt input=photos/ out=predictions.csv
    python predict.py ckpt=checkpoints/<run_name> input=cat.png topk=3
    python predict.py ckpt=checkpoints/<run_name>/best.pt input=new_rows.csv   # a data=csv run
    python predict.py ckpt=best.pt input=photos/ weights=raw                   # not the EMA

``input`` is an image file, a folder of images (searched recursively, sorted by path), or, for
a model trained on a table (``data=csv``), a CSV/TSV file with the same feature columns (the
target column may be there or not). Each input gets one row in ``out``: its path relative to
``input`` (or its row number, counted from 1 after the header), then the ``topk`` classes and
probabilities. Images are decoded and resized exactly as an image folder's are, and normalised
with the checkpoint's own mean and std. A checkpoint is read as untrusted data (utils/trust.py).
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from utils.checkpoint import atomic_file, checkpoint_to_evaluate, load_checkpoint, load_weights
from utils.cli import run_cli
from utils.distributed import Processes
from utils.errors import EXIT_USER_ERROR, UserError
from utils.modules import Modules
from utils.outputs import Outputs
from utils.predictions import InputRecord, read_inputs, top_classes
from utils.run import RunContext
from utils.stored import check_stored_model, chosen_weights, model_config
from utils.trust import check_stored_config, require_keys


@hydra.main(version_base="1.3", config_path="conf", config_name="predict")
def main(cfg: DictConfig) -> None:
    try:
        predict(cfg)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def checkpoint_file(ckpt: str) -> Path:
    """A file as given; a run's folder → its best.pt (else last.pt, else its newest)."""
    path = Path(ckpt)
    if not path.is_dir():
        return path
    found = checkpoint_to_evaluate(path)
    if found is None:
        raise UserError(f"ckpt={ckpt}: no checkpoint in that folder")
    return found


def predict(cfg: DictConfig) -> None:
    for key in ("ckpt", "input"):
        if OmegaConf.is_missing(cfg, key):
            raise UserError(f"{key} is required: python predict.py ckpt=<checkpoint> input=<images "
                            "or CSV> out=predictions.csv")  # fmt: skip
    if not (isinstance(cfg.topk, int) and cfg.topk >= 1):
        raise UserError(f"topk={cfg.topk} must be a whole number, 1 or more")
    path = checkpoint_file(str(cfg.ckpt))
    checkpoint = load_checkpoint(path)
    config = checkpoint.get("config")
    require_keys(config, path, {"model": dict, "data": dict})
    check_stored_config(config, path)
    record = InputRecord.of(checkpoint, path)
    context = RunContext.open(Processes(), cfg.device)
    out = Outputs(Path(HydraConfig.get().runtime.output_dir), True, events=False)
    model_node = OmegaConf.create(model_config(config["model"]))
    weights = chosen_weights(checkpoint, cfg.weights, path)
    shapes = {"input_shape": record.input_shape, "num_classes": record.num_classes}
    check_stored_model(model_node, shapes, weights)  # before anything it asks is allocated
    modules = Modules.build(model_node, record, context.device, channels_last=None)
    load_weights(modules.model, weights)
    names, inputs = read_inputs(Path(str(cfg.input)), record)
    model = modules.model.eval()
    probabilities, transform = [], record.transform(context.device)
    with torch.inference_mode():
        for lo in range(0, len(inputs), cfg.batch_size):
            batch = transform.normalize(inputs[lo : lo + cfg.batch_size])
            probabilities.append(torch.softmax(model(batch).float(), dim=1).cpu())
    rows = top_classes(
        torch.cat(probabilities), record.class_names, min(cfg.topk, record.num_classes)
    )
    write_predictions(Path(str(cfg.out)), names, rows)
    out.print(f"{len(names)} predictions from {path} ({cfg.weights} weights) -> {cfg.out}")
    for name, row in list(zip(names, rows, strict=True))[:10]:
        shown = "  ".join(f"{label} {p:.3f}" for label, p in row)
        out.print(f"  {name}: {shown}")
    if len(names) > 10:
        out.print(f"  ... {len(names) - 10} more in {cfg.out}")
    context.close()


def write_predictions(out: Path, names: list[str], rows: list[list[tuple[str, float]]]) -> None:
    """One row per input: its name, then class and probability for each of the top k."""
    k = len(rows[0]) if rows else 0
    header = ["input"] + [f"{what}{i}" for i in range(1, k + 1) for what in ("class", "p")]
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    for name, row in zip(names, rows, strict=True):
        writer.writerow([name] + [v for label, p in row for v in (label, f"{p:.6f}")])
    try:
        with atomic_file(out) as f:  # complete or not at all
            f.write(text.getvalue().encode())
    except OSError as error:
        raise UserError(f"cannot write {out}: {error.strerror}; choose another out=...") from None


if __name__ == "__main__":
    run_cli(main, "predict")
