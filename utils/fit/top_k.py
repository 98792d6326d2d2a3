"""The top-k copies of a run (``trainer.keep_top_k``): their names, their ranking, which stay
and which go. A stored list is untrusted input: only torchloom's own top-k names, directly
inside the run's checkpoint folder, are ever deleted."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from utils.files import copy_atomic

log = logging.getLogger("torchloom")
TOP_K_NAME = re.compile(r"epoch=(\d{3,})-[A-Za-z0-9_.+-]+=-?(\d+\.\d{4}|inf|nan)\.pt")


def copy_of_epoch(ranked: list, epoch: int) -> str:
    """The top-k file name of ``epoch`` among ``ranked``, or ""."""
    for _, name in ranked:
        match = TOP_K_NAME.fullmatch(name) if isinstance(name, str) else None
        if match and int(match.group(1)) == epoch:
            return name
    return ""


def top_k_name(epoch: int, monitor: str, value: float) -> str:
    return f"epoch={epoch:03d}-{monitor.replace('/', '_')}={value:.4f}.pt"


def own_top_k_file(folder: Path, name: Any) -> Path | None:
    """``folder / name`` when ``name`` is a top-k file name torchloom writes and the path lies
    directly inside ``folder``; None for anything else (a stored list is untrusted input)."""
    if not isinstance(name, str) or not TOP_K_NAME.fullmatch(name):
        return None
    path = folder / name
    if path.resolve().parent != folder.resolve():
        return None
    return path


def top_k_files(folder: Path) -> list[Path]:
    """The top-k copies torchloom wrote in a run's checkpoint ``folder``, oldest epoch first."""
    return sorted(p for p in folder.glob("epoch=*.pt") if own_top_k_file(folder, p.name))


def checked_top_k(ranked: Any, folder: Path) -> list:
    """The ``top_k`` list of a checkpoint, without entries that are not torchloom's own top-k
    files in ``folder`` (each dropped with a warning)."""
    kept = []
    for entry in ranked if isinstance(ranked, list) else []:
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int | float)
        if ok and own_top_k_file(folder, entry[1]) is not None:
            kept.append(entry)
        else:
            log.warning(
                "warning: ignoring top-k entry %r of the checkpoint: not a top-k file "
                "torchloom writes in %s",
                entry,
                folder,
            )
    return kept


def prune_top_k(folder: Path, ranked: list, k: int, epoch: int) -> None:
    """After a resume: trim ``ranked`` to ``k`` (``keep_top_k`` may have been lowered), and
    delete the top-k files the run no longer tracks: the trimmed ones, those of epochs after
    the resume point (left by the run's own later epochs, which it now trains again), and
    those a kill kept from being deleted once they fell out."""
    del ranked[k:]
    tracked = {name for _, name in ranked}
    for path in sorted(folder.glob("epoch=*.pt")):
        if TOP_K_NAME.fullmatch(path.name) and path.name not in tracked:
            log.info(
                "removing %s: not among the top %d from this resume point (epoch %d)",
                path,
                k,
                epoch,
            )
            path.unlink(missing_ok=True)


def rank_top_k(ranked: list, k: int, name: str, value: float, monitor) -> tuple[bool, list[str]]:
    """Enter ``name`` (scored ``value``) into ``ranked``, the ``[[value, file name], ...]`` list
    kept in the training state, best first. Returns whether the file should be written and
    which files fell out; the caller writes the new file before deleting those, so a crash
    never leaves fewer than before."""
    if k == 0 or (len(ranked) >= k and not monitor.better(value, ranked[-1][0])):
        return False, []
    ranked.append([value, name])
    ranked.sort(key=lambda entry: -monitor.sign * entry[0])
    dropped = [dropped_name for _, dropped_name in ranked[k:]]
    del ranked[k:]
    return True, dropped


def keep_copies(folder: Path, best: bool, top_k_file: str | bool, dropped: list[str]) -> None:
    """Copy the just-written ``last.pt`` to ``best.pt`` and to its top-k name, then delete the
    top-k files that fell out: new files are complete before old ones go. Only torchloom's own
    top-k files in ``folder`` are ever deleted."""
    if best:
        copy_atomic(folder / "last.pt", folder / "best.pt")
    if top_k_file:
        copy_atomic(folder / "last.pt", folder / top_k_file)
        for name in dropped:
            path = own_top_k_file(folder, name)
            if path is None:
                log.warning("warning: not deleting %r: not a top-k file of %s", name, folder)
            else:
                path.unlink(missing_ok=True)
