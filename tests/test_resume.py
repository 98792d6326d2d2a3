"""Interrupt, resume, compare: a resumed run must equal the run that was never interrupted —
bit for bit on the CPU, parameters and logged losses — with shuffling, dropout and
augmentation on, on both data paths."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from conftest import (
    HELPERS,
    TRAIN,
    assert_same_run,
    checkpoint,
    error_line,
    interrupt_and_resume,
    killed_at,
    read_metrics,
    run_train,
    scalars,
    slow,
    write_imagefolder,
)

from utils.system.signals import EXIT_INTERRUPTED

# Whole-tensor path: 160 samples, batches of 8, 2 micro-batches per step → 20 micro-batches and
# 10 optimizer steps per epoch; dropout, random crops and flips on.
TENSOR_RUN = [
    "model=mlp",
    "model._target_=signalling_model.mlp",
    "model.hidden_sizes=[32]",
    "model.dropout=0.3",
    "data=synthetic",
    "data.shape=[1,8,8]",
    "data.num_samples=160",
    "data.val_size=32",
    "data.test_size=32",
    "data.batch_size=8",
    "data.augment.crop_padding=1",
    "data.augment.horizontal_flip=true",
    "trainer.accumulate_grad_batches=2",
    "trainer.log_every_n_steps=3",
    "trainer.max_epochs=3",
]


@pytest.fixture(scope="module")
def tensor_runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("resume")
    run_train(cwd, *TENSOR_RUN, "run_name=straight")
    return cwd


@pytest.mark.parametrize(
    "at, epoch, batch_in_epoch",
    [
        (20, 1, 0),  # the last micro-batch of epoch 1: stops at the epoch boundary
        (26, 1, 6),  # the 2nd micro-batch of a step, mid-epoch
        (33, 1, 14),  # the 1st micro-batch of a step: the step is finished first
    ],
    ids=["epoch-boundary", "mid-epoch", "between-micro-batches"],
)
def test_whole_tensor_path_resumes_bit_identically(tensor_runs, at, epoch, batch_in_epoch):
    name = f"cut_at_{at}"
    signal_name = "SIGINT" if at == 33 else "SIGTERM"  # Ctrl-C behaves like SIGTERM
    position = interrupt_and_resume(tensor_runs, TENSOR_RUN, name, at, signal_name)
    assert (position["epoch"], position["batch_in_epoch"]) == (epoch, batch_in_epoch)
    assert position["global_step"] == (epoch * 20 + batch_in_epoch) // 2
    assert_same_run(tensor_runs, "straight", name)
    # The wall time counts every segment: the stopped one (up to its last.pt) and this one.
    metrics = read_metrics(tensor_runs / "runs" / name)
    earlier = position["elapsed_seconds"]
    assert earlier > 0
    assert metrics["wall_time_seconds"] == pytest.approx(
        earlier + metrics["segment_wall_time_seconds"], abs=0.05
    )


@pytest.mark.parametrize(
    "every, step",
    [("trainer.checkpoint_every_n_steps=4", 12), ("trainer.checkpoint_every_minutes=1e-9", 13)],
    ids=["every-4-steps", "every-minute-passed"],
)
def test_a_kill_9_inside_an_epoch_loses_only_the_steps_since_the_last_save(
    tensor_runs, every, step
):
    """last.pt was written once an epoch and on a stop signal, so a kill -9 lost the epoch.
    With trainer.checkpoint_every_*, it loses the steps since the last save, and the resume is
    bit-identical (the history it sent the trackers never ran ahead of last.pt)."""
    name = every.split(".")[1].split("=")[0]
    run = [*TENSOR_RUN, every]
    at = 27  # micro-batch 7 of epoch 2: 13 optimizer steps taken (10 an epoch)
    killed = run_train(
        tensor_runs,
        *run,
        f"run_name={name}",
        ok=False,
        env=killed_at(at),
    )
    assert killed.returncode == -signal.SIGKILL
    position = checkpoint(tensor_runs, name)
    assert (position["global_step"], position["epoch"]) == (step, 1)
    assert position["batch_in_epoch"] == (step - 10) * 2
    resumed = run_train(tensor_runs, *run, f"run_name={name}", "resume=auto")
    assert f"resumed from checkpoints/{name}/last.pt" in resumed.stdout
    assert_same_run(tensor_runs, "straight", name)


def test_a_stop_with_its_reader_gone_exits_3_and_its_log_tells_it(tmp_path):
    # `python train.py | tee out.log`, then Ctrl-C: tee is gone before the stop's lines.
    env = {
        **os.environ,
        "PYTHONPATH": str(HELPERS),
        "SIGNAL_AT_FORWARD": "26",
        "SIGNAL_NAME": "SIGINT",
    }
    run = subprocess.Popen(
        [sys.executable, str(TRAIN), *TENSOR_RUN, "run_name=piped"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    run.stdout.close()  # every line on stdout, from the first, goes to a closed pipe
    err = run.stderr.read().decode()
    assert run.wait(timeout=300) == EXIT_INTERRUPTED, err[-3000:]
    assert "Traceback" not in err and "Logging error" not in err, err[-3000:]
    assert (tmp_path / "checkpoints" / "piped" / "last.pt").is_file()
    log = (tmp_path / "runs" / "piped" / "train.log").read_text()
    assert "SIGINT received: finishing this step, then saving last.pt" in log
    assert "stopped by SIGINT at epoch 2, batch 6; continue with:" in log


def test_second_ctrl_c_exits_at_once(tensor_runs):
    result = run_train(
        tensor_runs,
        *TENSOR_RUN,
        "run_name=twice",
        ok=False,
        env={"SIGNAL_AT_FORWARD": "5", "SIGNAL_NAME": "SIGINT", "SIGNAL_REPEAT": "2"},
    )
    assert result.returncode == 130
    assert "second Ctrl-C: exiting now" in result.stderr and "Traceback" not in result.stderr
    assert not (tensor_runs / "checkpoints" / "twice" / "last.pt").exists()


def test_resuming_from_an_older_checkpoint_replaces_the_later_tensorboard_points(tensor_runs):
    folder = tensor_runs / "checkpoints" / "rewind"
    first = run_train(
        tensor_runs, *TENSOR_RUN, "run_name=rewind", ok=False, env={"SIGNAL_AT_FORWARD": "20"}
    )  # stops after epoch 1
    assert first.returncode == EXIT_INTERRUPTED
    shutil.copy(folder / "last.pt", folder / "epoch1.pt")
    run_train(tensor_runs, *TENSOR_RUN, "run_name=rewind", "resume=auto")  # epochs 2 and 3
    # Train epochs 2 and 3 again from the copy: their first points must be replaced, not doubled.
    again = run_train(tensor_runs, *TENSOR_RUN, "resume=checkpoints/rewind/epoch1.pt")
    assert f"run dir: {tensor_runs / 'runs' / 'rewind'}" in again.stdout  # the same run continues
    logged = scalars(tensor_runs / "runs" / "rewind")
    steps = [step for step, _ in logged["train/loss"]]
    assert steps == sorted(set(steps))  # no step logged twice
    assert logged["train/loss"] == scalars(tensor_runs / "runs" / "straight")["train/loss"]


# data.cache=memory is the whole-tensor path resumed above; disk reads the memory-mapped cache.
@pytest.mark.parametrize(("cache", "workers"), [("off", 0), ("disk", 0), *slow(("off", 2))])
def test_image_folders_resume_bit_identically_cached_or_not(tmp_path, cache, workers):
    root = write_imagefolder(tmp_path / "images", per_class=16, size=(8, 8), test=False)
    run = [
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "model.hidden_sizes=[32]",
        "model.dropout=0.3",
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=[8,8]",
        "data.batch_size=8",
        f"data.num_workers={workers}",
        f"data.cache={cache}",
        "trainer.accumulate_grad_batches=2",
        "trainer.log_every_n_steps=2",
        "trainer.max_epochs=2",
    ]
    run_train(tmp_path, *run, "run_name=straight")
    position = interrupt_and_resume(tmp_path, run, "cut", 9)  # epoch 2, 1st micro-batch of a step
    assert (position["epoch"], position["batch_in_epoch"]) == (1, 4)
    assert_same_run(tmp_path, "straight", "cut")


@pytest.mark.slow  # 13 s; the quick suite's resumes after SIGTERM send it from inside the run
def test_sigterm_from_outside_mid_epoch_resumes_bit_identically(tmp_path):
    """A real SIGTERM from another process, at whatever moment it lands."""
    run = [
        "data=synthetic",
        "data.num_samples=2400",
        "data.batch_size=8",
        "data.shape=[1,8,8]",
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "model.hidden_sizes=[16]",
    ]
    run_train(tmp_path, *run, "run_name=straight")
    process = subprocess.Popen(
        [sys.executable, str(TRAIN), *run, "run_name=cut"],
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(HELPERS), "PYTHONUNBUFFERED": "1"},
    )
    for line in process.stdout:
        if "  step " in line:  # the first progress line: training is under way
            step = int(line.split("  step ")[1].split("/")[0])
            process.send_signal(signal.SIGTERM)
            break
    process.stdout.read()
    assert process.wait(timeout=120) == EXIT_INTERRUPTED
    stopped_at = checkpoint(tmp_path, "cut")["global_step"]
    assert step <= stopped_at < 300  # mid-run: 2400 samples / batch 8 = 300 steps
    run_train(tmp_path, *run, "run_name=cut", "resume=auto")
    a, b = checkpoint(tmp_path, "straight"), checkpoint(tmp_path, "cut")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_a_checkpoint_of_the_first_format_still_resumes(tmp_path):
    """Format 1 kept the loss sums as three top-level entries, and the scheduler's config held
    Hydra's ``_partial_: true``; such a last.pt, written by an earlier torchloom, resumes to
    the same weights as a run that never stopped, with no config change reported."""
    run = [*TENSOR_RUN[:-1], "scheduler=none"]  # a constant LR: max_epochs changes nothing
    run_train(tmp_path, *run, "trainer.max_epochs=2", "run_name=straight")
    run_train(tmp_path, *run, "trainer.max_epochs=1", "run_name=old")
    path = tmp_path / "checkpoints" / "old" / "last.pt"
    saved = checkpoint(tmp_path, "old")
    losses = saved.pop("losses")
    assert len(losses["pending"]) == 0
    saved.update(
        format_version=1,
        epoch_loss=losses["epoch"],
        window_loss=losses["window"],
        window_batches=losses["window_batches"],
    )
    saved["config"]["scheduler"]["_partial_"] = True
    torch.save(saved, path)
    result = run_train(tmp_path, *run, "trainer.max_epochs=2", "run_name=old", f"resume={path}")
    assert "scheduler._partial_" not in result.stdout + result.stderr
    a, b = checkpoint(tmp_path, "straight"), checkpoint(tmp_path, "old")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert read_metrics(tmp_path / "runs" / "old")["epochs"] == 2


EDITED_SUMS = {
    "a 2-D pending": {"pending": torch.ones(3, 2)},
    "integer losses": {"pending": torch.ones(3, dtype=torch.int64)},
    "a count that is text": {"window_batches": "7"},
    "a NaN sum": {"epoch": torch.tensor(math.nan, dtype=torch.float64)},
}


@pytest.mark.parametrize("edit", EDITED_SUMS, ids=list(EDITED_SUMS))
def test_edited_loss_sums_are_refused_in_one_line_before_any_step(tmp_path, edit):
    """The losses not yet summed travel in last.pt and are summed at the next logging step: an
    edited record is refused where it is read, naming it, not as a traceback at that sync,
    and the file is left as it was."""
    run_train(tmp_path, *TENSOR_RUN[:-1], "trainer.max_epochs=1", "run_name=a")
    saved = checkpoint(tmp_path, "a")
    for record in (saved["losses"], *saved["losses"]["ranks"]):  # each process's, and the sum
        record.update(EDITED_SUMS[edit])
    path = tmp_path / "edited.pt"
    torch.save(saved, path)
    before = path.read_bytes()
    resumed = ("trainer.max_epochs=2", "run_name=b", f"resume={path}")
    refused = run_train(tmp_path, *TENSOR_RUN[:-1], *resumed, ok=False)
    assert refused.returncode == 2
    line = error_line(refused)
    assert f"cannot resume from {path}: the loss sums in it are not what torchloom writes" in line
    assert path.read_bytes() == before


@pytest.mark.slow  # 11 s of MKL_VERBOSE output from two fresh processes
@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL")
def test_mkl_multiplies_in_its_run_to_run_reproducible_mode(tmp_path):
    """MKL promises the same bits from one run to the next only with conditional numerical
    reproducibility on and a fixed thread count (Intel's "Reproducibility Conditions"):
    train.py sets both before torch loads MKL, so a resumed process multiplies as the first
    did; a mode the user exported wins. MKL_VERBOSE prints the mode with each product."""
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "MKL_DYNAMIC")}
    for exported, expected in ((None, "AUTO Dyn:0"), ("COMPATIBLE", "COMPATIBLE Dyn:0")):
        result = subprocess.run(
            [sys.executable, str(TRAIN), "debug=fast_dev_run", f"run_name={exported}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, "MKL_VERBOSE": "1", **({"MKL_CBWR": exported} if exported else {})},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        modes = {
            line.split(" CNR:")[1].split(" FastMM")[0]
            for line in result.stdout.splitlines()
            if line.startswith("MKL_VERBOSE SGEMM")
        }
        assert modes == {expected}, modes  # every product, none in another mode


# A CNN whose BatchNorm statistics and products are split by the thread count; killed on 1
# thread at its 4th step.
THREADED = ["data=synthetic", "data.num_samples=384", "data.shape=[3,32,32]", "model=cnn"]
THREADED += ["model._target_=signalling_model.cnn", "model.channels=[8,16]", "data.batch_size=128"]
THREADED += ["trainer.max_epochs=2", "model.dropout=0", "trainer.log_every_n_steps=1"]
ONE, TWO = {"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2"}


def killed_on_one_thread(cwd, run_name: str) -> None:
    killed = run_train(
        cwd, *THREADED, f"run_name={run_name}", ok=False, env={**ONE, **killed_at(4)}
    )
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]


def test_a_resume_runs_on_the_cpu_threads_the_run_trained_on(tmp_path):
    """A sum's and a product's last bits follow torch's thread count (a CNN's BatchNorm
    statistics here), and a resume took whatever count its process got (OMP_NUM_THREADS, a
    library in the process, the cores torchrun shares out): killed on 1 thread and resumed on
    2, the run ended apart from an uninterrupted one. The count is recorded and followed."""
    run_train(tmp_path, *THREADED, "run_name=straight", env=ONE, process=True)
    killed_on_one_thread(tmp_path, "killed")
    resume = ("run_name=killed", "resume=auto")
    resumed = run_train(tmp_path, *THREADED, *resume, env=TWO, process=True)
    assert_same_run(tmp_path, "straight", "killed")  # apart before the count was followed
    assert "resuming on 1 CPU threads, as the run trained" in resumed.stdout + resumed.stderr
    # an edited count (a billion threads) is one line, before anything starts
    stored = checkpoint(tmp_path, "killed")
    torch.save({**stored, "numerics": {"cpu_threads": 10**9}}, tmp_path / "edited.pt")
    edited = ("run_name=e", f"resume={tmp_path / 'edited.pt'}")
    refused = run_train(tmp_path, *THREADED, *edited, ok=False)
    assert "its numerics record is not what torchloom writes" in error_line(refused)


@pytest.mark.slow  # three more runs; the quick test above shows the count followed
def test_a_resume_on_other_threads_asked_for_says_so_and_ends_apart(tmp_path):
    """The cause, shown: trainer.cpu_threads=2 given, the resume runs on it, says so, and ends
    apart from the uninterrupted run."""
    run_train(tmp_path, *THREADED, "run_name=straight", env=ONE, process=True)
    killed_on_one_thread(tmp_path, "other")
    asked = ("run_name=other", "resume=auto", "trainer.cpu_threads=2")
    resumed = run_train(tmp_path, *THREADED, *asked, env=TWO, process=True)
    said = resumed.stdout + resumed.stderr
    assert "the run trained on 1 CPU threads and resumes on 2 (trainer.cpu_threads)" in said
    straight, other = checkpoint(tmp_path, "straight")["model"], checkpoint(tmp_path, "other")
    assert any(not torch.equal(straight[k], other["model"][k]) for k in straight)


# torch's kernels for another vector width than this CPU's widest: the scalar ones, which
# every CPU has (ATEN_CPU_CAPABILITY is read as torch loads, so those runs are processes).
WIDEST = torch.backends.cpu.get_cpu_capability()
SCALAR = {"ATEN_CPU_CAPABILITY": "default"}
on_vector_kernels = pytest.mark.skipif(
    WIDEST in ("DEFAULT", "NO AVX"), reason="this CPU runs torch's scalar kernels already"
)
EDITED_WIDTHS = {  # a kernels' width or MKL setting no torch or MKL writes: refused, one line
    "width-not-text": {"cpu_capability": 512},
    "width-with-a-line-break": {"cpu_capability": "AVX2\nresumed fine"},
    "mkl-setting-of-a-thousand-characters": {"MKL_CBWR": "A" * 1000},
}


@on_vector_kernels
def test_a_resume_on_kernels_of_another_width_says_so_with_the_export_that_restores_them(
    tmp_path,
):
    """torch runs the widest kernels the CPU has (AVX-512, AVX2, none), and their sums round
    apart: a run moved to a machine of another width ends apart from an uninterrupted one. The
    checkpoint records the width, and such a resume says so, with the export that runs the
    recorded kernels where the CPU has them. Edited records are refused in one line."""
    run_train(tmp_path, *TENSOR_RUN[:-1], "trainer.max_epochs=1", "run_name=a")
    saved = checkpoint(tmp_path, "a")
    assert saved["numerics"]["cpu_capability"] == WIDEST
    saved["numerics"]["cpu_capability"] = "DEFAULT"  # as a scalar-kernel machine writes it
    torch.save(saved, tmp_path / "scalar.pt")
    moved = ("trainer.max_epochs=2", "run_name=b", f"resume={tmp_path / 'scalar.pt'}")
    resumed = run_train(tmp_path, *TENSOR_RUN[:-1], *moved)
    said = resumed.stdout + resumed.stderr
    assert f"the run trained with torch's DEFAULT CPU kernels and resumes with {WIDEST}" in said
    assert "export ATEN_CPU_CAPABILITY=default to resume as it trained" in said
    for edit, record in EDITED_WIDTHS.items():
        path = tmp_path / f"{edit}.pt"
        torch.save({**saved, "numerics": {**saved["numerics"], **record}}, path)
        edited = ("trainer.max_epochs=2", f"run_name={edit}", f"resume={path}")
        refused = run_train(tmp_path, *TENSOR_RUN[:-1], *edited, ok=False)
        assert refused.returncode == 2, edit
        assert "its numerics record is not what torchloom writes" in error_line(refused), edit


@pytest.mark.slow  # three processes on scalar kernels
@on_vector_kernels
def test_a_run_trained_on_other_kernels_resumes_bit_equal_with_the_export_and_apart_without(
    tmp_path,
):
    """The cause and the cure, shown: a run on the scalar kernels stopped mid-epoch and resumed
    on this CPU's widest ends apart from its uninterrupted twin; resumed with the export the
    warning names, it ends bit-equal to it."""
    run = (*TENSOR_RUN[:-1], "trainer.max_epochs=2")
    stop = {**SCALAR, "SIGNAL_AT_FORWARD": "26", "SIGNAL_NAME": "SIGTERM"}  # mid-epoch 2
    run_train(tmp_path, *run, "run_name=straight", env=SCALAR, process=True)
    stopped = run_train(tmp_path, *run, "run_name=half", ok=False, env=stop, process=True)
    assert stopped.returncode == EXIT_INTERRUPTED, stopped.stderr[-2000:]
    shutil.copy(tmp_path / "checkpoints" / "half" / "last.pt", tmp_path / "half.pt")
    moved = run_train(tmp_path, *run, "run_name=moved", f"resume={tmp_path / 'half.pt'}")
    assert "export ATEN_CPU_CAPABILITY=default" in moved.stdout + moved.stderr
    straight, elsewhere = checkpoint(tmp_path, "straight")["model"], checkpoint(tmp_path, "moved")
    assert any(not torch.equal(straight[k], elsewhere["model"][k]) for k in straight)
    cured = run_train(tmp_path, *run, "run_name=half", "resume=auto", env=SCALAR, process=True)
    assert "CPU kernels" not in cured.stdout + cured.stderr
    assert_same_run(tmp_path, "straight", "half")
