"""SIGTERM at seeded moments: every stop writes a loadable ``last.pt`` and exits with code 3
(or the run had already finished, code 0), and resuming ends bit-identical to an
uninterrupted run. A disk that fills up during a checkpoint write names the path, keeps the
previous checkpoint, and ``resume=auto`` finishes once space is back."""

from __future__ import annotations

import random
import signal

import pytest
from harness import reference, report, run, same_ending, unreadable_checkpoints

from utils.checkpoint import load_checkpoint
from utils.signals import EXIT_INTERRUPTED

# the SIGTERM matrix: slow; .ci/run runs them, `pytest -m "not slow"` leaves them out
pytestmark = pytest.mark.slow


def test_sigterm_anywhere_saves_exits_3_and_resumes_exactly(tmp_path, reference):
    folder = tmp_path / "checkpoints" / "term"
    delays = sorted(round(random.Random(7).uniform(0.3, 4.0), 2) for _ in range(6))
    stopped = saved = 0
    for delay in delays:
        code, out, err = run(tmp_path, "run_name=term", "resume=auto",
                             signal_after=(signal.SIGTERM, delay))  # fmt: skip
        assert code in (EXIT_INTERRUPTED, 0), f"SIGTERM after {delay}s exited {code}: {err[-2000:]}"
        if code == EXIT_INTERRUPTED:
            stopped += 1
            assert "continue with:" in out
            saved += (folder / "last.pt").exists() and not unreadable_checkpoints(folder)
    code, _, err = run(tmp_path, "run_name=term", "resume=auto")
    assert code == 0, err[-3000:]
    equal = same_ending(folder / "last.pt", reference)
    report("sigterm", trials=len(delays), stopped_with_code_3=stopped, checkpoint_written=saved,
           equal_ending=equal)  # fmt: skip
    assert stopped >= 4 and saved == stopped and equal


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path, reference):
    folder = tmp_path / "checkpoints" / "full"
    code, _, err = run(tmp_path, "run_name=full", env={"FAIL_SAVE": "2"})  # epoch 2's save
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line == (
        "error: could not write checkpoint checkpoints/full/last.pt: No space left on device; "
        "the previous checkpoint there is intact"
    )
    assert load_checkpoint(folder / "last.pt")["epoch"] == 1
    assert not list(folder.glob(".*.tmp"))
    code, out, err = run(tmp_path, "run_name=full", "resume=auto")  # space is back
    assert code == 0 and "resumed from checkpoints/full/last.pt: epoch 2" in out, err[-2000:]
    equal = same_ending(folder / "last.pt", reference)
    report("disk_full", failed_saves=1, previous_intact=True, resumed=True, equal_ending=equal)
    assert equal
