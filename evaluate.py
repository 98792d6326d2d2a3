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

from utils import eval_tables as tables
from utils.checkpoint import TO_EVALUATE, find_checkpoints, load_checkpoint, load_weights
from utils.config import build, run_cli
from utils.distributed import processes_from_env
from utils.errors import EXIT_USER_ERROR, UserError
from utils.evaluation import evaluate
from utils.modules import Modules
from utils.outputs import Outputs
from utils.precision import Precision
from utils.run import RunContext
from utils.trust import check_stored_config, require_keys


def run_checkpoint(folder: Path) -> Path | None:
    """A run's checkpoint to evaluate, by the rule resume also follows (utils/checkpoint.py)
    but preferring the best weights: best.pt, else last.pt, else the newest top-k copy."""
    return next(iter(find_checkpoints(folder, prefer=TO_EVALUATE)), None)


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
        found = run_checkpoint(entry)
        jobs = (
            [found] if found else [run_checkpoint(p) for p in sorted(entry.iterdir()) if p.is_dir()]
        )
        jobs = [job for job in jobs if job]
        if not jobs:
            raise UserError(f"ckpt={entry}: no checkpoint in that folder or the ones in it")
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
    context = RunContext.open(processes_from_env(), cfg.device)  # each process takes a shard
    out = Outputs(run_dir, context.is_main, events=True)  # rank 0 reports
    precision = Precision(cfg.precision, context.device)
    files = checkpoint_files(cfg.ckpt)
    if cfg.export and len(files) != 1:
        raise UserError(f"export takes one checkpoint; ckpt names {len(files)}")
    out.open_events()
    results: dict[str, dict] = {}
    for index, path in enumerate(files):
        config, weights = read_checkpoint(path, cfg.config)
        data = build(data_config(config["data"], cfg.data))
        model_node = OmegaConf.create(config["model"])
        modules = Modules.build(model_node, data, context.device, channels_last=None)
        load_weights(modules.model, weights)
        placement = context.placement(modules.channels_last)
        batches = data.batches(cfg.split, placement, seed=config["seed"], train=False)
        metrics = evaluate(modules.model, batches.epoch(0), precision, data.num_classes,
                           confusion=True)  # fmt: skip
        confusion = metrics["confusion"]
        results[str(path)] = tables.checkpoint_tables(out, str(path), metrics, cfg.split)
        out.writer.add_image(f"confusion/{index}", tables.confusion_image(confusion), 0)
        csv_name = "confusion.csv" if len(files) == 1 else f"confusion-{index}.csv"
        out.write_text(csv_name, tables.confusion_csv(confusion))
        if cfg.export and context.is_main:
            export_safetensors(modules.model, config, Path(cfg.export))
            out.print(f"exported weights to {cfg.export}")
    out.close()
    if len(results) > 1:
        out.print(tables.comparison(results, cfg.split))
    out.write_json("metrics.json", results)
    out.print(f"evaluation run dir: {run_dir}")
    context.close()


if __name__ == "__main__":
    run_cli(main, "evaluate")
