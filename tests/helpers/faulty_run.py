"""Run ``train.py`` (argv as given) with one fault injected at an exact point:

KILL_AT=train_step:37        SIGKILL in the 37th training micro-batch of this process
KILL_AT=eval_batch:2         SIGKILL in the 2nd evaluation batch
KILL_AT=checkpoint_write:1   SIGKILL half-way through writing the 1st checkpoint
FAIL_SAVE=2                  the 2nd checkpoint write fails: no space left on device

python tests/helpers/faulty_run.py train.py trainer.max_epochs=3
"""

from __future__ import annotations

import errno
import io
import os
import runpy
import signal
import sys

from utils.signals import catch_early_signals

catch_early_signals()  # as train.py does, before torch is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def kill_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    phase, _, at = os.environ.get("KILL_AT", ":0").partition(":")
    fail_save = int(os.environ.get("FAIL_SAVE", "0"))
    counts = {"train_step": 0, "eval_batch": 0, "checkpoint_write": 0}
    cross_entropy, save = F.cross_entropy, torch.save

    def counted_cross_entropy(*args, **kwargs):
        kind = "train_step" if torch.is_grad_enabled() else "eval_batch"
        counts[kind] += 1
        if kind == phase and counts[kind] == int(at):
            kill_now()
        return cross_entropy(*args, **kwargs)

    def faulty_save(obj, f, *args, **kwargs):
        counts["checkpoint_write"] += 1
        if counts["checkpoint_write"] == fail_save:
            raise OSError(errno.ENOSPC, "No space left on device")
        if phase == "checkpoint_write" and counts["checkpoint_write"] == int(at):
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])  # half the file reaches the disk, then the end
            f.flush()
            os.fsync(f.fileno())
            kill_now()
        return save(obj, f, *args, **kwargs)

    F.cross_entropy = counted_cross_entropy
    torch.save = faulty_save
    script, *sys.argv[1:] = sys.argv[1:]
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
