"""End-to-end runs of ``python train.py`` as a user types it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from conftest import read_events, read_metrics, run_train, scalars, slow
from hydra.utils import instantiate
from omegaconf import OmegaConf

CHECKPOINT_KEYS = {
    "format_version",
    "stopped_by",
    "callbacks",
    "provenance",
    "rng_per_rank",
    "skipped_steps",
    "global_batch",
    "numerics",
    "early_stopping",
    "elapsed_seconds",
    "ema",
    "swa",
    "distill",
    "classes",
    "inputs",
    "tracking",
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "epoch",
    "batch_in_epoch",
    "global_step",
    "best_metric",
    "best_epoch",
    "top_k",
    "monitor",
    "metrics",
    "losses",
    "config",
    "overrides",
    "rng",
    "world_size",
}
TINY = ["trainer.max_epochs=1", "data.batch_size=16", "data.eval_batch_size=32"]


def hparams_tags(run_dir: Path) -> set[str]:
    return set(read_events(run_dir).PluginTagToContent("hparams"))


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """``python train.py`` with no arguments at all, in an empty folder."""
    cwd = tmp_path_factory.mktemp("default")
    result = run_train(cwd)
    (run_dir,) = (cwd / "runs").iterdir()
    (checkpoint_dir,) = (cwd / "checkpoints").iterdir()
    return result, run_dir, checkpoint_dir


def test_default_run_reaches_97_percent_on_the_digits_test_split(default_run):
    _, run_dir, _ = default_run
    metrics = read_metrics(run_dir)
    assert metrics["test_split"] == "test"
    assert metrics["test/acc"] >= 0.97
    assert metrics["epochs"] == 20 and metrics["best_epoch"] is not None


def test_metrics_json_holds_final_metrics_under_tensorboard_tags(default_run):
    _, run_dir, _ = default_run
    metrics = read_metrics(run_dir)
    for key in (
        "train/loss",
        "val/loss",
        "val/acc",
        "val/acc_top5",
        "test/loss",
        "test/acc",
        "test/acc_top5",
        "train/samples_per_second",
        "train/data_wait_fraction",
        "best_epoch",
        "epochs",
        "wall_time_seconds",
    ):
        assert key in metrics, key
    assert metrics["train/samples_per_second"] > 0 and metrics["val/acc_top5"] >= metrics["val/acc"]


def test_run_prints_its_paths_at_start_and_end(default_run):
    result, run_dir, checkpoint_dir = default_run
    assert result.stdout.count(f"run dir: {run_dir}") == 2
    assert result.stdout.count(f"checkpoints: checkpoints/{checkpoint_dir.name}") == 2
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "train.log").is_file()


def test_checkpoints_are_plain_dicts_that_load_with_weights_only(default_run):
    _, run_dir, checkpoint_dir = default_run
    assert sorted(p.name for p in checkpoint_dir.iterdir()) == [
        ".torchloom-claim",
        "best.pt",
        "last.pt",
    ]
    last = torch.load(checkpoint_dir / "last.pt", map_location="cpu", weights_only=True)
    assert set(last) == CHECKPOINT_KEYS
    assert last["epoch"] == 20 and last["global_step"] == 20 * math.ceil(
        1257 / 64
    )  # the last of 41
    assert set(last["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert last["config"]["model"]["hidden_sizes"] == [512]
    # The stored config alone rebuilds the model, and the weights fit it with no prefixes.
    model = instantiate(
        OmegaConf.create(last["config"]["model"]), input_shape=(1, 8, 8), num_classes=10
    )
    model.load_state_dict(last["model"])
    best = torch.load(checkpoint_dir / "best.pt", map_location="cpu", weights_only=True)
    assert best["epoch"] == best["best_epoch"] == read_metrics(run_dir)["best_epoch"]
    assert best["best_metric"] == last["best_metric"] == read_metrics(run_dir)["best_metric"]


def test_tensorboard_holds_the_named_scalars(default_run):
    _, run_dir, _ = default_run
    logged = scalars(run_dir)
    for tag in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/samples_per_second",
        "train/data_wait_fraction",
        "val/loss",
        "val/acc",
        "val/acc_top5",
        "test/acc",
    ):
        assert tag in logged, tag
    assert len(logged["val/acc"]) == 20  # one point per epoch
    assert [step for step, _ in logged["train/loss"]][:2] == [50, 100]  # every log_every_n_steps
    lrs = [value for _, value in logged["train/lr"]]
    assert lrs == sorted(lrs, reverse=True)  # cosine decay
    # The HPARAMS tab's experiment, session start and session end records are in the run.
    assert hparams_tags(run_dir) == {
        "_hparams_/experiment",
        "_hparams_/session_start_info",
        "_hparams_/session_end_info",
    }


def test_fixed_seed_loss_regression(default_run):
    """The first logged loss of the default job (the mean over its first 50 steps); a change
    here is a change in numerics (0.615313 before an epoch's last, partial batch was trained
    on: 20 steps an epoch instead of 19)."""
    _, run_dir, _ = default_run
    step, loss = scalars(run_dir)["train/loss"][0]
    assert step == 50
    assert loss == pytest.approx(0.607194, rel=1e-3)


@pytest.mark.parametrize(
    "dataset",
    ["digits", "mnist", "imagefolder", *slow("cifar10", "synthetic", "fashion_mnist")],
)
def test_every_model_trains_one_epoch_on_each_dataset(
    dataset, tmp_path, mnist_root, fashion_root, cifar_root, imagefolder_root
):
    settings = {
        "digits": ["data.batch_size=64", "trainer.limit_train_batches=4"],  # resnet18: 4 steps
        "synthetic": [
            "data.shape=[3,32,32]",
            "data.num_samples=64",
            "data.val_size=16",
            "data.test_size=16",
        ],
        "mnist": [f"data.root={mnist_root}", "data.val_size=32", "data.download=false"],
        "fashion_mnist": [f"data.root={fashion_root}", "data.val_size=32", "data.download=false"],
        "cifar10": [f"data.root={cifar_root}", "data.val_size=20", "data.download=false"],
        "imagefolder": [
            f"data.root={imagefolder_root}",
            "data.image_size=[16,16]",
            "data.num_workers=2",
        ],
    }[dataset]
    run_train(
        tmp_path,
        "-m",
        "run_name=matrix",
        "model=mlp,cnn,resnet18",
        f"data={dataset}",
        *TINY,
        *settings,  # after TINY: a dataset's own settings win
    )
    for job in range(3):
        metrics = read_metrics(tmp_path / "runs" / "matrix" / str(job))
        assert metrics["epochs"] == 1 and 0 <= metrics["test/acc"] <= 1
        assert metrics["test_split"] == "test"
        assert (tmp_path / "checkpoints" / "matrix" / str(job) / "last.pt").is_file()


@pytest.mark.parametrize("schedulers", ["plateau,onecycle", *slow("none,step,plateau,onecycle")])
def test_precisions_schedulers_and_clipping_run_on_cpu(tmp_path, schedulers):
    run_train(
        tmp_path,
        "-m",
        "run_name=options",
        "precision=fp16,bf16",
        f"scheduler={schedulers}",
        "optim=sgd",
        "scheduler.warmup_steps=3",
        "trainer.gradient_clip_val=1.0",
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=5",
        "model=cnn",
        "model.channels=[8,16]",
    )
    for job in range(2 * len(schedulers.split(","))):
        metrics = read_metrics(tmp_path / "runs" / "options" / str(job))
        assert metrics["train/loss"] == pytest.approx(metrics["train/loss"])  # finite, not NaN
        assert metrics["test/acc"] > 0.3  # learning happened in 2 short epochs


def final_parameters(cwd: Path, run_name: str) -> dict[str, torch.Tensor]:
    path = cwd / "checkpoints" / run_name / "last.pt"
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_accumulated_micro_batches_match_one_large_batch(tmp_path):
    """8 × 4 accumulated is the same optimisation as 32 at once (no BatchNorm, no dropout), on
    1,248 training digits: whole batches of 32 (a last, partial batch is trained on without
    accumulation only)."""
    common = [
        "data.val_size=189",
        "model.dropout=0",
        "optim=sgd",
        "scheduler=none",
        "trainer.max_epochs=1",
        "data.eval_batch_size=512",
    ]
    run_train(tmp_path, "run_name=large", "data.batch_size=32", *common)
    run_train(
        tmp_path,
        "run_name=accumulated",
        "data.batch_size=8",
        "trainer.accumulate_grad_batches=4",
        *common,
    )
    large, accumulated = (
        final_parameters(tmp_path, "large"),
        final_parameters(tmp_path, "accumulated"),
    )
    initial = torch.load(tmp_path / "checkpoints" / "large" / "last.pt", weights_only=True)
    assert initial["global_step"] == 1248 // 32
    for name in large:
        assert torch.allclose(large[name], accumulated[name], atol=1e-5), name
    assert (
        read_metrics(tmp_path / "runs" / "large")["global_step"]
        == read_metrics(tmp_path / "runs" / "accumulated")["global_step"]
    )


def test_same_seed_same_result_other_seed_other_result(tmp_path):
    run_train(tmp_path, "-m", "run_name=seeds", "seed=1,1,2", "trainer.max_epochs=1")
    a, b, c = (final_parameters(tmp_path, f"seeds/{job}") for job in range(3))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.gpu
def test_cuda_run_with_fp16_and_the_whole_dataset_on_the_gpu(tmp_path):
    run_train(
        tmp_path,
        "run_name=gpu",
        "trainer.device=cuda",
        "precision=fp16",
        "model=cnn",
        "trainer.max_epochs=3",
    )
    metrics = read_metrics(tmp_path / "runs" / "gpu")
    assert metrics["test/acc"] > 0.9
    checkpoint = torch.load(
        tmp_path / "checkpoints" / "gpu" / "last.pt", map_location="cpu", weights_only=True
    )
    assert checkpoint["scaler"]["scale"] > 0  # the GradScaler was live


@pytest.mark.slow
def test_compile_trains_and_matches_eager_accuracy_closely(tmp_path):
    run_train(
        tmp_path, "-m", "run_name=compile", "trainer.compile=false,true", "trainer.max_epochs=2"
    )
    eager, compiled = (read_metrics(tmp_path / "runs" / "compile" / str(job)) for job in range(2))
    assert (
        "torch.compile failed"
        not in (tmp_path / "runs" / "compile" / "1" / "train.log").read_text()
    )
    assert compiled["test/acc"] == pytest.approx(eager["test/acc"], abs=0.02)


@pytest.mark.slow  # 15 s of compile attempts
def test_compile_failure_falls_back_to_eager_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))  # inductor's C++ compiler
    result = run_train(
        tmp_path,
        "run_name=fallback",
        "trainer.compile=true",
        "trainer.max_epochs=1",
        process=True,  # a fresh process: this one may hold compiled code from an earlier test
    )
    assert result.stdout.count("warning: torch.compile failed") == 1
    assert read_metrics(tmp_path / "runs" / "fallback")["epochs"] == 1


class VirtualClock:
    """The loop's ``time`` module with a ``perf_counter`` that a test moves: each reading
    advances a microsecond, and a slow decode advances it by what it would take, so a measured
    share of time is the same on any machine, loaded or not."""

    def __init__(self) -> None:
        import time

        self.now, self.real = 0.0, time

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def test_a_data_bound_run_measures_its_waiting_and_says_what_to_change(tmp_path, monkeypatch):
    from conftest import write_imagefolder

    import data.images.imagefolder
    import utils.fit.loop
    import utils.fit.progress

    decode, clock = data.images.imagefolder.decode, VirtualClock()

    def slow_decode(*args):  # 10 ms an image on the loop's clock: the loop waits for batches
        clock.now += 0.01
        return decode(*args)

    monkeypatch.setattr(data.images.imagefolder, "decode", slow_decode)  # in-process run below
    monkeypatch.setattr(utils.fit.loop, "time", clock)
    monkeypatch.setattr(utils.fit.progress, "time", clock)
    root = write_imagefolder(tmp_path / "images", per_class=40, size=(16, 16), test=False)
    result = run_train(
        tmp_path,
        "run_name=waiting",
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=[16,16]",
        "data.num_workers=0",
        "data.cache=off",
        "data.batch_size=16",
        "model.hidden_sizes=[4]",
        "trainer.max_epochs=1",
    )
    fraction = read_metrics(tmp_path / "runs" / "waiting")["train/data_wait_fraction"]
    assert 0.95 < fraction <= 1.0
    assert result.stdout.count("waiting for batches: raise data.num_workers (now 0)") == 1


def test_the_data_wait_counts_the_time_spent_asking_for_batches_and_nothing_else(monkeypatch):
    """Three batches that take 2 s each to make, and 1 s to find the end, around steps of 5 s:
    7 s of waiting, whether the loop reads them to the end or stops after the second."""
    import utils.fit.progress

    clock = VirtualClock()
    monkeypatch.setattr(utils.fit.progress, "time", clock)

    def made(count: int):
        for item in range(count):
            clock.now += 2.0
            yield item
        clock.now += 1.0

    wait = utils.fit.progress.DataWait()
    for _ in wait.timed(made(3)):
        clock.now += 5.0  # the step
    assert wait.seconds == pytest.approx(7.0, abs=1e-4)
    stopped = utils.fit.progress.DataWait()
    for item in stopped.timed(made(3)):
        clock.now += 5.0
        if item == 1:
            break
    assert stopped.seconds == pytest.approx(4.0, abs=1e-4)


def test_progress_is_rate_limited_by_time_and_ends_on_the_last_step(caplog):
    """A thousand fast steps: one plain log line (CI logs), two bar redraws (a terminal), and
    the bar shows where the run ended, not where the last timed redraw left it."""
    import io
    import logging

    from rich.console import Console

    from utils.fit.progress import TrainingProgress

    plain = TrainingProgress(Console(file=io.StringIO()), 1000, 1, line_seconds=60)
    with caplog.at_level(logging.INFO, logger="torchloom"), plain:
        for step in range(1, 1001):
            plain.update(0, step, loss=1.0, samples_per_second=10.0)
    assert sum("  step " in record.getMessage() for record in caplog.records) == 1

    terminal = Console(file=io.StringIO(), force_terminal=True, width=200)
    bar = TrainingProgress(terminal, 1000, 1, refresh_seconds=60)
    redraws = []
    bar.bar.refresh = lambda: redraws.append(bar.bar.tasks[0].completed)
    with bar:
        assert bar.due == -math.inf  # the loop's first step redraws
        for step in range(1, 1001):
            bar.update(0, step, loss=1.0, samples_per_second=2500.0)
            assert bar.due == bar.last_refresh + 60  # the loop asks again only then
    assert redraws == [1, 1000]
    assert plain.due == math.inf  # without a bar, only logging steps and epoch ends update
    shown = bar.bar.tasks[0]
    assert shown.description == "epoch 1/1"
    assert re.match(
        r"1000/1000  loss 1\.0000  2,500 samples/s  \d+:\d\d:\d\d < ", shown.fields["status"]
    )  # the elapsed time, however long the loop took


def test_the_final_table_in_a_log_file_shows_every_figure_whole(tmp_path):
    """Piped to a file, the table was drawn 1,017 characters wide with its values cut off."""
    long_name = "a_run_name_long_enough_to_matter_" * 3
    result = run_train(
        tmp_path,
        "trainer.max_epochs=1",
        "model.hidden_sizes=[16,16]",
        "optim.lr=0.002",
        "trainer.gradient_clip_val=1.0",
        f"run_name={long_name}",
    )
    shown = result.stdout[result.stdout.index("final metrics") :].splitlines()
    table = "\n".join(line for line in shown if line.startswith(("┏", "┃", "┡", "│", "└")))
    assert max(len(line) for line in table.splitlines()) <= 140
    metrics = read_metrics(tmp_path / "runs" / long_name)
    values = "".join(line.split("│")[2].strip() for line in table.splitlines() if line[0] == "│")
    for override in metrics["overrides"]:  # whole: on its own line, or folded over two
        assert override in values, override
    assert f"{metrics['test/acc']:.4f}" in table and "…" not in table
