"""evaluate.py export=model.pt2 (torch.export) and export=model.onnx (torch's current dynamo
exporter): a program that runs without torchloom, with a dynamic batch, giving evaluate.py's
outputs; verified before it is written; the deprecated exporter only on request."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import run_evaluate, run_python, run_train

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# Runs in a fresh process that imports nothing of torchloom: torch, numpy and onnxruntime only.
CONSUMER = """
import sys, torch, onnxruntime
inputs = torch.load("test_inputs.pt")
program = torch.export.load("model.pt2").module()
session = onnxruntime.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
outputs = {"pt2": program(inputs), "pt2_one": program(inputs[:1]),
           "onnx": torch.from_numpy(session.run(None, {"input": inputs.numpy()})[0])}
torch.save(outputs, "outputs.pt")
print(sorted({m.split(".")[0] for m in sys.modules} & {"utils", "models", "data"}))
"""


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("export")
    run_train(cwd, "model=cnn", "model.channels=[8,16]", "trainer.max_epochs=1", "run_name=c")
    return cwd


def test_pt2_and_onnx_give_evaluate_py_outputs_on_the_test_split(cnn_run):
    from omegaconf import OmegaConf

    from data.batching.batches import Placement
    from models.cnn import cnn
    from utils.checkpoint.load import load_checkpoint
    from utils.config.build import build

    cwd = cnn_run
    shown = ""
    for name in ("model.pt2", "model.onnx"):
        result = run_evaluate(cwd, "ckpt=checkpoints/c", f"export={name}", f"runs=e-{name}")
        shown += result.stdout
        assert "/torch/" not in result.stderr and "deprecated" not in result.stdout, name
        # onnxscript's optimiser notes are kept in the log, off the console.
        assert "unused functions" not in result.stdout + result.stderr, name
    assert "torch.export.load on batches of 1, 2 and 8 differs" in " ".join(shown.split())
    (run_dir,) = (cwd / "e-model.pt2" / "eval").iterdir()
    accuracy = next(iter(json.loads((run_dir / "metrics.json").read_text()).values()))["test/acc"]

    checkpoint = load_checkpoint(cwd / "checkpoints" / "c" / "best.pt")
    data = build(OmegaConf.create(checkpoint["config"]["data"]))  # the test split, as evaluated
    batches = data.batches("test", Placement(torch.device("cpu")), seed=0, train=False)
    inputs, labels = (torch.cat(parts) for parts in zip(*batches.epoch(0), strict=True))
    pixels = data.splits["test"].inputs  # what a user has: uint8 pixels, normalised inside
    assert pixels.dtype == torch.uint8
    torch.save(pixels, cwd / "test_inputs.pt")
    (cwd / "consumer.py").write_text(CONSUMER)
    consumer = run_python(cwd, "consumer.py", process=True)
    assert consumer.stdout.strip() == "[]"  # nothing of torchloom was imported to run them
    outputs = torch.load(cwd / "outputs.pt")

    model = cnn((1, 8, 8), 10, [8, 16], 0.1, "default").eval()
    model.load_state_dict(checkpoint["model"])
    with torch.no_grad():
        eager = model(inputs)
    for name in ("pt2", "onnx"):
        assert torch.equal(outputs[name].argmax(1), eager.argmax(1)), name
        difference = (outputs[name].softmax(1) - eager.softmax(1)).abs().max()
        assert difference <= 1e-5, name
        hits = (outputs[name].argmax(1) == labels).float().mean().item()
        assert hits == pytest.approx(accuracy, abs=1e-6), name  # evaluate.py's test/acc
    assert outputs["pt2_one"].shape == (1, 10)  # traced on 2, a batch of 1 still runs


def test_the_torchscript_exporter_only_on_request_with_one_line(cnn_run):
    result = run_evaluate(
        cnn_run, "ckpt=checkpoints/c", "export=old.onnx", "onnx_exporter=torchscript", "runs=e-old"
    )
    said = [
        line
        for line in result.stderr.splitlines() + result.stdout.splitlines()
        if "deprecated" in line and "torchvision" not in line
    ]
    assert len(said) == 1 and "onnx_exporter=torchscript" in said[0]
    assert (cnn_run / "old.onnx").stat().st_size > 1000
    bad = run_evaluate(
        cnn_run, "ckpt=checkpoints/c", "export=x.onnx", "onnx_exporter=jit", "runs=e-bad", ok=False
    )
    assert bad.returncode == 2 and "onnx_exporter='jit' must be dynamo or torchscript" in bad.stderr


def test_a_missing_onnxscript_is_one_line_naming_the_extra(cnn_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # what an install without it sees
    result = run_evaluate(cnn_run, "ckpt=checkpoints/c", "export=y.onnx", "runs=e-none", ok=False)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert errors == [
        'error: export=*.onnx needs the extra: pip install -e ".[export]" (onnxscript is missing)'
    ]
    assert not (cnn_run / "y.onnx").exists()


def test_an_export_that_differs_from_the_model_is_not_written(tmp_path):
    from data.batching.inputs import RawValues
    from utils.errors import UserError
    from utils.evaluation.export import export_model

    class Drifts(torch.nn.Module):  # traced on one path, run eagerly on another
        def forward(self, x):
            return x.flatten(1) + (1e-3 if torch.compiler.is_compiling() else 0.0)

    with pytest.raises(UserError, match="differs from PyTorch by up to"):
        export_model(RawValues(Drifts(), [0.0] * 4, [1.0] * 4, (4,)), tmp_path / "d.pt2")
    assert not (tmp_path / "d.pt2").exists()
