"""What a run's report shows of its test split, kept beside it (``test_predictions.npz``), so
``report.py`` can draw the report again without the model or the data: the task's evidence
(utils/tasks ``evidence``: targets, predictions, scores and each sample's loss as plain arrays)
and the worst-predicted samples in their own form — pictures for images, the text a person
reads for rows and texts (data/batching/inputs.py ``picture_of`` and ``shown``).

The file is read back as hostile data: NumPy's format without pickles, only the names below,
numbers or text of the shapes they must have; anything else is one line naming the file."""

from __future__ import annotations

import io
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.batching.inputs import picture_of
from utils.errors import UserError
from utils.files import write_file

EVIDENCE = "test_predictions.npz"
WORST = 16  # samples shown, worst first
PER_SAMPLE = ("target", "predicted", "confidence", "loss", "scores", "truth", "estimate", "actual")
SHOWN = ("worst", "pictures", "texts", "captions", "names", "sampled")
MAX_SAMPLES = 10_000_000
MAX_VALUES = 100_000_000  # numbers in all its arrays (800 MB of float64): a larger one is no run's


def keep_evidence(run_dir: Path, evidence: dict | None, split: Any, data: Any, names: list) -> None:
    """Write ``evidence`` (a task's, of every sample of the ``split`` the run tested on) and its
    :data:`WORST` samples by loss into ``run_dir``; nothing for a task without evidence."""
    if evidence is None:
        return
    arrays = {key: _numpy(value) for key, value in evidence.items()}
    if "loss" not in arrays:  # a language model's: the text it wrote
        _write(run_dir, arrays)
        return
    arrays["names"] = np.array([str(name) for name in names] or [""])
    loss = np.nan_to_num(arrays["loss"].astype(np.float64), nan=np.inf)
    worst = np.argsort(-loss, kind="stable")[:WORST]
    arrays["worst"] = worst.astype(np.int64)
    arrays["captions"] = np.array([_caption(arrays, int(i)) for i in worst] or [""])
    samples = _held(split, torch.from_numpy(worst))
    if samples is not None:
        pictures = picture_of(data.inputs, samples)
        if pictures is not None:
            arrays["pictures"] = (pictures.numpy() * 255).round().astype(np.uint8)
        else:
            arrays["texts"] = np.array([data.inputs.shown(s) for s in samples] or [""])
    _write(run_dir, arrays)


def _write(run_dir: Path, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    write_file(run_dir / EVIDENCE, buffer.getvalue(), "choose a paths.runs this user can write")


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _caption(arrays: dict, index: int) -> str:
    """How a sample's target and prediction read: class names, or values to 4 figures."""
    names, loss = arrays["names"], float(arrays["loss"][index])
    if "predicted" in arrays:  # a class
        true, said = arrays["target"][index], arrays["predicted"][index]
        return f"#{index}: {_name(names, true)} → {_name(names, said)}\nloss {loss:.3g}"
    if "estimate" in arrays:  # values
        shown = ";".join(f"{v:.4g}" for v in np.atleast_1d(arrays["actual"][index]))
        guessed = ";".join(f"{v:.4g}" for v in np.atleast_1d(arrays["estimate"][index]))
        return f"#{index}: {shown} → {guessed}\nloss {loss:.3g}"
    on = np.flatnonzero(arrays["truth"][index] >= 0.5)  # label sets: the labels present
    return f"#{index}: labels {';'.join(str(names[i]) for i in on) or '-'}\nloss {loss:.3g}"


def _name(names: np.ndarray, index: Any) -> str:
    index = int(index)
    return str(names[index]) if 0 <= index < len(names) and names[index] else str(index)


def _held(split: Any, rows: torch.Tensor) -> torch.Tensor | None:
    """The samples ``rows`` of a split held in memory or memory-mapped; None for one read
    file by file or from shards (its report shows captions alone)."""
    if split is None or len(rows) == 0:
        return None
    if split.held == "memory":
        return split.inputs[rows]
    if split.held == "disk":
        return torch.from_numpy(np.asarray(split.images[rows.numpy()]))
    return None


def read_evidence(run_dir: Path) -> dict[str, np.ndarray] | None:
    """The evidence a run kept, checked; None when it kept none (a language model, a run
    from before reports, ``trainer.write_outputs=false``)."""
    path = run_dir / EVIDENCE
    if not path.is_file():
        return None
    try:
        _check_sizes(path)  # from the arrays' headers: a small file may unpack to gigabytes
        with np.load(path, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise UserError(f"{path} is not a test_predictions file ({error}); delete it") from None
    _check(arrays, path)
    return arrays


def _check_sizes(path: Path) -> None:
    """Refuse the file when its arrays' headers declare more than :data:`MAX_VALUES` numbers,
    before any is unpacked."""
    declared = 0
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                header = np.lib.format.read_array_header_1_0
                if version != (1, 0):
                    header = np.lib.format.read_array_header_2_0
                shape, _, _ = header(stream)
            declared += math.prod(shape)
    if declared > MAX_VALUES:
        raise UserError(
            f"{path} declares {declared:,} values, more than a run keeps ({MAX_VALUES:,}); "
            "delete it, and report.py draws the rest"
        )


def _check(arrays: dict[str, np.ndarray], path: Path) -> None:
    fix = "was it edited? delete it, and report.py draws the rest"
    unknown = sorted(set(arrays) - {*PER_SAMPLE, *SHOWN})
    if unknown or ("loss" not in arrays and "sampled" not in arrays):
        raise UserError(f"{path}: unexpected or missing arrays {unknown or ['loss']} ({fix})")
    pairs = (("predicted", "target"), ("scores", "truth"), ("estimate", "actual"))
    for one, other in pairs:
        if (one in arrays) != (other in arrays):
            raise UserError(f"{path}: {one} without {other}, or the other way ({fix})")
        if one in arrays and arrays[one].shape != arrays[other].shape:
            raise UserError(f"{path}: {one} and {other} differ in shape ({fix})")
    if "scores" in arrays and arrays["scores"].ndim != 2:
        raise UserError(f"{path}: scores are not one row of scores a sample ({fix})")
    count = len(arrays["loss"]) if "loss" in arrays else 0
    for name, array in arrays.items():
        text = name in ("names", "captions", "texts", "sampled")
        if array.dtype.kind != ("U" if text else array.dtype.kind) or array.dtype.kind in "OVSM":
            raise UserError(f"{path}: {name} holds {array.dtype} values ({fix})")
        if not text and array.dtype.kind not in "biuf":
            raise UserError(f"{path}: {name} holds {array.dtype}, not numbers ({fix})")
        if name in PER_SAMPLE and (array.ndim == 0 or len(array) != count or count > MAX_SAMPLES):
            raise UserError(f"{path}: {name} has {array.shape}, not one row a sample ({fix})")
    classes = len(arrays.get("names", ()))
    for name in ("target", "predicted"):
        if name in arrays and ((arrays[name] < 0) | (arrays[name] >= classes)).any():
            raise UserError(
                f"{path}: {name} holds class indices past the {classes} classes ({fix})"
            )
    pictures = arrays.get("pictures")
    if pictures is not None and (pictures.ndim != 4 or pictures.shape[-1] != 3):
        raise UserError(f"{path}: pictures are {pictures.shape}, not [N, H, W, 3] ({fix})")
    worst = arrays.get("worst", np.zeros(0, np.int64))
    if worst.ndim != 1 or ((worst < 0) | (worst >= count)).any():
        raise UserError(f"{path}: worst names samples past the {count} kept ({fix})")
