"""predict.py's pre-flight: the keys it needs, and the checkpoint ``ckpt=`` names, checked
before anything is read; ``out=`` is never one of its inputs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from utils.checkpoint.load import checkpoint_to_evaluate
from utils.errors import UserError
from utils.run.outputs import check_output


def check_predict(cfg: DictConfig) -> Path:
    """Every check of predict.py's config, in one line each; the checkpoint file to read."""
    if OmegaConf.is_missing(cfg, "ckpt") or (cfg.input is None and not prompted(cfg)):
        key = "ckpt" if OmegaConf.is_missing(cfg, "ckpt") else "input"
        raise UserError(
            f"{key} is required: python predict.py ckpt=<checkpoint> input=<images "
            'or CSV> out=predictions.csv (a language model: prompt="...")'
        )
    if prompted(cfg) and cfg.input is not None:
        raise UserError(
            "give input=... (inputs to predict) or prompt=... (text to continue), not both"
        )
    if cfg.prompt is not None and cfg.prompts is not None:
        raise UserError("give prompt=... or prompts=<file>, not both")
    for key in ("topk", "batch_size"):
        if not (isinstance(cfg[key], int) and cfg[key] >= 1):
            raise UserError(f"{key}={cfg[key]} must be a whole number, 1 or more")
    if cfg.unseen not in ("warn", "error"):
        raise UserError(f"unseen={cfg.unseen!r} must be warn or error")
    path = checkpoint_file(str(cfg.ckpt))
    if prompted(cfg):
        given = [path, *([Path(str(cfg.prompts))] if cfg.prompts is not None else [])]
        if cfg.out is not None:
            check_output(Path(str(cfg.out)), "out", inputs=given, suffixes=(".txt", ".md"))
        return path
    check_output(
        Path(out_path(cfg)), "out", inputs=[path, Path(str(cfg.input))], suffixes=(".csv", ".tsv")
    )
    return path


def prompted(cfg: DictConfig) -> bool:
    """Whether predict.py continues prompts (a language model) rather than reading inputs."""
    return cfg.get("prompt") is not None or cfg.get("prompts") is not None


def out_path(cfg: DictConfig) -> str:
    """Where predictions go: ``out=``, else predictions.csv."""
    return str(cfg.out) if cfg.out is not None else "predictions.csv"


def checkpoint_file(ckpt: str) -> Path:
    """A file as given; a run's folder → its best.pt (else last.pt, else its newest)."""
    path = Path(ckpt)
    if not path.is_dir():
        return path
    found = checkpoint_to_evaluate(path)
    if found is None:
        raise UserError(f"ckpt={ckpt}: no checkpoint in that folder")
    return found
