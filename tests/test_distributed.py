"""Data-parallel runs through the real launcher: ``torchrun ... train.py`` on CPU with gloo over
loopback. Two processes must train to the parameters one process reaches with the same global
batch, write one run dir and one checkpoint folder, stop together on SIGTERM and resume
exactly, and evaluate to the single-process figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import (
    EVALUATE,
    HELPERS,
    NEEDS_GLOO,
    TRAIN,
    free_port,
    run_python,
    run_train,
    torchrun,
)

from utils.checkpoint.load import load_checkpoint
from utils.system.distributed import rescale_position

pytestmark = NEEDS_GLOO

# No augmentation, no dropout: the only difference between 1 and 2 processes is who computes
# which half of each global batch. The signalling model passes through unless told to signal.
# 1,248 training digits are whole global batches of 32: one process would also train on a last,
# partial batch, which torchrun drops (data/batching/batches.py).
JOB = (
    "data.val_size=189",
    "model=mlp",
    "model._target_=signalling_model.mlp",
    "model.hidden_sizes=[32]",
    "model.dropout=0",
    "trainer.max_epochs=3",
    "trainer.accumulate_grad_batches=2",
    "trainer.log_every_n_steps=5",
)


def weights(path):
    return load_checkpoint(path)["model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ddp")
    run_train(cwd, *JOB, "data.batch_size=32", "run_name=one")
    result = torchrun(cwd, *JOB, "data.batch_size=16", "run_name=two")
    return cwd, result


def test_two_processes_reach_the_parameters_of_one_with_the_same_global_batch(runs):
    cwd, result = runs
    one, two = weights(cwd / "checkpoints/one/last.pt"), weights(cwd / "checkpoints/two/last.pt")
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5)
    assert "64 per optimizer step (batch 16 per process × 2 accumulated × 2 processes)" in (
        result.stdout
    )
    metrics = json.loads((cwd / "runs/two/metrics.json").read_text())
    single = json.loads((cwd / "runs/one/metrics.json").read_text())
    assert metrics["test/acc"] == single["test/acc"]  # reduced over both shards, none twice
    assert metrics["val/acc"] == single["val/acc"]
    assert metrics["test/loss"] == pytest.approx(single["test/loss"], rel=1e-4)


def test_rank_zero_alone_reports_and_writes(runs):
    cwd, result = runs
    assert sorted(p.name for p in (cwd / "runs").iterdir()) == ["one", "two"]
    assert sorted(p.name for p in (cwd / "checkpoints").iterdir()) == ["one", "two"]
    assert result.stdout.count("final metrics") == 1
    assert len(list((cwd / "runs/two").glob("events.out.tfevents.*"))) == 1
    # The checkpoint holds the unwrapped model: no DDP "module." prefix.
    assert not any(key.startswith("module.") for key in weights(cwd / "checkpoints/two/best.pt"))


@pytest.mark.slow  # 27 s; the quick suite keeps the other torchrun runs
def test_sigterm_to_torchrun_stops_every_rank_at_one_step_and_resume_is_exact(runs):
    cwd, _ = runs
    job = (*JOB, "data.batch_size=16", "run_name=stopped")
    stopped = torchrun(
        cwd, *job, ok=False, env={"SIGNAL_AT_FORWARD": "30", "SIGNAL_TARGET": "parent"}
    )
    # torchrun itself reports the signal and exits 1; each rank stopped cleanly first.
    assert stopped.returncode != 0
    assert "stopped by SIGTERM" in stopped.stdout and "continue with:" in stopped.stdout
    assert "torchrun --nproc_per_node=2 train.py" in stopped.stdout
    position = load_checkpoint(cwd / "checkpoints/stopped/last.pt")
    assert 0 < position["global_step"] < 3 * 19  # stopped part-way
    assert not (cwd / "runs/stopped/metrics.json").exists()
    shutil.copy(cwd / "checkpoints/stopped/last.pt", cwd / "stopped_by_two.pt")

    torchrun(cwd, *job, "resume=auto")
    resumed = weights(cwd / "checkpoints/stopped/last.pt")
    uninterrupted = weights(cwd / "checkpoints/two/last.pt")
    for name in uninterrupted:
        assert torch.equal(resumed[name], uninterrupted[name]), name


@pytest.mark.slow
def test_a_rank_zero_callback_runs_once_per_event_and_its_stop_ends_both_ranks(tmp_path):
    stop = ("+callbacks.stop._target_=probe_callbacks.StopAtStep", "+callbacks.stop.step=7")
    result = torchrun(tmp_path, *JOB, "data.batch_size=16", "run_name=cb", *stop)
    out = result.stdout
    assert out.count("fit start on rank 0 of 2") == 1 and "on rank 1" not in out
    assert out.count("logged step 5 on rank 0") == 1  # logged step 5 on rank 0 alone
    saved = load_checkpoint(tmp_path / "checkpoints" / "cb" / "last.pt")
    assert saved["global_step"] == 10  # the first logged step past 7, on both ranks
    assert saved["stopped_by"] == {
        "callback": "stop",
        "reason": "reached step 10",
        "epoch": 1,
        "step": 10,
    }
    metrics = json.loads((tmp_path / "runs" / "cb" / "metrics.json").read_text())
    assert metrics["global_step"] == 10 and "test/acc" in metrics


@pytest.mark.slow  # continues the checkpoint the SIGTERM test above leaves
def test_one_process_continues_what_two_began(runs):
    cwd, _ = runs
    saved = load_checkpoint(cwd / "stopped_by_two.pt")
    result = run_train(
        cwd, *JOB, "data.batch_size=16", "run_name=regrown", "resume=stopped_by_two.pt"
    )
    if saved["batch_in_epoch"]:
        assert "written by 2 process(es) in global batches of" in result.stdout + result.stderr
    metrics = json.loads((cwd / "runs/regrown/metrics.json").read_text())
    assert metrics["epochs"] == 3 and metrics["global_step"] > saved["global_step"]


def test_a_mid_epoch_position_is_carried_over_to_another_world_size():
    # 10 micro-batches of 2 processes of 16 = 20 of one process of 16, at a step (accumulate 2).
    assert rescale_position(10, saved=(2, 32), now=(1, 16), accumulate=2) == 20
    assert rescale_position(10, saved=(2, 32), now=(4, 64), accumulate=2) == 4
    assert rescale_position(0, saved=(2, 32), now=(1, 16), accumulate=1) == 0
    assert rescale_position(7, saved=(2, 32), now=(2, 32), accumulate=2) == 7
    # the same global batch on another world size: the same position, the same stream
    assert rescale_position(7, saved=(2, 32), now=(1, 32), accumulate=1) == 7


@pytest.mark.slow
def test_two_machines_meet_through_a_c10d_rendezvous(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    node = (
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=twonodes",
    )
    env = {**os.environ, "PYTHONPATH": str(HELPERS)}
    command = [sys.executable, "-m", "torch.distributed.run", *node]
    job = [str(TRAIN), *JOB, "data.batch_size=16"]
    launches = [
        subprocess.Popen(
            [*command, f"--node_rank={rank}", *job],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [launch.communicate(timeout=300) for launch in launches]
    for launch, (out, err) in zip(launches, outputs, strict=True):
        assert launch.returncode == 0, f"{out[-2000:]}\n{err[-3000:]}"
    # The rendezvous id names the run on both machines.
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["twonodes"]
    assert json.loads((tmp_path / "runs/twonodes/metrics.json").read_text())["epochs"] == 3


def test_evaluate_under_two_processes_matches_one(tmp_path):
    cwd = tmp_path
    run_train(cwd, "model.hidden_sizes=[32]", "trainer.max_epochs=1", "run_name=plain")
    best = str(cwd / "checkpoints/plain/best.pt")
    run_python(cwd, str(EVALUATE), f"ckpt={best}", "runs=single_eval")
    torchrun(cwd, f"ckpt={best}", "runs=sharded_eval", script=EVALUATE)

    def result(folder):
        (run,) = (cwd / folder / "eval").iterdir()
        return json.loads((run / "metrics.json").read_text())[best]

    single, sharded = result("single_eval"), result("sharded_eval")
    assert sharded["confusion"] == single["confusion"]
    assert sharded["test/acc"] == single["test/acc"]
    assert sharded["test/loss"] == pytest.approx(single["test/loss"], rel=1e-5)


def test_sharded_multilabel_and_regression_scores_match_one_process(tmp_path):
    """Average precision ranks every sample and the residual percentiles sort them: each
    process's shard is gathered whole (uneven shards: 45 test rows on 2 processes)."""
    import runpy

    from conftest import ROOT

    write_houses = runpy.run_path(str(ROOT / "benchmarks" / "task_figures.py"))["write_houses"]
    write_houses(tmp_path / "houses.csv")
    table = [
        "data=csv",
        "data.path=houses.csv",
        "data.features=[rooms,area,age,floor]",
        "trainer.max_epochs=1",
        "data.batch_size=16",
    ]
    run_train(tmp_path, *table, "task=multilabel", "data.target=tags", "run_name=tags")
    run_train(tmp_path, *table, "task=regression", "data.target=[price,rent]", "run_name=values")
    both = "ckpt=[checkpoints/tags/best.pt,checkpoints/values/best.pt]"
    run_python(tmp_path, str(EVALUATE), both, "runs=single_eval")
    torchrun(tmp_path, both, "runs=sharded_eval", script=EVALUATE)

    def result(folder):
        (run,) = (tmp_path / folder / "eval").iterdir()
        return json.loads((run / "metrics.json").read_text())

    single, sharded = result("single_eval"), result("sharded_eval")
    for checkpoint in single:
        for key, value in single[checkpoint].items():
            if isinstance(value, float):
                assert sharded[checkpoint][key] == pytest.approx(value, rel=1e-5), key
    tags, values = (single[c] for c in sorted(single))
    per_label = sharded["checkpoints/tags/best.pt"]["per_label"]
    assert per_label["support"] == tags["per_label"]["support"]
    for key in ("ap", "precision", "recall", "f1"):
        assert per_label[key] == pytest.approx(tags["per_label"][key], rel=1e-6), key
    for key in ("median_abs_error", "p90_abs_error", "max_abs_error"):
        got = sharded["checkpoints/values/best.pt"]["per_target"][key]
        assert got == pytest.approx(values["per_target"][key], rel=1e-5), key


@pytest.mark.slow
def test_ranks_draw_their_own_dropout_masks_and_save_each_stream(tmp_path):
    probe = (
        "model=mlp",
        "model._target_=signalling_model.dropout_probe",
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=1",
        "data.batch_size=16",
    )
    torchrun(tmp_path, *probe, "run_name=ddp")
    first, second = (torch.load(tmp_path / f"mask-rank{r}.pt") for r in (0, 1))
    assert not torch.equal(first, second)  # each rank its own stream for what forward draws
    (tmp_path / "mask-rank0.pt").rename(tmp_path / "ddp-rank0.pt")
    run_train(tmp_path, *probe, "run_name=single")
    # Rank 0 keeps the stream of the seed: a one-process run draws what rank 0 drew.
    assert torch.equal(torch.load(tmp_path / "mask-rank0.pt"), first)
    saved = load_checkpoint(tmp_path / "checkpoints/ddp/last.pt")
    streams = [state["torch"] for state in saved["rng_per_rank"]]
    assert len(streams) == 2 and not torch.equal(*streams)
