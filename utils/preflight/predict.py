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
    for key in ("ckpt", "input"):
        if OmegaConf.is_missing(cfg, key):
            raise UserError(
                f"{key} is required: python predict.py ckpt=<checkpoint> input=<images "
                "or CSV> out=predictions.csv"
            )
    for key in ("topk", "batch_size"):
        if not (isinstance(cfg[key], int) and cfg[key] >= 1):
            raise UserError(f"{key}={cfg[key]} must be a whole number, 1 or more")
    if cfg.unseen not in ("warn", "error"):
        raise UserError(f"unseen={cfg.unseen!r} must be warn or error")
    path = checkpoint_file(str(cfg.ckpt))
    check_output(
        Path(str(cfg.out)), "out", inputs=[path, Path(str(cfg.input))], suffixes=(".csv", ".tsv")
    )
    return path


def checkpoint_file(ckpt: str) -> Path:
    """A file as given; a run's folder → its best.pt (else last.pt, else its newest)."""
    path = Path(ckpt)
    if not path.is_dir():
        return path
    found = checkpoint_to_evaluate(path)
    if found is None:
        raise UserError(f"ckpt={ckpt}: no checkpoint in that folder")
    return found
