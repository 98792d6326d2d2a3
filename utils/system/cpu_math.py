"""Whether the CPU's matrix products give the same bits on every run: a run resumed in a new
process must end where the uninterrupted one does.

torch's x86 wheels multiply matrices with Intel MKL, which does not promise the same bits from
one run of a program to the next: it may pick another code path (by memory alignment, say) or
another thread count, and the last bits of a product move with it. Intel's "Reproducibility
Conditions" name what makes them the same: conditional numerical reproducibility on
(``MKL_CBWR``) and a fixed thread count (``MKL_DYNAMIC=FALSE``). MKL reads the first at its
first product and the second when torch loads it, so train.py sets both before it imports
torch, and every entry point again before its first product (``run_cli``); a value already
exported wins (``MKL_CBWR=COMPATIBLE``, for example, for the same bits across CPU models too).

The thread count is the other half of that condition, and not only for MKL: torch splits a
reduction (a sum, BatchNorm's statistics) and a product's blocking by its intra-op threads, so
the same run on 1 and on 2 threads ends apart (a small CNN's weights by 3e-3 after one epoch
here). The count is not the run's to take from wherever it resumes (``OMP_NUM_THREADS``, a
library loaded in the process, torchrun's share of the cores): a checkpoint records it with
MKL's settings (:func:`cpu_numerics`), and a resume runs on the recorded count unless
``trainer.cpu_threads`` says otherwise, and says what differs (:func:`resumed_threads`).

torch's own kernels (a sum, a softmax, AdamW's update) are built for several vector widths and
run the widest the CPU has: the same run on an AVX-512 machine and on an AVX2 one ends apart
(a digits MLP one val image apart after 15 epochs, here). The width is recorded too, and a
resume on another says so with the export that restores it (``ATEN_CPU_CAPABILITY``, which
torch reads as it loads).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from utils.errors import UserError

log = logging.getLogger("torchloom")
MAX_THREADS = 4096  # a recorded thread count beyond this was edited
MKL_VALUE = re.compile(r"[A-Za-z0-9_,]{1,32}")
WIDTH_NAME = re.compile(r"[A-Z0-9 ]{1,16}")  # torch's names: DEFAULT, AVX2, AVX512, Z VECTOR, ...

SAME_BITS = {"MKL_CBWR": "AUTO", "MKL_DYNAMIC": "FALSE"}


def same_bits_every_run() -> None:
    """MKL in its run-to-run reproducible mode for this process and those it starts."""
    for name, value in SAME_BITS.items():
        os.environ.setdefault(name, value)


def cpu_numerics() -> dict:
    """What this process's CPU numbers depend on beyond the data and the code: torch's
    intra-op threads, the vector width of its kernels and MKL's reproducibility settings. A
    checkpoint records it."""
    import torch

    return {
        "cpu_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **{k: os.environ.get(k) for k in SAME_BITS},
    }


def resumed_threads(recorded: Any, asked: int | None, where: Any) -> int | None:
    """The thread count a resume asks for: ``trainer.cpu_threads`` when given (``asked``),
    else the count the checkpoint ``recorded`` (:func:`cpu_numerics`, a dict as the checkpoint
    check found it; None before it was recorded: this machine's choice). A recorded setting
    this process cannot follow (MKL's and the kernels' width, read as torch loaded) is said."""
    if recorded is None:
        return asked
    threads = recorded.get("cpu_threads")
    whole = isinstance(threads, int) and not isinstance(threads, bool)
    width = recorded.get("cpu_capability")  # absent from checkpoints before it was recorded
    for key, value, written in (
        ("cpu_threads", threads, whole and 1 <= threads <= MAX_THREADS),
        ("cpu_capability", width, _unset_or_named(width, WIDTH_NAME)),
        *(
            (name, recorded.get(name), _unset_or_named(recorded.get(name), MKL_VALUE))
            for name in SAME_BITS
        ),
    ):
        if not written:
            raise UserError(
                f"cannot resume from {where}: its numerics record is not what torchloom writes "
                f"({key}={value!r:.40}; was it edited?); use init_from={where} for its weights"
            )
    for trained, here, export, where_it_works in _other_settings(recorded, width):
        log.warning(
            "warning: the run trained with %s and resumes with %s: its last bits may differ "
            "from an uninterrupted run's (%sexport %s to resume as it trained)",
            trained,
            here,
            where_it_works,
            export,
        )
    return threads if asked is None else asked


def _unset_or_named(value: Any, names: re.Pattern) -> bool:
    return value is None or (isinstance(value, str) and names.fullmatch(value) is not None)


def _other_settings(recorded: dict, width: str | None) -> list[tuple[str, str, str, str]]:
    """Each setting read as torch loaded that differs from the one the run trained with: how
    it trained, how it resumes, the export that restores it and where that works (MKL's
    settings everywhere; a kernels' width where the CPU has it). An unrecorded width is none."""
    import torch

    differ = [
        (
            f"{name}={recorded.get(name)}",
            f"{name}={os.environ.get(name)}",
            f"{name}={recorded.get(name)}",
            "",
        )
        for name in SAME_BITS
        if recorded.get(name) != os.environ.get(name)
    ]
    here = torch.backends.cpu.get_cpu_capability()
    if width is not None and width != here:
        exported = "default" if width == "NO AVX" else width.lower().replace(" ", "")
        differ.append(
            (
                f"torch's {width} CPU kernels",
                here,
                f"ATEN_CPU_CAPABILITY={exported}",
                f"where this CPU has {width}, ",
            )
        )
    return differ


def say_resumed_threads(recorded: Any, threads: int, asked: int | None) -> None:
    """One line when the resume's thread count is the checkpoint's rather than this
    machine's, or differs from the checkpoint's because trainer.cpu_threads said so."""
    trained = recorded["cpu_threads"]  # checked by resumed_threads
    if asked is not None and asked != trained:
        log.warning(
            "warning: the run trained on %d CPU threads and resumes on %d (trainer.cpu_threads):"
            " a sum's and a product's last bits follow the thread count, so it may end apart "
            "from an uninterrupted run",
            trained,
            threads,
        )
    else:
        log.info("resuming on %d CPU threads, as the run trained (trainer.cpu_threads)", threads)
