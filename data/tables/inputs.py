"""Rows: feature vectors [F] held in memory, a table's encoded columns (``data=csv``, a
table's shards) or an array's rows (``data=tensors`` of [N, F]), and what this kind answers
(data/batching/inputs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.batching.batches import BatchTransform
from data.batching.inputs import Normalised, RawValues, example_values, shown_values
from data.batching.splits import feature_quantiles
from data.tables.table import Columns, read_table
from utils.errors import UserError

TABLE_EXTENSIONS = {".csv", ".tsv", ".tab"}


@dataclass(frozen=True, kw_only=True)
class Rows:
    """Rows of features. ``table``: a table's column record (data/tables/table.py Columns:
    numbers, categories, gaps, the target; None for an array's rows); ``gapped``: its columns
    with gaps this data filled; ``fixed_rows``: the training rows the model was fitted to, once
    fixed — ``(n,)`` as a checkpoint recorded them (n None before they were) or as a refit
    found them before joining val; ``()``: counted from the train split held."""

    table: dict | None = None
    gapped: frozenset[str] = frozenset()
    fixed_rows: tuple[int | None, ...] = ()
    name = "rows"

    @classmethod
    def claims(cls, record: dict, path: Path) -> Rows | None:
        """A stored inputs record of a table, or of rows of features (a shape [F])."""
        if record["table"] is None and "train_rows" not in record and len(record["shape"]) != 1:
            return None
        if record["table"] is not None:  # its columns must encode exactly the recorded shape
            width = len(Columns.from_record(record["table"]).feature_names)
            if list(record["shape"]) != [width]:
                raise UserError(
                    f"{path}: its inputs record's table encodes {width} features, and its "
                    f"inputs are of shape {list(record['shape'])} (was it edited?)"
                )
        rows = record.get("train_rows")
        if not (rows is None or _count(rows)):
            raise UserError(
                f"{path}: its inputs record's train_rows={str(rows)[:40]} is not a count"
            )
        return cls(table=record["table"], fixed_rows=(rows,))

    def transform(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device,
        *,
        shape: Sequence[int] = (),
        augment: Any = None,
        channels_last: bool = False,
    ) -> BatchTransform:
        return BatchTransform(mean, std, device, augment, channels_last)

    def example(
        self,
        shape: Sequence[int],
        batch: int,
        device: torch.device,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        return example_values(shape, batch, device, generator)

    def model_hints(
        self, shape: Sequence[int], train: Any, mean: Sequence[float], std: Sequence[float]
    ) -> dict[str, Any]:
        """For models/tabular/: each feature's training quantiles (rows held in memory),
        the training rows (those the model is fitted to), and how many features follow the
        numbers (a table's 0/1 columns: one-hot categories and gap flags)."""
        held = _held(train)
        return {
            "feature_quantiles": feature_quantiles(held, mean, std) if held is not None else None,
            "train_rows": self._train_rows(train),
            "indicator_features": _indicators(shape, self.table),
        }

    def builder_hints(self) -> dict[str, Any]:
        return {}

    def record(self) -> dict[str, Any]:
        """The table's record (always written: None for an array's rows), then the training
        rows when known (:meth:`fixed`)."""
        rows = self._train_rows(None)
        return {"table": self.table, **({"train_rows": rows} if rows is not None else {})}

    def following(self, stored: Any) -> Rows:
        """Fitted as the checkpoint ``stored`` recorded (its training rows)."""
        fixed = stored.fixed_rows if isinstance(stored, Rows) and stored.fixed_rows else (None,)
        return Rows(table=self.table, gapped=self.gapped, fixed_rows=fixed)

    def fixed(self, train: Any) -> Rows:
        """The training rows fixed as ``train`` holds them now, unless fixed already: what the
        record writes, and what a refit's model keeps before val joins them (the size the run
        chose)."""
        return Rows(table=self.table, gapped=self.gapped, fixed_rows=(self._train_rows(train),))

    def check_encoded_as(self, stored: Any, source: Any, name: str, use: str, fills: bool) -> None:
        """Refuse a table encoded otherwise (columns, categories, classes) than ``stored``
        recorded, or whose train split fills its gaps with other statistics (unless not
        ``fills``)."""
        theirs = stored.table if isinstance(stored, Rows) else None
        if theirs is None or self.table is None:
            return
        if _encoding(theirs) != _encoding(self.table):
            raise UserError(
                f"{source} was trained on table its columns, categories and classes, and "
                f"{name} holds other ones; {use} on data encoded as it was trained"
            )
        if fills and _gap_fills(theirs, self.gapped) != _gap_fills(self.table, self.gapped):
            raise UserError(
                f"{source} filled a table's gaps with statistics of its own train "
                f"split, and {name}'s train split gives others; {use} with the "
                "train file it was trained on (data.split.test_path=... for new "
                "rows; predict.py fills rows' gaps as training did)"
            )

    def targets_in(self) -> str:
        return f"column {self.table['target']!r}" if self.table else "the labels"

    def read_raw(self, path: Path, shape: Sequence[int]) -> tuple[list[str], torch.Tensor, Any]:
        """A CSV/TSV file's rows, encoded as training encoded its table, with each row's
        categorical values training never saw."""
        if not (path.is_file() and path.suffix.lower() in TABLE_EXTENSIONS) or self.table is None:
            raise UserError(
                f"input={path}: the checkpoint's model takes a table's rows "
                f"({shape[0]} features); give a CSV file"
            )
        header, rows = read_table(path)
        columns = Columns.from_record(self.table)
        features = columns.features(header, rows, path)
        return [str(n) for n in range(1, len(rows) + 1)], features, columns.unseen(header, rows)

    def front(
        self, model: nn.Module, mean: Sequence[float], std: Sequence[float], shape: Sequence[int]
    ) -> nn.Module:
        if self.table is None:  # an array's rows: numbers in their own units
            return RawValues(model, mean, std, shape)
        return RawColumns(model, mean, std, self.table)

    def plain(self, samples: torch.Tensor) -> Any:
        """The rows' numbers as the table was read (missing values NaN where kept so)."""
        return samples.double().numpy()

    def shown(self, sample: torch.Tensor) -> str:
        return shown_values(sample)

    def _train_rows(self, train: Any) -> int | None:
        if self.fixed_rows:  # a checkpoint's, whose model they fitted, or a refit's run's
            return self.fixed_rows[0]
        held = _held(train)
        return int(held.shape[0]) if held is not None else None


def _held(train: Any) -> torch.Tensor | None:
    """The train split's rows [N, F] when it is held in memory; else None (shards)."""
    held = train is not None and train.held == "memory" and train.inputs.dim() == 2
    return train.inputs if held else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63


def _indicators(shape: Sequence[int], table: dict | None) -> int | None:
    """How many of a table's features follow its numbers: the one-hot categories and the gap
    flags, each 0 or 1 (data/tables/table.py ``Columns``: numbers first); None for rows of an
    array."""
    numeric = table.get("numeric") if isinstance(table, dict) else None
    if not isinstance(numeric, list) or len(shape) != 1:
        return None
    return max(0, int(shape[0]) - len(numeric))


def _encoding(table: dict) -> dict:
    """A table record's encoding (columns, categories, classes), less its gaps' fills."""
    return {k: v for k, v in table.items() if k != "na"}


def _gap_fills(table: dict, gapped: frozenset[str]) -> tuple[dict, list]:
    """What a table record says the ``gapped`` columns' gaps were filled with (none before
    data.na existed, or with data.na=error), and its indicators (a fill of no gap is none)."""
    gaps = table.get("na") or {}
    fills = {name: v for name, v in (gaps.get("fills") or {}).items() if name in gapped}
    return fills, gaps.get("indicators") or []


class RawColumns(Normalised):
    """A table's raw columns, float32 [N, K] (number columns with NaN gaps, then categorical
    codes) → the encoding training used (filled, indicators, one-hot, standardised) → outputs."""

    def __init__(self, model: nn.Module, mean: Any, std: Any, table: dict) -> None:
        super().__init__(model, mean, std, 1.0)
        self.numeric = list(table["numeric"])
        self.categories = {name: list(values) for name, values in table["categories"].items()}
        gaps = table.get("na") or {}
        fills = gaps.get("fills") or {}
        self.indicators = list(gaps.get("indicators") or [])
        self.fills_asked = {name: fills[name] for name in self.numeric if name in fills}
        fill = [fills.get(name, float("nan")) for name in self.numeric]
        self.register_buffer("fill", torch.tensor(fill, dtype=torch.float32))
        self.register_buffer("filled", torch.tensor([n in fills for n in self.numeric]))
        at = [self.numeric.index(name) for name in self.indicators]
        self.register_buffer("indicator_at", torch.tensor(at, dtype=torch.long))
        for index, values in enumerate(self.categories.values()):
            self.register_buffer(f"codes_{index}", torch.arange(len(values), dtype=torch.float32))

    def forward(self, columns: torch.Tensor) -> Any:
        count = len(self.numeric)
        numbers = columns[:, :count]
        gaps = torch.isnan(numbers)
        parts = [torch.where(gaps & self.filled, self.fill, numbers)]
        for index in range(len(self.categories)):
            code = columns[:, count + index : count + index + 1]
            parts.append((code == getattr(self, f"codes_{index}")).to(torch.float32))
        if self.indicators:
            parts.append(gaps.index_select(1, self.indicator_at).to(torch.float32))
        outputs = self.model(self.normalised(torch.cat(parts, dim=1)))
        # A gap where training filled none (data.na=error or drop): predict.py refuses such a
        # row, and an exported program cannot, so its outputs are NaN, never a class.
        refused = (gaps & ~self.filled).any(dim=1, keepdim=True)
        return torch.where(refused, torch.nan, outputs) if torch.is_tensor(outputs) else outputs

    def gaps_accepted(self) -> str:
        """Where a NaN is accepted (training filled gaps there) and where not."""
        refused = [name for name in self.numeric if name not in self.fills_asked]
        said = [f"NaN filled inside with {self.fills_asked}"] if self.fills_asked else []
        if refused:
            said.append(
                f"no gap accepted in {refused} (training filled none there, as predict.py "
                "refuses them): a row with a NaN there gets NaN outputs"
            )
        return "; ".join(said)

    def example(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        count = len(self.numeric)  # the columns' own units and spread
        numbers = torch.randn(batch, count, generator=generator)
        numbers = numbers / self.scale[:count] + self.offset[:count]
        holes = torch.rand(batch, len(self.numeric), generator=generator) < 0.2
        numbers = torch.where(holes & self.filled, torch.nan, numbers)  # gaps it can fill
        codes = [
            torch.randint(-1, len(values) + 1, (batch, 1), generator=generator)
            for values in self.categories.values()
        ]
        return torch.cat([numbers, *codes], dim=1).to(torch.float32) if codes else numbers

    def describe(self) -> dict:
        return {
            "kind": "columns",
            "dtype": "float32",
            "shape": ["batch", len(self.numeric) + len(self.categories)],
            "columns": [*self.numeric, *self.categories],
            "numeric": self.numeric,
            "gaps": self.gaps_accepted(),
            "categorical_codes": self.categories,
            "unknown_category": "any other code (e.g. -1): all zeros, as in training",
            "normalised_inside": "filled, indicators added, one-hot, then (x - mean) / std",
        }
