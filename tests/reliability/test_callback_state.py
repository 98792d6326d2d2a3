"""A callback's state resumes as exactly as the rest of a run: SIGKILL mid-epoch, half-way
through a checkpoint write, between last.pt and best.pt and during validation, each followed by
``resume=auto``, ends with the same callback state and the same weights as a run never killed
(a counting callback, and the mutable gradient noise changing every step)."""

from __future__ import annotations

import functools
import signal
from pathlib import Path

import pytest
from harness import held, report, run, uninterrupted

from utils.checkpoint.load import load_checkpoint

pytestmark = pytest.mark.slow

CALLBACKS = (
    "+callbacks.count._target_=probe_callbacks.Counter",
    "+callbacks.count.tag=count",
    "callbacks=gradient_noise",
)
KILLS = ("train_step:50", "checkpoint_write:2", "copies:2", "eval_batch:2")


def test_a_killed_run_resumes_its_callbacks_state_exactly(tmp_path):
    straight = uninterrupted(tmp_path, *CALLBACKS)
    expected = load_checkpoint(straight)["callbacks"]
    assert expected["count"]["counts"]["epoch_start:3"] == 1

    def killed_and_resumed(name: str, point: str) -> Path:
        code, _, _ = run(tmp_path, f"run_name={name}", *CALLBACKS, env={"KILL_AT": point})
        assert code == -signal.SIGKILL, point
        code, out, err = run(tmp_path, f"run_name={name}", "resume=auto", *CALLBACKS)
        assert code == 0 and "resumed from" in out, err[-3000:]
        last = tmp_path / "checkpoints" / name / "last.pt"
        assert load_checkpoint(last)["callbacks"] == expected, point
        return last

    equal = []
    for index, point in enumerate(KILLS):
        again = functools.partial(killed_and_resumed, f"again{index}", point)
        assert held(killed_and_resumed(f"killed{index}", point), again, straight), point
        equal.append(point)
    report("callback_state", kills=len(KILLS), equal_endings=f"{len(equal)}/{len(KILLS)}")
