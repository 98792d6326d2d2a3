"""A callback's state resumes as exactly as the rest of a run: SIGKILL mid-epoch, half-way
through a checkpoint write, between last.pt and best.pt and during validation, each followed by
``resume=auto``, ends with the same callback state and the same weights as a run never killed
(a counting callback, and the mutable gradient noise changing every step)."""

from __future__ import annotations

import signal

import pytest
from harness import report, run, same_ending

from utils.checkpoint.load import load_checkpoint

pytestmark = pytest.mark.slow

CALLBACKS = (
    "+callbacks.count._target_=probe_callbacks.Counter",
    "+callbacks.count.tag=count",
    "callbacks=gradient_noise",
)
KILLS = ("train_step:50", "checkpoint_write:2", "copies:2", "eval_batch:2")


def test_a_killed_run_resumes_its_callbacks_state_exactly(tmp_path):
    code, _, err = run(tmp_path, "run_name=straight", *CALLBACKS)
    assert code == 0, err[-3000:]
    straight = tmp_path / "checkpoints" / "straight" / "last.pt"
    expected = load_checkpoint(straight)["callbacks"]
    assert expected["count"]["counts"]["epoch_start:3"] == 1
    equal = []
    for index, point in enumerate(KILLS):
        name = f"run_name=killed{index}"
        code, _, _ = run(tmp_path, name, *CALLBACKS, env={"KILL_AT": point})
        assert code == -signal.SIGKILL, point
        code, out, err = run(tmp_path, name, "resume=auto", *CALLBACKS)
        assert code == 0 and "resumed from" in out, err[-3000:]
        last = tmp_path / "checkpoints" / f"killed{index}" / "last.pt"
        assert load_checkpoint(last)["callbacks"] == expected, point
        assert same_ending(last, straight), point
        equal.append(point)
    report("callback_state", kills=len(KILLS), equal_endings=f"{len(equal)}/{len(KILLS)}")
