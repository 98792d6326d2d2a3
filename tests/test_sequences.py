"""Sequences: ``model=cnn1d`` on [C, L] inputs from ``data=tensors`` and a table's rows from
``data=csv``; it trains above chance, resumes bit-exactly, exports to ONNX, and sequences of
different lengths are refused in one line that says how to pad them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    EVALUATE,
    assert_same_run,
    error_line,
    interrupt_and_resume,
    read_metrics,
    run_python,
    run_train,
    slow,
    write_rows,
)

SMALL = ["model=cnn1d", "model.channels=[8,16]", "data.batch_size=16", "trainer.max_epochs=4"]


def waves(path, channels, samples=240, length=64, seed=0):
    """Two classes of noisy waves, as sensors record them: sines (0) and squares (1) of random
    frequency, phase and gain per channel, in noise."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, length)
    y = rng.integers(0, 2, samples)
    x = np.zeros((samples, channels, length), np.float32)
    for i in range(samples):
        wave = np.sin(2 * np.pi * rng.uniform(2, 6) * t + rng.uniform(0, 2 * np.pi))
        wave = np.sign(wave) if y[i] else wave
        for c in range(channels):
            x[i, c] = wave * rng.uniform(0.5, 1.5) + rng.normal(0, 0.3, length)
    np.savez(path, x=x, y=y)
    return x, y


@pytest.mark.parametrize("channels", [3, *slow(1)])
def test_cnn1d_learns_waves_of_one_or_three_channels(tmp_path, channels):
    waves(tmp_path / "waves.npz", channels)
    result = run_train(tmp_path, "data=tensors", "data.path=waves.npz", *SMALL, "run_name=w")
    assert f"input [{channels}, 64] → 2 classes" in result.stdout
    assert read_metrics(tmp_path / "runs" / "w")["test/acc"] > 0.75  # chance is 0.5


def test_an_interrupted_cnn1d_run_resumes_bit_identically(tmp_path):
    waves(tmp_path / "waves.npz", 3)
    run = [
        "data=tensors",
        "data.path=waves.npz",
        *SMALL,
        "model=cnn1d",
        "model._target_=signalling_model.cnn1d",
        "trainer.log_every_n_steps=2",
    ]
    run_train(tmp_path, *run, "run_name=straight")
    position = interrupt_and_resume(tmp_path, run, "cut", at=13)  # 11 batches an epoch
    assert (position["epoch"], position["batch_in_epoch"]) == (1, 2)
    assert_same_run(tmp_path, "straight", "cut")


def test_cnn1d_exports_to_onnx_and_shows_its_shapes(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    x, _ = waves(tmp_path / "waves.npz", 3)
    run_train(tmp_path, "data=tensors", "data.path=waves.npz", *SMALL, "run_name=w")
    run_python(tmp_path, str(EVALUATE), "ckpt=checkpoints/w/best.pt", "export=w.onnx", "runs=eval")
    session = ort.InferenceSession(str(tmp_path / "w.onnx"))
    for size in (1, 5):
        (out,) = session.run(None, {session.get_inputs()[0].name: x[:size]})
        assert out.shape == (size, 2)
    shapes = run_train(
        tmp_path, "data=tensors", "data.path=waves.npz", *SMALL, "debug=shapes", "run_name=shapes"
    )
    assert "Conv1d" in shapes.stdout and "[N, 8, 64]" in shapes.stdout


@pytest.mark.slow
def test_a_tables_rows_are_one_channel_sequences(tmp_path):
    rng = np.random.default_rng(1)
    rows = []
    for i in range(200):
        wave = np.sin(2 * np.pi * rng.uniform(2, 5) * np.linspace(0, 1, 32) + rng.uniform(0, 6))
        wave = np.sign(wave) if i % 2 else wave
        rows.append([*(f"{v:.3f}" for v in wave + rng.normal(0, 0.2, 32)), "ab"[i % 2]])
    write_rows(tmp_path / "t.csv", [*(f"t{k}" for k in range(32)), "y"], rows)
    result = run_train(
        tmp_path, "data=csv", "data.path=t.csv", "data.target=y", *SMALL, "run_name=t"
    )
    assert "input [32] → 2 classes" in result.stdout
    assert read_metrics(tmp_path / "runs" / "t")["test/acc"] > 0.75


def test_sequences_of_different_lengths_are_refused_saying_how_to_pad(tmp_path):
    ragged = np.empty(3, dtype=object)
    ragged[:] = [np.zeros((1, 5)), np.zeros((1, 7)), np.zeros((1, 6))]
    np.savez(tmp_path / "ragged.npz", x=ragged, y=np.array([0, 1, 0]))
    torch.save(
        {"x": [torch.zeros(1, 5), torch.zeros(1, 7)], "y": torch.tensor([0, 1])},
        tmp_path / "ragged.pt",
    )
    for name in ("ragged.npz", "ragged.pt"):
        line = error_line(
            run_train(tmp_path, "data=tensors", f"data.path={name}", "model=cnn1d", ok=False)
        )
        assert "pad each sequence to the longest with zeros" in line, line
    images = tmp_path / "images.npz"
    np.savez(images, x=np.zeros((200, 3, 8, 8), np.uint8), y=np.arange(200) % 2)
    line = error_line(
        run_train(tmp_path, "data=tensors", "data.path=images.npz", "model=cnn1d", ok=False)
    )
    assert "model=cnn1d takes sequences [C, L]" in line
