"""SIGKILL at seeded points all over a run — start-up, mid-step, mid-evaluation, half-way
through a checkpoint write — each followed by ``resume=auto``: no checkpoint may ever be
unreadable, and the chain of resumed runs must end bit-identical to an uninterrupted run."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from harness import held, reference, report, run, same_ending, unreadable_checkpoints

from utils.checkpoint.load import load_checkpoint

# the SIGKILL matrix: slow; .ci/run runs them, `pytest -m "not slow"` leaves them out
pytestmark = pytest.mark.slow

SEED = 2026


def kill_plan(rng: random.Random) -> list[tuple[str, int]]:
    plan = [("startup", rng.randint(0, 4)) for _ in range(5)]  # tests/helpers/faulty_run.py
    plan += [("train_step", rng.randint(3, 70)) for _ in range(7)]
    plan += [("eval_batch", rng.randint(1, 2)) for _ in range(3)]
    plan += [("checkpoint_write", rng.randint(1, 2)) for _ in range(5)]
    rng.shuffle(plan)
    return plan


def test_sigkill_anywhere_then_resume_ends_as_an_uninterrupted_run(tmp_path, reference):
    plan = kill_plan(random.Random(SEED))
    chains, resumed, corrupt = [[]], 0, 0  # each chain: its runs' KILL_AT, "" for none
    for kind, value in plan:
        while True:  # a run that finishes before its kill point ends its chain; a new one starts
            chain = f"chain{len(chains) - 1}"
            env = {"KILL_AT": f"{kind}:{value}"}
            code, out, _ = run(tmp_path, f"run_name={chain}", "resume=auto", env=env)
            assert code in (0, -signal.SIGKILL), f"{kind}:{value} exited {code}"
            chains[-1].append(f"{kind}:{value}")
            resumed += "resumed from" in out
            corrupt += len(unreadable_checkpoints(tmp_path / "checkpoints" / chain))
            if code == -signal.SIGKILL:
                break
            chains.append([])
    code, out, err = run(tmp_path, f"run_name=chain{len(chains) - 1}", "resume=auto")
    assert code == 0, err[-3000:]
    chains[-1].append("")

    def again(index: int) -> Path:  # the chain's kill points once more, under a new name
        for point in chains[index]:
            env = {"KILL_AT": point} if point else None
            run(tmp_path, f"run_name=again{index}", "resume=auto", env=env)
        return tmp_path / "checkpoints" / f"again{index}" / "last.pt"

    endings = [
        held(tmp_path / "checkpoints" / f"chain{i}" / "last.pt", lambda i=i: again(i), reference)
        for i in range(len(chains))
    ]
    report(
        "sigkill",
        kills=len(plan),
        resumed_runs=resumed,
        corrupt_files=corrupt,
        chains=len(chains),
        equal_endings=f"{sum(map(bool, endings))}/{len(endings)}",
        tried_again=sum(e.first is not None for e in endings),
    )
    assert len(plan) >= 20
    assert corrupt == 0
    assert all(endings), [
        f"chain{i} killed at {', '.join(chains[i])}: {e!r}" for i, e in enumerate(endings) if not e
    ]


def test_a_kill_between_last_pt_and_its_copies_still_tests_the_best_epoch(tmp_path, reference):
    # The 3rd epoch is the best; the kill comes once its last.pt is complete, before best.pt
    # and the top-k copy are made of it. The resumed run never validates that epoch again,
    # so it makes the copies at resume; the final test judges the same weights.
    code, _, _ = run(
        tmp_path, "run_name=copies", "trainer.keep_top_k=2", env={"KILL_AT": "copies:3"}
    )
    assert code == -signal.SIGKILL
    code, _, err = run(tmp_path, "run_name=copies", "resume=auto", "trainer.keep_top_k=2")
    assert code == 0, err[-3000:]
    folder = tmp_path / "checkpoints" / "copies"
    best, last = load_checkpoint(folder / "best.pt"), load_checkpoint(folder / "last.pt")
    straight_best = load_checkpoint(reference.parent / "best.pt")
    assert best["epoch"] == straight_best["epoch"] == last["epoch"] == 3
    assert same_ending(folder / "best.pt", reference.parent / "best.pt")
    assert len(list(folder.glob("epoch=*.pt"))) == 2
