"""``python ema_per_rank.py OVERRIDES`` runs train.py as its command line would, and after every
checkpoint each process also writes its own EMA to ``$EMA_DUMP/rank<R>.pt``: the checkpoint
holds rank 0's alone, and a test compares every rank's."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from utils.fit import checkpointer  # noqa: E402

save = checkpointer.Checkpointer.save


def save_and_dump(self) -> None:
    save(self)
    folder = Path(os.environ["EMA_DUMP"])
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(self.parts.ema.state_dict(), folder / f"rank{os.environ.get('RANK', '0')}.pt")


checkpointer.Checkpointer.save = save_and_dump
sys.argv = [str(ROOT / "train.py"), *sys.argv[1:]]
runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
