"""Inputs and labels already in arrays (``data=tensors``): ``x`` and ``y`` from a ``.npz`` or a
``.pt`` file.

    python train.py data=tensors data.path=features.npz model=mlp
    python train.py data=tensors data.path=images.pt model=cnn
    python train.py data=tensors data.path=traces.npz model=cnn1d     # x: [N, C, L] sequences

``x`` is [N, C, H, W] uint8 images, [N, C, L] sequences (``model=cnn1d``) or [N, ...]
numbers (sequences of different lengths are refused: pad them to one); ``y`` is [N] integer class indices, or
for ``task=multilabel`` a 0/1 matrix [N, labels], or for ``task=regression`` numbers [N] or
[N, values].
``x_val``/``y_val`` and ``x_test``/``y_test`` in the same file are the val and test splits;
a split the file does not hold is held out of ``x`` by the seeded ``split``. A ``.pt`` file is
read with ``torch.load(weights_only=True)`` and a ``.npz`` with ``allow_pickle=False``, so a
file from elsewhere can hold arrays and nothing that runs. ``mean: null`` and ``std: null``
standardise each channel (each feature of [N, F] inputs) with the train split's statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.arrays.inputs import Values
from data.batching.dataset import Batching, Data, Splits, can
from data.batching.folds import FoldIds, FoldPlan, tensor_splits
from data.batching.splits import TensorSplit, channel_statistics
from data.batching.targets import reads_targets
from data.images.inputs import Pixels
from data.tables.inputs import Rows
from data.tables.target_columns import array_targets, stratifies, target_array
from utils.errors import UserError
from utils.intact import check_intact

PAD = (
    "give x as one array [N, C, L]: pad each sequence to the longest with zeros "
    "(torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True), or numpy.pad) or cut them "
    "to one length"
)
SPLIT_KEYS = {"train": ("x", "y"), "val": ("x_val", "y_val"), "test": ("x_test", "y_test")}


def read_arrays(path: Path) -> dict[str, torch.Tensor]:
    """The arrays of a ``.npz`` or ``.pt`` file, by name, loaded so that nothing can run."""
    if not path.is_file():
        raise UserError(f"no tensors file at {path}; check data.path")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                loaded: Any = {key: torch.from_numpy(arrays[key].copy()) for key in arrays.files}
        elif path.suffix == ".pt":
            check_intact(path, "copy or save it again")
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise UserError(f"{path}: data=tensors reads .npz or .pt files")
    except UserError:
        raise
    except Exception as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else "unreadable"
        if "Object arrays" in reason:  # what numpy.savez makes of sequences of unequal lengths
            raise UserError(
                f"cannot read {path}: it holds an object array (sequences of "
                f"different lengths?), which could run code; {PAD}"
            ) from None
        raise UserError(
            f"cannot read {path} as arrays ({reason}); save x and y with numpy.savez "
            "or torch.save of a dict of tensors"
        ) from None
    ragged = [
        key
        for key, value in (loaded.items() if isinstance(loaded, Mapping) else ())
        if isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor)
    ]
    if ragged:
        lengths = sorted({tuple(t.shape) for t in loaded[ragged[0]]})
        raise UserError(
            f"{path}: {ragged[0]} is a list of {len(loaded[ragged[0]])} tensors "
            f"(shapes {lengths[:3]}{'...' if len(lengths) > 3 else ''}), not one "
            f"tensor; {PAD}"
        )
    if not isinstance(loaded, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in loaded.values()
    ):
        raise UserError(
            f"{path} must hold a dict of arrays named x and y (and optionally "
            "x_val, y_val, x_test, y_test)"
        )
    for key, value in loaded.items():  # a view may declare more values than the file holds
        if value.numel() * value.element_size() > value.untyped_storage().nbytes():
            raise UserError(
                f"{path}: {key} declares {value.numel():,} values of shape "
                f"{list(value.shape)} but the file holds "
                f"{value.untyped_storage().nbytes():,} bytes for it; save a plain "
                "tensor (x.contiguous().clone())"
            )
    return dict(loaded)


def split_of(arrays: Mapping[str, torch.Tensor], name: str, path: Path) -> TensorSplit | None:
    x_key, y_key = SPLIT_KEYS[name]
    if x_key not in arrays and y_key not in arrays:
        if name == "train":
            raise UserError(f"{path} holds no x and y (it holds {', '.join(arrays)})")
        return None
    if x_key not in arrays or y_key not in arrays:
        raise UserError(f"{path} holds {x_key if x_key in arrays else y_key} without its pair")
    x, y = arrays[x_key], arrays[y_key]
    if x.dim() < 2:
        raise UserError(
            f"{path}: {x_key} must be [N, features] or [N, C, H, W], not shape {list(x.shape)}"
        )
    if y.dim() not in (1, 2) or len(y) != len(x):
        raise UserError(
            f"{path}: {y_key} must be [N] labels (or [N, K] label sets or values) "
            f"for {x_key}'s {len(x)} samples, not shape {list(y.shape)}"
        )
    if x.dtype != torch.uint8:
        x = x.float()
        if not bool(torch.isfinite(x).all()):
            raise UserError(f"{path}: {x_key} holds NaN or Inf values; clean them first")
    return TensorSplit(x, y)


@can("folds")
@reads_targets("label_sets", "values")
def load_tensors(
    path: str,
    num_classes: int | None,
    split: Mapping[str, Any],
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    **options,
) -> Data:
    """conf/data/tensors.yaml. ``num_classes``: null = the largest label + 1. ``options``: the
    keys of :class:`data.batching.dataset.Batching`, and ``targets``, the kind of target the task learns
    (data/batching/targets.py; train.py passes it)."""
    kind = options.pop("targets", "classes")
    file = Path(path)
    arrays = read_arrays(file)
    samples = split_of(arrays, "train", file)
    given = {name: split_of(arrays, name, file) for name in ("val", "test")}
    given = {name: _as_targets(part, kind, file) for name, part in given.items() if part}
    samples = _as_targets(samples, kind, file)
    for name, part in given.items():
        if part.inputs.shape[1:] != samples.inputs.shape[1:]:
            raise UserError(
                f"{file}: {SPLIT_KEYS[name][0]} has samples of shape "
                f"{list(part.inputs.shape[1:])}, and x of "
                f"{list(samples.inputs.shape[1:])}; give every split the same"
            )
    plan = FoldPlan.of(split, stratifies(kind), split["seed"])  # data/batching/folds.py
    if plan.folds is not None and "val" in given:  # the file's own val split, not a path
        raise UserError(
            f"data.split.folds cuts val out of {file}'s x and y, but the file holds "
            "a val split of its own (x_val, y_val); save it without them, or drop "
            "data.split.folds (cv=)"
        )
    train, val, test, val_rows = tensor_splits(samples, given, split, plan)
    targets = array_targets(kind, [train.labels, val.labels, test.labels], num_classes, file)
    if mean is None or std is None:
        mean, std = channel_statistics(train.inputs)
    batching = Batching(mean=list(mean), std=list(std), **options)
    splits = Splits(train, val, test)
    held = train.inputs  # the kind of input the arrays hold, by their type and axes
    inputs = Pixels() if held.dtype == torch.uint8 else Rows() if held.dim() == 2 else Values()
    data = Data(f"tensors {file.name}", splits, targets.count, batching, targets, inputs=inputs)
    if plan.folds is not None:  # cv=K's oof.csv names each val sample by its row of x
        data.fold_ids = FoldIds(plan.fold, [f"row {i}" for i in val_rows.tolist()])
    return data


def _as_targets(part: TensorSplit, kind: str, path: Path) -> TensorSplit:
    return TensorSplit(part.inputs, target_array(part.labels, kind, path))
