"""SIGTERM at seeded points all over a run — start-up, mid-step, mid-evaluation, half-way
through a checkpoint write — each landing exactly there (the run pauses itself at the point,
so no timing window decides): every stop writes a loadable ``last.pt`` and exits with code 3,
and resuming ends bit-identical to an uninterrupted run. A disk that fills up during a checkpoint write names the path, keeps the
previous checkpoint, and ``resume=auto`` finishes once space is back."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from harness import held, reference, report, run, unreadable_checkpoints

from utils.checkpoint.load import load_checkpoint
from utils.system.signals import EXIT_INTERRUPTED

# the SIGTERM matrix: slow; .ci/run runs them, `pytest -m "not slow"` leaves them out
pytestmark = pytest.mark.slow


def stop_plan(rng: random.Random) -> list[str]:
    """Points every resumed run reaches: each stop consumes at most 15 of the job's 117
    training micro-batches, and each run validates and saves at least once more."""
    plan = [f"startup:{rng.randint(0, 4)}" for _ in range(2)]
    plan += [f"train_step:{rng.randint(2, 15)}" for _ in range(3)]
    plan += [f"eval_batch:{rng.randint(1, 2)}", f"checkpoint_write:{rng.randint(1, 2)}"]
    rng.shuffle(plan)
    return plan


def stopped_and_resumed(cwd: Path, name: str, plan: list[str]) -> tuple[int, int, Path]:
    """A run stopped by SIGTERM at each point of ``plan`` in turn, then resumed to its end:
    how many stops exited 3, how many of them left a loadable ``last.pt``, and its last.pt."""
    folder = cwd / "checkpoints" / name
    stopped = saved = 0
    for where in plan:
        code, out, err = run(
            cwd, f"run_name={name}", "resume=auto", signal_at=(signal.SIGTERM, where)
        )
        assert code == EXIT_INTERRUPTED, f"SIGTERM at {where} exited {code}: {err[-2000:]}"
        stopped += 1
        assert "continue with:" in out
        saved += (folder / "last.pt").exists() and not unreadable_checkpoints(folder)
    code, _, err = run(cwd, f"run_name={name}", "resume=auto")
    assert code == 0, err[-3000:]
    return stopped, saved, folder / "last.pt"


def test_sigterm_anywhere_saves_exits_3_and_resumes_exactly(tmp_path, reference):
    plan = stop_plan(random.Random(7))
    stopped, saved, last = stopped_and_resumed(tmp_path, "term", plan)
    equal = held(last, lambda: stopped_and_resumed(tmp_path, "again", plan)[2], reference)
    report(
        "sigterm",
        trials=len(plan),
        stopped_with_code_3=stopped,
        checkpoint_written=saved,
        equal_ending=equal,
    )
    assert stopped == len(plan) and saved == stopped and equal


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path, reference):
    def full_then_resumed(name: str) -> Path:
        folder = tmp_path / "checkpoints" / name
        code, _, err = run(tmp_path, f"run_name={name}", env={"FAIL_SAVE": "2"})  # epoch 2's
        assert code == 2
        line = err.strip().splitlines()[-1]
        assert line == (
            f"error: could not write checkpoint checkpoints/{name}/last.pt: No space left on "
            "device; the previous checkpoint there is intact"
        )
        assert load_checkpoint(folder / "last.pt")["epoch"] == 1
        assert not list(folder.glob(".*.tmp"))
        code, out, err = run(tmp_path, f"run_name={name}", "resume=auto")  # space is back
        assert code == 0, err[-2000:]
        assert f"resumed from checkpoints/{name}/last.pt: epoch 2" in out
        return folder / "last.pt"

    equal = held(full_then_resumed("full"), lambda: full_then_resumed("again"), reference)
    report("disk_full", failed_saves=1, previous_intact=True, resumed=True, equal_ending=equal)
    assert equal
