"""``evaluate.py export=model.pt2`` and ``export=model.onnx``: the model as a program that runs
without torchloom, with a dynamic batch dimension, verified before it is kept.

Both start from one ``torch.export`` ExportedProgram of an fp32 copy of the model on the CPU,
traced on a batch of 2 with the batch dimension declared dynamic (a batch of 1 would let the
tracer specialise it). The export holds what the checkpoint's record says (the task's
``exportable``: the weights chosen, the target scale, a temperature and thresholds).

- ``.pt2``: ``torch.export.save``; ``torch.export.load(path).module()`` runs it in a process
  that imports nothing of torchloom.
- ``.onnx``: torch's current exporter (``torch.onnx.export(..., dynamo=True)``, which needs
  ``onnxscript``: the ``export`` extra), checked in onnxruntime. ``onnx_exporter=torchscript``
  asks for the TorchScript-based exporter torch has deprecated, with one line saying so.

Verification: the written bytes are read back (``torch.export.load``, or an onnxruntime
session) and run on seeded batches of 1, 2 and 8; each output is compared with the eager
model's. Above :data:`TOLERANCE` the export is an error and nothing is written; a verified
file is written atomically.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from utils.errors import UserError
from utils.files import write_file
from utils.intact import tensors_digest

log = logging.getLogger("torchloom")
TOLERANCE = 1e-5  # fp32: the largest absolute difference in an output that is accepted
OPSET = 18  # the dynamo exporter's default; the TorchScript one is asked for the same
BATCHES = (1, 2, 8)
EXAMPLE_BATCH = 2  # traced on: 0 and 1 are sizes torch.export specialises
SUFFIXES = (".pt2", ".onnx")
METADATA_KEY = "torchloom"  # ONNX metadata_props: the export's record, as JSON
METADATA_FILE = "torchloom.json"  # the .pt2's extra file: the same record
DIGEST_KEY = "torchloom_sha256"  # a .safetensors export's metadata: its weights' sha256
EXPORTERS = ("dynamo", "torchscript")


def export_model(
    model: nn.Module,
    path: Path,
    outputs: Sequence[str] = ("logits",),
    unit: torch.Tensor | None = None,
    exporter: str = "dynamo",
    metadata: dict | None = None,
) -> float:
    """Write ``model`` (an export's front, data/batching/inputs.py Normalised: it draws its own example
    inputs) to ``path`` (.pt2 or .onnx), its outputs named ``outputs``, with ``metadata`` as
    JSON under the key ``torchloom`` (ONNX ``metadata_props``; the .pt2's extra file
    ``torchloom.json``), and return the largest absolute difference between the written
    program's outputs and the eager model's on batches of 1, 2 and 8, in ``unit`` per column
    of the first output (None: the outputs' own units). ``exporter``: the ONNX exporter
    (dynamo, or the deprecated torchscript; evaluate.py checks it where it enters)."""
    cpu = copy.deepcopy(model).cpu().eval()
    extra = json.dumps(metadata or {}, sort_keys=True)
    if path.suffix.lower() == ".onnx":
        with kept_in_the_log(CHATTY_EXPORTERS):  # its optimiser's notes: not the console's
            run, data = _onnx(cpu, outputs, exporter, extra)
    else:
        run, data = _pt2(_traced(cpu), extra)
    difference = parity(cpu, run, unit)
    if difference > TOLERANCE:
        raise UserError(
            f"the {path.suffix} export differs from PyTorch by up to "
            f"{difference:.2e} (more than {TOLERANCE:g}); nothing was written to "
            f"{path}"
        )
    write_file(path, data, "choose another export=...")  # only a verified program
    return difference


CHATTY_EXPORTERS = ("onnxscript", "onnx_ir", "torch.onnx")


class _NotFrom(logging.Filter):
    """Passes records of other loggers, and these loggers' warnings and errors."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__()
        self.names = tuple(names)

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name in self.names or record.name.startswith(
            tuple(f"{n}." for n in self.names)
        )
        return not ours or record.levelno >= logging.WARNING


@contextlib.contextmanager
def kept_in_the_log(names: Sequence[str]) -> Iterator[None]:
    """The info lines of the ``names`` loggers go to the log file, not the console."""
    quiet = _NotFrom(names)
    consoles = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    for handler in consoles:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in consoles:
            handler.removeFilter(quiet)


def _inputs(example: Any) -> tuple[torch.Tensor, ...]:
    """A wrapper's example as the tuple of its inputs (texts: ids and mask; else one)."""
    return example if isinstance(example, tuple) else (example,)


def _traced(model: nn.Module) -> torch.export.ExportedProgram:
    """``model`` as an ExportedProgram whose batch dimension (and a text's length) stays
    symbolic."""
    batch = torch.export.Dim("batch", min=1)
    inputs = _inputs(model.example(EXAMPLE_BATCH, torch.Generator().manual_seed(1)))
    dims = {0: batch}
    if len(inputs) > 1:  # texts: the length varies too, up to the positions the model has
        dims[1] = torch.export.Dim("length", min=2, max=max(3, model.max_length))
    try:
        with torch.inference_mode(False), torch.no_grad():
            shapes = tuple(dict(dims) for _ in inputs)
            program = torch.export.export(model, inputs, dynamic_shapes=shapes)
    except Exception as error:
        raise _cannot("torch.export", error) from None
    traced = [n for n in program.graph.nodes if n.op == "placeholder"][-1].meta["val"]
    if not isinstance(traced.shape[0], torch.SymInt):  # pragma: no cover - torch's contract
        raise UserError(
            "torch.export fixed the batch size of this model; it cannot be exported "
            "with a dynamic batch"
        )
    return program


def _cannot(exporter: str, error: Exception) -> UserError:
    reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return UserError(
        f"the model cannot be exported with {exporter} ({type(error).__name__}: "
        f"{reason}); export=model.safetensors keeps the weights"
    )


def _pt2(program: torch.export.ExportedProgram, metadata: str) -> tuple[Callable, bytes]:
    """(the saved program as loaded back, the bytes of the .pt2 file with ``metadata``)."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={METADATA_FILE: metadata})
    data = buffer.getvalue()
    loaded = torch.export.load(io.BytesIO(data)).module()
    return lambda inputs: loaded(*inputs), data


def _onnx(
    model: nn.Module, outputs: Sequence[str], exporter: str, metadata: str
) -> tuple[Callable, bytes]:
    """(an onnxruntime session of the graph, the bytes of the .onnx file with ``metadata``)."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(
            'export=*.onnx needs the extra: pip install -e ".[export]" (onnxruntime is missing)'
        ) from None
    if exporter == "dynamo":
        try:
            import onnxscript  # noqa: F401  (torch's exporter needs it)
        except ImportError:
            raise UserError(
                'export=*.onnx needs the extra: pip install -e ".[export]" (onnxscript is missing)'
            ) from None
        program = _traced(model)
        try:
            onnx_program = torch.onnx.export(
                program,
                input_names=list(getattr(model, "input_names", ["input"])),
                output_names=list(outputs),
                opset_version=OPSET,
                dynamo=True,
                verbose=False,
            )
            proto = onnx_program.model_proto
        except Exception as error:
            raise _cannot("torch.onnx (dynamo)", error) from None
    else:
        proto = _torchscript_onnx(model, outputs)
    del proto.metadata_props[:]
    proto.metadata_props.add(key=METADATA_KEY, value=metadata)
    data = proto.SerializeToString()
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    run = lambda inputs: session.run(  # noqa: E731
        None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)}
    )
    return run, data


def _torchscript_onnx(model: nn.Module, outputs: Sequence[str]) -> Any:
    """The graph of torch's deprecated TorchScript-based exporter, on request only."""
    log.warning(
        "warning: onnx_exporter=torchscript is the exporter torch deprecated in 2.9 "
        "and will remove; the default (dynamo) is its replacement"
    )
    if len(getattr(model, "input_names", ())) > 1:
        raise UserError(
            "onnx_exporter=torchscript exports one input; texts need the default (dynamo)"
        )
    graph = io.BytesIO()
    with warnings.catch_warnings():  # said once above, in one line
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            torch.onnx.export(
                model,
                (model.example(EXAMPLE_BATCH, torch.Generator().manual_seed(1)),),
                graph,
                input_names=["input"],
                output_names=list(outputs),
                dynamic_axes={"input": {0: "batch"}, **{name: {0: "batch"} for name in outputs}},
                opset_version=OPSET,
                dynamo=False,
            )
        except Exception as error:
            raise _cannot("torch.onnx (torchscript)", error) from None
    import onnx

    return onnx.load_from_string(graph.getvalue())


def parity(model: nn.Module, run: Callable, unit: torch.Tensor | None = None) -> float:
    """The largest absolute difference between ``run``'s outputs and ``model``'s on seeded
    batches of each size of the inputs it takes, divided by ``unit`` per column of the first
    output when given."""
    generator = torch.Generator().manual_seed(0)
    largest = 0.0
    with torch.inference_mode():
        for batch in BATCHES:
            inputs = _inputs(model.example(batch, generator))
            expected = model(*inputs)
            expected = expected if isinstance(expected, tuple) else (expected,)
            answers = run(tuple(x.clone() for x in inputs))
            answers = answers if isinstance(answers, tuple | list) else (answers,)
            if len(answers) != len(expected):
                raise UserError(f"the export gives {len(answers)} outputs, PyTorch {len(expected)}")
            for index, (want, got) in enumerate(zip(expected, answers, strict=True)):
                got = got if isinstance(got, torch.Tensor) else torch.from_numpy(got)
                difference = _difference(want.float(), got.float(), batch)
                scaled = difference if unit is None or index else difference / unit
                largest = max(largest, float(scaled.max()))
    return largest


def _difference(expected: torch.Tensor, got: torch.Tensor, batch: int) -> torch.Tensor:
    if tuple(got.shape) != tuple(expected.shape):
        raise UserError(
            f"the export gives shape {list(got.shape)} for a batch of "
            f"{batch}, PyTorch {list(expected.shape)}"
        )
    for who, outputs in (("PyTorch", expected), ("the export", got)):
        if not bool(torch.isfinite(outputs).all()):  # NaN would compare as no difference
            raise UserError(
                f"the model's outputs under {who} are not finite (NaN or "
                f"inf) on a batch of {batch}: are its weights finite? "
                "Nothing was exported"
            )
    return (got - expected).abs()


def export_safetensors(weights: dict, config: dict, inputs: dict | None, path: Path) -> None:
    """The weights (a whole state dict) without pickle, the config and the inputs record (a
    regression run's target scale) as JSON metadata beside them, and the weights' sha256 (the
    format holds no checksum; utils/checkpoint/stored.py checks it when read)."""
    try:
        from safetensors.torch import save
    except ImportError:
        raise UserError('export needs the extra: pip install -e ".[export]"') from None
    weights = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    metadata = {"torchloom_config": json.dumps(config), DIGEST_KEY: tensors_digest(weights)}
    if inputs is not None:
        metadata["torchloom_inputs"] = json.dumps(inputs)
    write_file(path, save(weights, metadata=metadata), "choose another export=...")


def export_record(raw: nn.Module, outputs: Sequence[str], record: Any, task: Any) -> dict:
    """What an exported program carries as metadata: what it takes (its kind of input's front:
    data/batching/inputs.py), what its
    outputs are (their names, the classes or target columns, in the targets' own units) and
    the calibration it holds."""
    targets = record.targets
    return {
        "format": 1,
        "input": raw.describe(),
        "outputs": list(outputs),
        "targets": {
            "kind": targets.kind,
            "names": list(targets.names) if targets.names is not None else None,
            "units": "the targets' own (outputs are unscaled inside)",
        },
        "calibration": task.calibrated.record() if task.calibrated else None,
        "mean": list(record.mean),
        "std": list(record.std),
        **raw.carries(),  # texts: the tokenizer, so a program can tokenize as predict.py does
    }


def export_evaluated(
    modules: Any,
    task: Any,
    stored: tuple[dict, Any],
    path: Path,
    out: Any,
    exporter: str,
) -> None:
    """The evaluated weights to ``path``: a verified program (.pt2 with torch.export, .onnx
    with ``exporter``) holding what the record says (a regression model's outputs in the
    targets' units, a temperature and thresholds), or .safetensors with the ``stored`` config
    and the inputs record of the evaluated data and task (with the target scale) beside them."""
    suffix = path.suffix.lower()
    if suffix in SUFFIXES:
        model, outputs, unit = task.exportable(modules.model)
        config, record = stored
        front = record.inputs.front  # the inputs a user has, prepared inside
        raw = front(model.float(), record.mean, record.std, record.input_shape)
        metadata = export_record(raw, outputs, record, task)
        difference = export_model(raw, path, outputs, unit, exporter, metadata)
        units = "" if unit is None else ", in the model's scaled units"
        calibrated = f"; {task.calibrated.described()}" if task.calibrated else ""
        runner = "onnxruntime" if suffix == ".onnx" else "torch.export.load"
        out.print(
            f"exported the model to {path}, taking {metadata['input']['kind']} "
            f"({metadata['input']['dtype']} {metadata['input']['shape']}; outputs: "
            f"{', '.join(outputs)}{calibrated}); {runner} on batches of 1, 2 and 8 differs "
            f"from PyTorch by at most {difference:.1e} (fp32{units}, bar 1e-5)"
        )
    else:  # .safetensors (checked before anything was evaluated)
        config, record = stored
        export_safetensors(modules.model.state_dict(), config, record.to_dict(), path)
        out.print(f"exported weights to {path}")
