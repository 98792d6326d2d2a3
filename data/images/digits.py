"""The default dataset: 1,797 real 8×8 handwritten digits shipped with torchloom.

See ``data/assets/README.md`` for provenance and licence (UCI, CC BY 4.0).

    python train.py data=digits
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.batching.dataset import Batching, Data, Splits, can
from data.batching.folds import FoldIds, FoldPlan, tensor_splits
from data.batching.splits import TensorSplit, holdout
from data.images.inputs import Pixels
from utils.errors import UserError

BUNDLED = Path(__file__).parents[1] / "assets" / "digits.csv.gz"


def read_digits_csv(path: Path) -> TensorSplit:
    """65 integers a line: 64 pixels 0..16 in row-major order, then the label."""
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", ndmin=2)
    except (OSError, ValueError, EOFError) as error:
        # Say why without echoing the file's bytes: a stored config may point anywhere.
        why = getattr(error, "strerror", None) or (
            "not a gzip file" if isinstance(error, (OSError, EOFError)) else "not a CSV of numbers"
        )
        raise UserError(f"cannot read digits file {path}: {why}") from None
    if table.shape[1] != 65:
        raise UserError(
            f"{path}: expected 65 values a line (64 pixels, label), got {table.shape[1]}"
        )
    labels = table[:, 64]
    not_integer = labels != np.round(labels)
    if not_integer.any():
        raise UserError(f"digits ({path}): label {labels[not_integer][0]} is not an integer")
    pixels = np.round(table[:, :64] * (255 / 16)).clip(0, 255).astype(np.uint8)
    return TensorSplit(
        torch.from_numpy(pixels).view(-1, 1, 8, 8), torch.from_numpy(labels.astype(np.int64))
    )


@can("folds")
def load_digits(
    path: str | None,
    val_size: int,
    test_size: int,
    split_seed: int,
    split: Mapping[str, Any] | None = None,
    **batching,
) -> Data:
    """``path``: a digits CSV (gzip), or null for the bundled one. ``split``: the fold keys
    (data/batching/folds.py; with folds, the test_size is held out first and val is a fold of the rest).
    ``batching``: the keys of :class:`data.batching.dataset.Data` (batch_size, eval_batch_size, augment,
    mean, std)."""
    samples = read_digits_csv(Path(path) if path else BUNDLED)
    plan = FoldPlan.of(split, True, split_seed)
    if plan.folds is None:
        train, val, test = holdout(samples, [val_size, test_size], split_seed)
        return Data("digits", Splits(train, val, test), 10, Batching(**batching), inputs=Pixels())
    shares = {"val": 0, "test": test_size / len(samples)}  # val: a fold
    train, val, test, val_rows = tensor_splits(samples, {}, shares, plan)
    data = Data("digits", Splits(train, val, test), 10, Batching(**batching), inputs=Pixels())
    data.fold_ids = FoldIds(plan.fold, [f"row {i}" for i in val_rows.tolist()])
    return data
