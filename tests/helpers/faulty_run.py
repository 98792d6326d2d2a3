"""Run ``train.py`` (argv as given) with one fault injected at an exact point:

KILL_AT=train_step:37        SIGKILL in the 37th training micro-batch of this process
KILL_AT=eval_batch:2         SIGKILL in the 2nd evaluation batch
KILL_AT=checkpoint_write:1   SIGKILL half-way through writing the 1st checkpoint
KILL_AT=copies:3             SIGKILL after the 3rd last.pt is written, before best.pt and the
                             top-k copies are made of it
KILL_AT=history_send:1       SIGKILL once the 1st checkpoint is written, before the history
                             it covers is sent to MLflow or W&B (utils/tracking/tracker.py)
KILL_AT=mlflow_sent:1        SIGKILL just after the 1st batch of points reached MLflow
KILL_AT=startup:2            SIGKILL at start-up milestone 2 (0: before train.py runs; then
                             check_config, start_run, the model build, check_start_up)
STOP_AT=<same points>        SIGSTOP itself there (half-way through a checkpoint write): the
                             caller sends its signal, then SIGCONT, so the signal lands at
                             exactly that point whatever this machine's speed
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

from utils.system.signals import catch_early_signals

catch_early_signals()  # as train.py does, before torch is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import utils.fit.checkpointer  # noqa: E402
import utils.model  # noqa: E402
import utils.model.modules  # noqa: E402
import utils.preflight.train  # noqa: E402
import utils.run  # noqa: E402
import utils.tracking.tracker  # noqa: E402


def point(name: str) -> tuple[str, int]:
    phase, _, at = os.environ.get(name, ":-1").partition(":")
    return phase, int(at)


KILL, STOP = point("KILL_AT"), point("STOP_AT")


def reached(phase: str, count: int) -> None:
    """The ``count``-th event of ``phase``: die or pause here if asked."""
    if (phase, count) == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if (phase, count) == STOP:
        os.kill(os.getpid(), signal.SIGSTOP)  # the caller signals, then continues us


def milestone(index: int, function):
    def reached_first(*args, **kwargs):
        reached("startup", index)
        return function(*args, **kwargs)

    return reached_first


def main() -> None:
    fail_save = int(os.environ.get("FAIL_SAVE", "0"))
    counts = {
        "train_step": 0,
        "eval_batch": 0,
        "checkpoint_write": 0,
        "history_send": 0,
        "mlflow_sent": 0,
        "copies": 0,
    }
    cross_entropy, save = F.cross_entropy, torch.save
    build = utils.model.modules.Modules.build.__func__
    utils.preflight.train.check_config = milestone(1, utils.preflight.train.check_config)
    utils.run.start_run = milestone(2, utils.run.start_run)  # as train.py imports it
    utils.model.modules.Modules.build = classmethod(milestone(3, build))
    utils.model.check_start_up = milestone(4, utils.model.check_start_up)

    def counted_cross_entropy(*args, **kwargs):
        kind = "train_step" if torch.is_grad_enabled() else "eval_batch"
        counts[kind] += 1
        reached(kind, counts[kind])
        return cross_entropy(*args, **kwargs)

    def faulty_save(obj, f, *args, **kwargs):
        counts["checkpoint_write"] += 1
        if counts["checkpoint_write"] == fail_save:
            raise OSError(errno.ENOSPC, "No space left on device")
        if ("checkpoint_write", counts["checkpoint_write"]) in (KILL, STOP):
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])  # half the file reaches the disk, then the end
            f.flush()
            os.fsync(f.fileno())
            reached("checkpoint_write", counts["checkpoint_write"])
            f.write(data[len(data) // 2 :])  # continued after a stop: the rest
            return None
        return save(obj, f, *args, **kwargs)

    def counted(phase: str, function, before: bool):
        def wrapper(*args, **kwargs):
            counts[phase] += 1
            if before:
                reached(phase, counts[phase])
            result = function(*args, **kwargs)
            if not before:
                reached(phase, counts[phase])
            return result

        return wrapper

    utils.fit.checkpointer.keep_copies = counted("copies", utils.fit.checkpointer.keep_copies, True)
    tracker = utils.tracking.tracker.Tracker
    tracker.checkpoint_written = counted("history_send", tracker.checkpoint_written, True)
    if "mlflow" in " ".join(sys.argv):  # once MLflow's process answered (utils/tracking/process.py)
        from utils.tracking.process import InChildProcess

        InChildProcess.send = counted("mlflow_sent", InChildProcess.send, False)
    F.cross_entropy = counted_cross_entropy
    torch.save = faulty_save
    script, *sys.argv[1:] = sys.argv[1:]
    sys.argv[0] = script
    reached("startup", 0)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
