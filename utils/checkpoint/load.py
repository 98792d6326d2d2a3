"""Reading checkpoints safely, and finding the one a command means.

Loading is ``torch.load(..., weights_only=True)``, never anything looser: a file that would
import code is refused naming what it asks for, and one whose bytes changed since they were
written (the CRC-32 of each record, utils/intact.py) is refused naming the record. Discovery
ignores temporary files (utils/files.py); ``resume=`` takes last.pt (the exact position),
evaluation best.pt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import pickletools
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from utils.checkpoint import sharded
from utils.checkpoint.format import FORMAT_VERSION
from utils.checkpoint.sharded_index import read_metadata
from utils.config.trust import with_current_targets
from utils.errors import UserError
from utils.files import save_atomic
from utils.intact import check_intact

log = logging.getLogger("torchloom")


def replace_inputs_record(path: Path, inputs: dict, seen: os.stat_result) -> None:
    """``path`` with its inputs record replaced by ``inputs`` and everything else as it was,
    written atomically (evaluate.py's calibration). Refused, with nothing written, when the
    file changed since it was read (``seen``: its stat then), so a checkpoint a run wrote in the
    meantime is never replaced by the older one."""

    def identity(stat: os.stat_result) -> tuple:
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    if identity(path.stat()) != identity(seen):
        raise UserError(
            f"{path} changed while it was evaluated (is a run still writing it?); "
            "nothing was stored: run it again once the run is done"
        )
    checkpoint = load_checkpoint(path)
    checkpoint["inputs"] = inputs
    save_atomic(checkpoint, path)


# --- Reading -------------------------------------------------------------------------------


def _offending_global(path: Path, error: Exception) -> str | None:
    """The importable name a refused pickle asks for, read without running anything."""
    match = re.search(r"GLOBAL (\S+)", str(error))
    if match:
        return match.group(1)
    if zipfile.is_zipfile(path):
        return None
    strings: list[str] = []
    try:
        with open(path, "rb") as f:
            for opcode, argument, _ in pickletools.genops(f):
                if isinstance(argument, str) and "UNICODE" in opcode.name:
                    strings.append(argument)
                elif opcode.name == "GLOBAL":
                    return str(argument).replace(" ", ".")
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    return f"{strings[-2]}.{strings[-1]}"
    except Exception:
        return None
    return None


def load_checkpoint(path: str | Path, whole_weights: bool = True) -> dict[str, Any]:
    """Load on the CPU with ``weights_only=True``, never anything looser: a file that would
    import code is refused naming what it asks for, and nothing runs. A sharded checkpoint
    folder (utils/checkpoint/sharded.py) is read as safely, its model's weights gathered whole
    (``whole_weights``; a resume reads its shards itself)."""
    path = Path(path)
    if sharded.is_sharded(path):
        return _load_sharded(path, whole_weights)
    if not path.is_file():
        raise UserError(f"no checkpoint file at {path}")
    check_intact(path, "copy it again, or use the checkpoint beside it")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        name = _offending_global(path, error)
        if name:
            raise UserError(
                f"refusing to load {path}: it would import {name}, which no checkpoint needs; "
                f"it may be hostile, so nothing from it was run"
            ) from None
        raise UserError(f"not a readable checkpoint: {path}") from None
    except Exception:
        raise UserError(f"not a readable checkpoint: {path}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise UserError(f"not a readable checkpoint: {path} (no model weights in it)")
    averages = [
        (f"{key}.model", entry.get("model"))
        for key in ("ema", "swa")
        if isinstance(entry := state.get(key), dict)
    ]  # their own checks say more
    for where, weights in (("model", state["model"]), *averages):
        if isinstance(weights, dict) and not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
        ):
            raise UserError(
                f"not a readable checkpoint: {path} (its {where} holds something "
                "other than named tensors; was it edited?)"
            )
    version = state.get("format_version", 1)
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise UserError(
            f"{path} has checkpoint format {version!r}; this torchloom reads formats 1 to "
            f"{FORMAT_VERSION}: update torchloom to read it"
        )
    if "config" in state:  # builders named where they lived when it was written
        state["config"] = with_current_targets(state["config"])
    return state


def _load_sharded(folder: Path, whole_weights: bool) -> dict[str, Any]:
    """A sharded checkpoint as one process's checkpoint: its state file, checked as any
    checkpoint is, once its index reads as data; the model's weights gathered whole."""
    if not sharded.whole(folder):
        raise UserError(
            f"{folder} is not a whole sharded checkpoint (no {sharded.STATE_FILE} or "
            f"{sharded.METADATA}: a save cut short?); resume from the one beside it"
        )
    metadata = read_metadata(folder)  # refused before anything else is read
    state = load_checkpoint(folder / sharded.STATE_FILE)
    if whole_weights:
        state["model"] = sharded.whole_tensors(folder, "model.", metadata)
    return state


@contextlib.contextmanager
def restoring(piece: str, path: Path) -> Iterator[None]:
    """Put ``piece`` of the checkpoint at ``path`` back into its owner: a state of other keys
    or types (a hand-edited file) is one line naming the piece, not a traceback."""
    try:
        yield
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as error:
        raise UserError(
            f"cannot resume from {path}: the {piece} in it are not what torchloom writes "
            f"({type(error).__name__}"
            f"; was it edited?); use init_from={path} to start from its weights"
        ) from None


TO_RESUME = ("last.pt",)  # the exact position of the run
TO_EVALUATE = ("best.pt", "last.pt")  # the run's best weights


def find_checkpoints(folder: Path, prefer: tuple[str, ...] = TO_RESUME) -> list[Path]:
    """The one rule for "which file in a run's folder": the ``prefer`` names that exist, in
    that order, then the folder's other checkpoints (top-k copies), newest first. Resume
    prefers ``last.pt``; evaluation ``best.pt``, then ``last.pt``."""
    if sharded.is_sharded(folder):  # the checkpoint itself, not a run's folder
        return [folder]
    preferred = []
    for name in prefer:  # last.pt, or a sharded run's last/ (or the last/.old a kill left)
        found = [folder / name] if (folder / name).is_file() else []
        found += [p for p in [sharded.complete_folder(folder / name.removesuffix(".pt"))] if p]
        preferred += sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    others = sorted(
        (p for p in folder.glob("*.pt") if not p.name.startswith(".") and p.name not in prefer),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    return preferred + others


def checkpoint_to_evaluate(folder: Path) -> Path | None:
    """A run's checkpoint to evaluate or predict with: best.pt, else last.pt, else the newest
    top-k copy (None when the folder holds none)."""
    return next(iter(find_checkpoints(folder, prefer=TO_EVALUATE)), None)


def load_latest(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint in ``folder``, warning about each unreadable one; None
    when there is no checkpoint at all. When there are some but none is readable, that is an
    error naming them: starting fresh would overwrite them."""
    candidates = find_checkpoints(folder)
    for candidate in candidates:
        try:
            return candidate, load_checkpoint(candidate, whole_weights=False)
        except UserError as error:
            log.warning("warning: %s; trying the previous checkpoint", error)
    if candidates:
        names = ", ".join(str(p) for p in candidates)
        raise UserError(
            f"no readable checkpoint in {folder} ({names} are not readable); move them away "
            "to start this run afresh, or resume from a good copy with resume=<file>"
        )
    return None
