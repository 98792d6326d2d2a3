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
"""

from __future__ import annotations

import logging
import os
from typing import Any

from utils.errors import UserError

log = logging.getLogger("torchloom")
MAX_THREADS = 4096  # a recorded thread count beyond this was edited

SAME_BITS = {"MKL_CBWR": "AUTO", "MKL_DYNAMIC": "FALSE"}


def same_bits_every_run() -> None:
    """MKL in its run-to-run reproducible mode for this process and those it starts."""
    for name, value in SAME_BITS.items():
        os.environ.setdefault(name, value)


def cpu_numerics() -> dict:
    """What this process's CPU numbers depend on beyond the data and the code: torch's
    intra-op threads and MKL's reproducibility settings. A checkpoint records it."""
    import torch

    return {"cpu_threads": torch.get_num_threads(), **{k: os.environ.get(k) for k in SAME_BITS}}


def resumed_threads(recorded: Any, asked: int | None, where: Any) -> int | None:
    """The thread count a resume asks for: ``trainer.cpu_threads`` when given (``asked``),
    else the count the checkpoint ``recorded`` (:func:`cpu_numerics`, a dict as the checkpoint
    check found it; None before it was recorded: this machine's choice). A recorded setting
    this process cannot follow (MKL's, read as torch loaded) is said."""
    if recorded is None:
        return asked
    threads = recorded.get("cpu_threads")
    whole = isinstance(threads, int) and not isinstance(threads, bool)
    if not (whole and 1 <= threads <= MAX_THREADS):
        raise UserError(
            f"cannot resume from {where}: its numerics record is not what torchloom writes "
            f"(cpu_threads={threads!r}; was it edited?); use init_from={where} for its weights"
        )
    for name in SAME_BITS:
        if recorded.get(name) != os.environ.get(name):
            log.warning(
                "warning: the run trained with %s=%s and resumes with %s=%s: its last bits may "
                "differ from an uninterrupted run's (export %s=%s to resume as it trained)",
                name,
                recorded.get(name),
                name,
                os.environ.get(name),
                name,
                recorded.get(name),
            )
    return threads if asked is None else asked


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
