"""Evaluate saved checkpoints, rebuilding model and data from each checkpoint alone.

    python evaluate.py ckpt=checkpoints/<run_name>/best.pt             # the test split
    python evaluate.py ckpt=checkpoints/<run_name> split=val           # the run's best.pt
    python evaluate.py ckpt=[a.pt,b.pt]                                # a comparison table
    python evaluate.py ckpt=checkpoints/<sweep_name>                   # every job of a sweep
    python evaluate.py ckpt=best.pt data.root=/mnt/datasets            # data moved elsewhere
    python evaluate.py ckpt=best.pt export=model.safetensors           # weights without pickle
    python evaluate.py ckpt=model.safetensors                          # and back
    torchrun --nproc_per_node=2 evaluate.py ckpt=best.pt               # each process a shard

The stored config is data read from a file, so it is untrusted: it may hold no interpolation,
and only the exact builders named in torchloom's own conf/ files are instantiated from it
(utils/trust.py). It never downloads unless data.download=true is given here.
Outputs in runs/eval/<timestamp>/: metrics.json, a confusion-matrix CSV per checkpoint, and
TensorBoard images of the confusion matrices.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from utils.checkpoint import load_checkpoint, load_weights
from utils.config import build, run_cli
from utils.device import resolve_device
from utils.distributed import NullWriter, close_processes, join, processes_from_env
from utils.errors import EXIT_USER_ERROR, UserError
from utils.evaluation import evaluate, per_class_scores
from utils.precision import Precision
from utils.report import write_json
from utils.trust import check_stored_config, require_keys

console = Console()


def run_checkpoint(folder: Path) -> Path | None:
    """A run's checkpoint to evaluate: its best.pt, else its last.pt."""
    return next((folder / n for n in ("best.pt", "last.pt") if (folder / n).is_file()), None)


def checkpoint_files(ckpt: Any) -> list[Path]:
    """Files named by ``ckpt``: files as given; a run's folder → its best.pt (else last.pt);
    a sweep's folder → that of each job folder inside it."""
    entries = list(ckpt) if isinstance(ckpt, (list, tuple)) or OmegaConf.is_list(ckpt) else [ckpt]
    files: list[Path] = []
    for entry in (Path(str(e)) for e in entries):
        if entry.is_file():
            files.append(entry)
            continue
        if not entry.is_dir():
            raise UserError(f"ckpt={entry}: no such checkpoint file or folder")
        found = run_checkpoint(entry)
        jobs = (
            [found] if found else [run_checkpoint(p) for p in sorted(entry.iterdir()) if p.is_dir()]
        )
        jobs = [job for job in jobs if job]
        if not jobs:
            raise UserError(f"ckpt={entry}: no best.pt or last.pt in that folder or the ones in it")
        files += jobs
    return files


def read_checkpoint(path: Path, config_path: str | None) -> tuple[dict, dict]:
    """(stored config, model weights) from a torchloom checkpoint or a .safetensors export. The
    config is checked as untrusted data before anything is built from it."""
    if path.suffix != ".safetensors":
        checkpoint = load_checkpoint(path)
        config, source = checkpoint.get("config"), path
        weights = checkpoint["model"]
    else:
        weights, stored = read_safetensors(path)
        if config_path:
            config, source = read_yaml_config(Path(config_path)), Path(config_path)
        elif stored is None:
            raise UserError(f"{path} carries no config; pass config=<run dir>/.hydra/config.yaml")
        else:
            config, source = stored, path
    require_keys(config, source, {"model": dict, "data": dict, "seed": int})
    check_stored_config(config, source)
    return config, weights


def read_safetensors(path: Path) -> tuple[dict, Any]:
    try:
        from safetensors import safe_open
    except ImportError:
        raise UserError(
            'reading .safetensors needs the extra: pip install -e ".[export]"'
        ) from None
    try:
        with safe_open(str(path), framework="pt") as f:
            weights = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
            stored = (f.metadata() or {}).get("torchloom_config")
        return weights, None if stored is None else json.loads(stored)
    except Exception:
        raise UserError(f"not a readable checkpoint: {path}") from None


def read_yaml_config(path: Path) -> Any:
    """A run's ``.hydra/config.yaml`` as plain containers, parsed but never resolved."""
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:
        raise UserError(f"config={path}: not a readable YAML config") from None


def export_safetensors(model: torch.nn.Module, config: dict, path: Path) -> None:
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise UserError('export needs the extra: pip install -e ".[export]"') from None
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(path), metadata={"torchloom_config": json.dumps(config)})
    console.print(f"exported weights to {path}")


def data_config(stored: dict, overrides: DictConfig) -> DictConfig:
    """The checkpoint's data config with the non-null ``data.*`` overrides applied. A stored
    ``download: true`` is not followed: only ``data.download=true`` on this command line
    downloads."""
    merged = dict(stored)
    if "download" in merged:
        merged["download"] = False
    for key, value in OmegaConf.to_container(overrides).items():
        if value is None:
            continue
        if key == "batch_size":  # evaluation batches are the run's eval_batch_size
            key = "eval_batch_size"
        if key not in merged:
            raise UserError(f"data.{key} does not apply to {stored['_target_']}")
        merged[key] = value
    return OmegaConf.create(merged)


def confusion_image(confusion: torch.Tensor, cell: int = 12) -> torch.Tensor:
    """Rows normalised to [0, 1], dark = many: a [1, H, W] image for TensorBoard."""
    rows = confusion.double() / confusion.sum(dim=1, keepdim=True).clamp(min=1)
    image = (1 - rows).float().repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    return image.unsqueeze(0)


def report(name: str, metrics: dict, split: str) -> dict[str, Any]:
    """Print one checkpoint's tables; return its JSON-ready metrics."""
    confusion = metrics.pop("confusion")
    scores = per_class_scores(confusion)
    support = confusion.sum(dim=1).tolist()
    classes = len(support)
    summary = {f"{split}/{k}": v for k, v in metrics.items()}
    for score in ("precision", "recall", "f1"):
        summary[f"{split}/macro_{score}"] = sum(scores[score]) / classes
    overview = Table(title=f"{name} — {split}")
    overview.add_column("metric")
    overview.add_column("value", justify="right")
    for key in ("loss", "acc", "acc_top5"):
        if f"{split}/{key}" in summary:
            overview.add_row(f"{split}/{key}", f"{summary[f'{split}/{key}']:.4f}")
    console.print(overview)
    table = Table(title="per class")
    for column in ("class", "precision", "recall", "F1", "support"):
        table.add_column(column, justify="right")
    for index in range(classes):
        table.add_row(
            str(index),
            *(f"{scores[s][index]:.4f}" for s in ("precision", "recall", "f1")),
            str(support[index]),
        )
    table.add_row(
        "macro",
        *(f"{summary[f'{split}/macro_{s}']:.4f}" for s in ("precision", "recall", "f1")),
        str(sum(support)),
        style="bold",
    )
    console.print(table)
    if classes <= 20:
        matrix = Table(title="confusion (rows: true class, columns: predicted)")
        matrix.add_column("")
        for index in range(classes):
            matrix.add_column(str(index), justify="right")
        for index, row in enumerate(confusion.tolist()):
            matrix.add_row(str(index), *map(str, row))
        console.print(matrix)
    return {**summary, "per_class": scores, "support": support, "confusion": confusion.tolist()}


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    try:
        evaluate_checkpoints(cfg)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def evaluate_checkpoints(cfg: DictConfig) -> None:
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise UserError("ckpt is required: python evaluate.py ckpt=checkpoints/<run_name>/best.pt")
    if cfg.split not in ("train", "val", "test"):
        raise UserError(f"split={cfg.split!r} must be train, val or test")
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    processes = processes_from_env()
    console.quiet = not processes.is_main  # every process evaluates its shard; rank 0 reports
    device = join(processes, resolve_device(cfg.device))
    precision = Precision(cfg.precision, device)
    files = checkpoint_files(cfg.ckpt)
    if cfg.export and len(files) != 1:
        raise UserError(f"export takes one checkpoint; ckpt names {len(files)}")

    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(run_dir) if processes.is_main else NullWriter()
    results: dict[str, dict] = {}
    for index, path in enumerate(files):
        config, weights = read_checkpoint(path, cfg.config)
        data = build(data_config(config["data"], cfg.data))
        model = build(
            OmegaConf.create(config["model"]),
            input_shape=data.input_shape,
            num_classes=data.num_classes,
        )
        load_weights(model, weights)
        model.to(device)
        batches = data.batches(
            cfg.split, device, seed=config["seed"], train=False, rank=processes.rank,
            world_size=processes.world_size,
        )  # fmt: skip
        metrics = evaluate(model, batches.epoch(0), precision, data.num_classes, confusion=True)
        confusion = metrics["confusion"]
        results[str(path)] = report(str(path), metrics, cfg.split)
        writer.add_image(f"confusion/{index}", confusion_image(confusion), 0)
        csv_name = "confusion.csv" if len(files) == 1 else f"confusion-{index}.csv"
        rows = [",".join(["true\\predicted", *map(str, range(data.num_classes))])]
        rows += [",".join([str(i), *map(str, row)]) for i, row in enumerate(confusion.tolist())]
        if processes.is_main:
            (run_dir / csv_name).write_text("\n".join(rows) + "\n")
        if cfg.export and processes.is_main:
            export_safetensors(model, config, Path(cfg.export))
    writer.close()

    if len(results) > 1:
        table = Table(title=f"comparison — {cfg.split}")
        keys = [k for k in next(iter(results.values())) if k.startswith(f"{cfg.split}/")]
        table.add_column("checkpoint", overflow="fold")
        for key in keys:
            table.add_column(key.split("/")[1].replace("macro_", "macro "), justify="right")
        for name, result in results.items():
            table.add_row(name, *(f"{result.get(k, float('nan')):.4f}" for k in keys))
        console.print(table)
    if processes.is_main:
        write_json(results, run_dir / "metrics.json")
    console.print(f"evaluation run dir: {run_dir}")
    close_processes()


if __name__ == "__main__":
    run_cli(main, "evaluate")
