"""Predict with a saved checkpoint: the model and the evaluation transform come from the
checkpoint alone, never from the data it was trained on.

    python predict.py ckpt=checkpoints/<run_name>/best.pt input=photos/ out=predictions.csv
    python predict.py ckpt=checkpoints/<run_name> input=cat.png topk=3
    python predict.py ckpt=checkpoints/<run_name>/best.pt input=new_rows.csv   # a data=csv run
    python predict.py ckpt=best.pt input=photos/ weights=raw                   # not the EMA
    python predict.py ckpt=model.safetensors input=photos/                     # an export

``input`` is an image file, a folder of images (searched recursively, sorted by path), or, for
a model trained on a table (``data=csv``), a CSV/TSV file with the same feature columns (the
target column may be there or not). Each input gets one row in ``out``: its path relative to
``input`` (or its row number, counted from 1 after the header), then by the checkpoint's task:
the ``topk`` classes and probabilities (classification); the labels whose probability reaches
``threshold``, then every label's probability (multilabel); or each target's predicted value,
in the targets' own units (regression). Images are decoded and resized exactly as an image folder's are, and normalised
with the checkpoint's own mean and std. A checkpoint is read as untrusted data (utils/config/trust.py).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from data.tables.table import unseen_line
from data.text.files import decoded
from utils.checkpoint.rebuild import rebuild
from utils.errors import UserError
from utils.evaluation.sampling import continued
from utils.files import write_file
from utils.preflight.predict import check_predict, out_path, prompted
from utils.run.cli import one_line_errors, run_cli
from utils.run.outputs import Outputs
from utils.run.provenance import prediction_record
from utils.run.start import RunContext
from utils.system.distributed import Processes
from utils.text import cell, shown

log = logging.getLogger("torchloom")


@hydra.main(version_base="1.3", config_path="conf", config_name="predict")
def main(cfg: DictConfig) -> None:
    one_line_errors(predict, cfg)


def predict(cfg: DictConfig) -> None:
    path = check_predict(cfg)  # the checkpoint ckpt= names
    context = RunContext.open(Processes(), cfg.device)
    out = Outputs(Path(HydraConfig.get().runtime.output_dir), True)
    rebuilt = rebuild(path, cfg.weights, context.device)  # as evaluate.py reads: untrusted
    model, record, task = rebuilt.model, rebuilt.record, rebuilt.task
    if prompted(cfg):  # a language model: its continuation of each prompt
        continue_prompts(cfg, path, rebuilt, context.device, out)
        context.close()
        return
    names, inputs, unseen = record.read_inputs(Path(str(cfg.input)))  # as its kind reads them
    unseen = unseen_categories(Path(str(cfg.input)), unseen, cfg.unseen)
    outputs, transform = [], record.transform(context.device)
    with torch.inference_mode():
        for lo in range(0, len(inputs), cfg.batch_size):
            batch = transform.normalize(inputs[lo : lo + cfg.batch_size])
            outputs.append(model(batch).float().cpu())
    outputs = torch.cat(outputs)
    broken = (~torch.isfinite(outputs)).flatten(1).any(dim=1)
    if bool(broken.any()):  # finite weights, yet NaN out (an edited scale of 0): never a CSV
        raise UserError(
            f"ckpt={path}: the model's outputs for {names[int(broken.nonzero()[0])]} are NaN or "
            "Inf, from finite inputs: the checkpoint's weights are damaged or were edited"
        )
    header, rows, lines = task.decode(outputs, cfg)  # by task: topk, threshold
    if unseen is not None:  # a flag per row: the categories it was predicted without
        header, rows = [*header, "unseen"], [[*r, u] for r, u in zip(rows, unseen, strict=True)]
    # What the file came from, read (and checked) first: a refusal leaves no CSV without it.
    traced = prediction_record(path, Path(str(cfg.input)), inputs)
    target = Path(out_path(cfg))
    write_predictions(target, header, [[n, *r] for n, r in zip(names, rows, strict=True)])
    write_file(sidecar(target), json.dumps(traced, indent=2).encode(), "choose another out=...")
    out.print(shown(f"{len(names)} predictions from {path} ({cfg.weights} weights) -> {target}"))
    for name, line in list(zip(names, lines, strict=True))[:10]:
        out.print(f"  {shown(name)}: {shown(line)}")
    if len(names) > 10:
        out.print(shown(f"  ... {len(names) - 10} more in {target}"))
    context.close()


def continue_prompts(cfg: DictConfig, path: Path, rebuilt: Any, device: Any, out: Any) -> None:
    """``prompt=`` (or ``prompts=FILE``, one a line): each continued by the checkpoint's
    language model, printed, and written to ``out=`` when given."""
    if cfg.prompts is not None:
        prompts = [line for line in decoded(Path(str(cfg.prompts))).splitlines() if line]
        if not prompts:
            raise UserError(f"prompts={cfg.prompts}: holds no prompt; give one a line")
    else:
        prompts = [str(cfg.prompt)]
    texts = continued(rebuilt.model, rebuilt.record, prompts, cfg, device, str(path))
    for text in texts:
        print(text)
        print()
    if cfg.out is not None:
        joined = "\n\n".join(texts) + "\n"
        write_file(Path(str(cfg.out)), joined.encode("utf-8"), "choose another out=...")
        log.info("%d continuation(s) from %s -> %s", len(texts), path, cfg.out)


def unseen_categories(path: Path, unseen: list[str] | None, mode: str) -> list[str] | None:
    """``unseen=warn``: one warning naming the categorical values training never saw (a flag
    column in the output then says which rows hold them); ``unseen=error``: refused, naming
    the first. None: no such value (or no table)."""
    said = None if unseen is None else unseen_line(path, unseen)
    if said is None:
        return None
    if mode == "error":
        line = next(n for n, flag in enumerate(unseen) if flag) + 2
        raise UserError(
            f"{path} line {line}: {unseen[line - 2]} is a category the train file "
            "never held, which the model would see as all zeros; fix the value, "
            "or pass unseen=warn to predict it flagged"
        )
    log.warning(
        "warning: %s; predicted with those columns all zeros, and flagged in the "
        "'unseen' column of the output (unseen=error refuses them)",
        said,
    )
    return unseen


def sidecar(out: Path) -> Path:
    """Where the record of what ``out`` was made from goes: ``<out>.provenance.json``."""
    return out.with_name(f"{out.name}.provenance.json")


def write_predictions(out: Path, header: list[str], rows: list[list[str]]) -> None:
    """One row per input: its name, then what the task decoded of its output."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["input", *header])
    # Every cell, not only the names: a flag or label built from a CSV's column names or
    # categories is data from elsewhere too.
    writer.writerows([cell(value) for value in row] for row in rows)
    write_file(out, text.getvalue().encode(), "choose another out=...")


if __name__ == "__main__":
    run_cli(main, "predict")
