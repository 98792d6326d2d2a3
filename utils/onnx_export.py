"""``evaluate.py export=model.onnx``: the model as an ONNX graph with a dynamic batch
dimension, verified with onnxruntime before it is kept (the ``export`` extra: onnx and
onnxruntime).

The graph is made by ``torch.onnx.export``'s TorchScript exporter (opset 17) from an fp32 copy
of the model on the CPU, in memory. onnxruntime then runs it
on seeded batches of 1 and 8 inputs, and its outputs are compared with PyTorch's. The largest
absolute difference is reported; above :data:`TOLERANCE` the export is an error and nothing is
written. A verified graph is written atomically.
"""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from utils.checkpoint import atomic_file
from utils.errors import UserError

TOLERANCE = 1e-4  # fp32: the largest absolute difference in a logit that is accepted
OPSET = 17
BATCHES = (1, 8)


def export_onnx(model: nn.Module, input_shape: Sequence[int], path: Path,
                outputs: Sequence[str] = ("logits",), unit: torch.Tensor | None = None) -> float:  # fmt: skip
    """Write ``model`` to ``path``, its outputs named ``outputs`` (a calibrated model's second,
    ``predicted``, is what its thresholds decide), and return the largest absolute difference
    between onnxruntime's and PyTorch's outputs on batches of 1 and 8, in ``unit`` per column
    of the first output (None: the outputs' own units)."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError('export=*.onnx needs the extra: pip install -e ".[export]"') from None
    cpu = copy.deepcopy(model).float().cpu().eval()
    graph = io.BytesIO()
    with warnings.catch_warnings():
        # torch>=2.9 calls this exporter legacy; it needs no further packages and handles
        # every model torchloom builds.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            torch.onnx.export(
                cpu, (torch.zeros(2, *input_shape),), graph, input_names=["input"],
                output_names=list(outputs),
                dynamic_axes={"input": {0: "batch"}, **{name: {0: "batch"} for name in outputs}},
                opset_version=OPSET, dynamo=False,
            )  # fmt: skip
        except Exception as error:
            reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            raise UserError(f"the model cannot be exported to ONNX ({type(error).__name__}: "
                            f"{reason}); export=model.safetensors keeps the weights") from None  # fmt: skip
    session = onnxruntime.InferenceSession(graph.getvalue(), providers=["CPUExecutionProvider"])
    difference = parity(cpu, session, input_shape, unit)
    if difference > TOLERANCE:
        raise UserError(f"the ONNX export differs from PyTorch by up to {difference:.2e} (more "
                        f"than {TOLERANCE:g}); nothing was written to {path}")  # fmt: skip
    try:
        with atomic_file(path) as f:  # only a verified graph is written
            f.write(graph.getvalue())
    except OSError as error:
        raise UserError(f"cannot write {path}: {error.strerror or error}") from None
    return difference


def parity(model: nn.Module, session, input_shape: Sequence[int],
           unit: torch.Tensor | None = None) -> float:  # fmt: skip
    """The largest absolute difference of the outputs on seeded batches of each size, divided
    by ``unit`` per output column when given."""
    generator = torch.Generator().manual_seed(0)
    largest = 0.0
    with torch.inference_mode():
        for batch in BATCHES:
            inputs = torch.randn(batch, *input_shape, generator=generator)
            expected = model(inputs)
            expected = expected if isinstance(expected, tuple) else (expected,)
            answers = session.run(None, {"input": inputs.numpy()})
            for index, (want, got) in enumerate(zip(expected, answers, strict=True)):
                difference = _difference(want.float(), torch.from_numpy(got).float(), batch)
                scaled = difference if unit is None or index else difference / unit
                largest = max(largest, float(scaled.max()))
    return largest


def _difference(expected: torch.Tensor, got: torch.Tensor, batch: int) -> torch.Tensor:
    if tuple(got.shape) != tuple(expected.shape):
        raise UserError(f"the ONNX export gives shape {list(got.shape)} for a batch of "
                        f"{batch}, PyTorch {list(expected.shape)}")  # fmt: skip
    for who, outputs in (("PyTorch", expected), ("onnxruntime", got)):
        if not bool(torch.isfinite(outputs).all()):  # NaN would compare as no difference
            raise UserError(f"the model's outputs under {who} are not finite (NaN or "
                            f"inf) on a batch of {batch}: are its weights finite? "
                            "Nothing was exported")  # fmt: skip
    return (got - expected).abs()
