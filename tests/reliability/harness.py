"""Shared by the reliability matrix: running train.py with a fault, checking every checkpoint
left behind, comparing final states, and reporting what held.

    pytest tests/reliability -n 0 -s | grep '^reliability'     # the figures in docs/reliability.md
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from utils.checkpoint import load_checkpoint
from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "train.py"
FAULTY_RUN = ROOT / "tests" / "helpers" / "faulty_run.py"
# Small but real: 39 optimizer steps per epoch, 3 epochs, dropout and the cosine schedule on.
JOB = ("model.hidden_sizes=[64]", "data.batch_size=32", "trainer.max_epochs=3",
       "trainer.log_every_n_steps=10")  # fmt: skip


def start(cwd: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    """``train.py`` through the fault injector (inert without KILL_AT / FAIL_SAVE)."""
    return subprocess.Popen(
        [sys.executable, str(FAULTY_RUN), str(TRAIN), *JOB, *overrides],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def run(cwd: Path, *overrides: str, env: dict | None = None, signal_after: tuple | None = None):
    """Run to the end, or send ``signal_after = (signum, seconds)`` from outside."""
    process = start(cwd, *overrides, env=env)
    if signal_after:
        signum, seconds = signal_after
        time.sleep(seconds)
        if process.poll() is None:
            process.send_signal(signum)
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def unreadable_checkpoints(folder: Path) -> list[str]:
    """Checkpoint files that do not load (leftover temporary files are not checkpoints)."""
    bad = []
    for path in sorted(folder.glob("*.pt")) if folder.is_dir() else []:
        try:
            load_checkpoint(path)
        except UserError:
            bad.append(path.name)
    return bad


def same_ending(a: Path, b: Path) -> bool:
    """Bit-identical parameters and optimizer state."""
    first, second = load_checkpoint(a), load_checkpoint(b)
    if first["global_step"] != second["global_step"]:
        return False
    if any(not torch.equal(v, second["model"][k]) for k, v in first["model"].items()):
        return False
    for index, state in first["optimizer"]["state"].items():
        other = second["optimizer"]["state"][index]
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not torch.equal(value, other[key]):
                return False
    return True


def report(kind: str, **figures) -> None:
    print("\nreliability:", kind, " ".join(f"{k}={v}" for k, v in figures.items()))


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run of the reliability job: the ending every trial must reach."""
    cwd = tmp_path_factory.mktemp("reference")
    code, _, err = run(cwd, "run_name=ref")
    assert code == 0, err[-3000:]
    return cwd / "checkpoints" / "ref" / "last.pt"
