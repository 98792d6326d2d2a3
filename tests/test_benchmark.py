"""The speed benchmark runs and reports every method it promises (its figures are for the
docs/speed.md, not for assertions: timing a shared CI machine proves nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

# the benchmarks at smoke size: slow; .ci/run runs them, `pytest -m "not slow"` leaves them out
pytestmark = pytest.mark.slow


def test_benchmark_reports_floor_dataloader_and_torchloom(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "loop_speed.py"),
            "--cases",
            "digits",
            "--rounds",
            "1",
            "--epochs",
            "2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["case"] == "digits" and report["floor_ratio"] == 1.0
    for method in ("floor", "dataloader", "torchloom"):
        assert report[method] > 0
    assert 0 < report["torchloom_ratio"] < 10
    assert "lightning" in result.stdout  # reported as run or as not installed


def test_gpu_benchmark_runs_every_comparison_at_smoke_size_on_the_cpu(tmp_path):
    """The GPU script is run for real only where a GPU is lent; here it proves it runs."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_speed.py"), "--smoke", "--device", "cpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.strip().splitlines() if line.startswith("{")]
    reports = {report["case"]: report for report in map(json.loads, lines)}
    assert {"resnet18_fp32", "resnet18_fp32_channels_last", "mnist_mlp_data_path"} <= set(reports)
    ddp, fsdp = reports.pop("strategy_ddp"), reports.pop("strategy_fsdp")
    gpt = reports.pop("gpt_shakespeare_char")  # nanoGPT's GPU preset, at smoke size
    assert gpt["torchloom_tokens_per_second"] > 0 and gpt["hand_written_tokens_per_second"] > 0
    assert 0 < gpt["val_loss_whole_split"] < 5  # finite: 20 warm-up steps leave it near ln 65
    for report in reports.values():
        assert report["hand_written_ratio"] == 1.0 and report["torchloom_images_per_second"] > 0
    assert reports["mnist_mlp_data_path"]["dataloader_images_per_second"] > 0
    # 2 processes: FSDP holds half the parameters and optimizer state of each one DDP holds
    for key in ("memory/param_bytes_per_process", "memory/optimizer_bytes_per_process"):
        assert 0.45 <= fsdp[key] / ddp[key] <= 0.55, (key, fsdp[key], ddp[key])


def test_image_folder_benchmark_compares_every_way_of_holding_the_images(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "image_folder_speed.py"),
            "--smoke",
            "--cases",
            "grey_png",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # the cache's build was timed (logged to 0.1 s: a smoke-size build may read "0.0 s")
    assert report["case"] == "grey_png" and report["build_seconds"] is not None
    for mode in ("floor", "memory", "disk", "off", "shards", "shards_png", "shards_s3"):
        assert report[f"{mode}_samples_per_second"] > 0 and report[f"{mode}_peak_rss_mb"] > 0
    assert report["memory_to_floor"] > 0 and report["disk_to_dataloader"] > 0
    assert report["shards_to_memory"] > 0 and report["shards_s3_to_shards"] > 0


def test_fine_tuning_figures_compare_each_feature_with_the_run_without_it(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "fine_tuning_figures.py"),
            "--cases",
            "distill",
            "layer_decay",
            "--seeds",
            "0",
            "--epochs",
            "1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [(r["case"], r["run"]) for r in reports] == [
        ("distill", "mlp alone"),
        ("distill", "mlp, cnn teacher (T=4, α=0.5)"),
        ("layer_decay", "from scratch"),
        *(("layer_decay", f"init_from, layer_decay={d}") for d in ("null", "0.9", "0.7", "0.5")),
    ]
    for report in reports:
        assert 0 <= report["test/acc"][0] <= 1 and report["seeds"] == 1


def test_the_augmentation_benchmark_compares_torchlooms_batches_with_timms(tmp_path):
    pytest.importorskip("timm", reason="the timm extra")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "augment_speed.py"), "--smoke"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures["samples_per_s"]) == {"timm", "torchloom"}
    assert all(v > 0 for v in figures["samples_per_s"].values()) and figures["ratio"] > 0


def test_the_table_figures_compare_the_first_command_with_the_baselines(tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn: the baselines")
    pytest.importorskip("pandas", reason="pandas: scikit-learn's bundled tables as frames")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "table_figures.py"), "--sets", "wine"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(result.stdout.strip().splitlines()[-1]).values()
    assert {"linear", "random_forest", "hist_gb", "torchloom"} <= set(row)
    assert 0.8 < row["torchloom"]["score"] <= 1.0  # wine: a test accuracy
    assert "the tabular model" in row["torchloom"]["said"]


def test_the_pruning_benchmark_compares_pruned_searches_with_unpruned_ones(tmp_path):
    pytest.importorskip("optuna")
    command = [sys.executable, str(ROOT / "benchmarks" / "search_pruning.py"), "--trials", "4"]
    command += ["--epochs", "3", "--seeds", "0", "1", "--pruners", "none", "median"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    plain = [r for r in report["searches"] if r["pruner"] == "none"]
    assert len(report["searches"]) == 4 and all(r["trials"] == 4 for r in report["searches"])
    assert all(r["pruned"] == 0 and r["epochs"] == 12 for r in plain)  # 4 trials × 3 epochs
    median = report["compared"]["median"]
    assert median["epochs_saved"] >= 0 and median["unpruned_std"] >= 0
    assert report["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # whose figures
