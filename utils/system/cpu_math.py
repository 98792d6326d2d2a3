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
"""

from __future__ import annotations

import os

SAME_BITS = {"MKL_CBWR": "AUTO", "MKL_DYNAMIC": "FALSE"}


def same_bits_every_run() -> None:
    """MKL in its run-to-run reproducible mode for this process and those it starts."""
    for name, value in SAME_BITS.items():
        os.environ.setdefault(name, value)
