"""What a gap in a table's number column becomes (``data.na`` of ``data=csv``).

    python train.py data=csv data.path=survey.csv data.target=y data.na=median
    python train.py data=csv ... data.na=mean data.na_columns={income: median, visits: constant}
    python train.py data=csv ... data.na=mean data.na_indicator=true      # + a 0/1 column each

A gap is an empty cell or one of :data:`GAP_TOKENS` (``NA``, ``nan``, ``?``, ...). Each number
column has a mode, ``data.na`` unless ``data.na_columns`` names the column:

- ``error`` (the default): refused at the first gap, naming the file, line and column;
- ``drop``: the rows with a gap in such a column are left out, in every split;
- ``mean``, ``median``: filled with the column's mean or median over the train split alone (not
  val, not test: nothing of them leaks into training);
- ``constant``: filled with ``data.na_fill``.

``data.na_indicator=true`` adds a 0/1 column ``<column>=missing`` for each column that has gaps
in the train split, so the model can tell a filled value from a measured one. A categorical
column needs none of this: its empty cell is a category of its own (data/tables/tabular.py). What was
fitted (the fill values, the indicator columns) goes into the checkpoint's table record, so
``predict.py`` fills a row's gaps exactly as training did.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from utils.errors import UserError

log = logging.getLogger("torchloom")

MODES = ("error", "drop", "mean", "median", "constant")
FILLED = ("mean", "median", "constant")
# What a number column's cell may say for "no value" (pandas' defaults, and UCI's "?").
GAP_TOKENS = frozenset(
    {"", "na", "n/a", "nan", "-nan", "null", "none", "?", "#n/a", "<na>", "missing"}
)
NA_KEYS = ("na", "na_columns", "na_fill", "na_indicator")  # conf/data/csv.yaml


def is_gap(text: str) -> bool:
    return text.strip().lower() in GAP_TOKENS


@dataclass
class MissingValues:
    """Each number column's mode (``default`` unless ``columns`` names it), the ``constant`` a
    ``constant`` column is filled with, and whether to add indicator columns; once
    :meth:`fit` has seen the train split, the ``fills`` and the ``indicators``."""

    default: str = "error"
    columns: dict[str, str] = field(default_factory=dict)
    constant: float = 0.0
    indicator: bool = False
    fills: dict[str, float] = field(default_factory=dict)
    indicators: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, options: dict[str, Any], numeric: Sequence[str], path: Path) -> MissingValues:
        """The :data:`NA_KEYS` of a csv loader's ``options`` (configs stored before they existed
        refuse gaps, as then), checked against the table's number columns."""
        default = options.get("na", "error")
        columns = dict(options.get("na_columns") or {})
        constant = options.get("na_fill", 0.0)
        indicator = options.get("na_indicator", False)
        for key, mode in [("data.na", default)] + [
            (f"data.na_columns.{c}", m) for c, m in columns.items()
        ]:
            if mode not in MODES:
                raise UserError(f"{key}={mode!r}: choose one of {', '.join(MODES)}")
        unknown = [name for name in columns if name not in numeric]
        if unknown:
            raise UserError(
                f"data.na_columns names {unknown[0]!r}, which is not a number feature "
                f"column of {path} (they are {', '.join(numeric[:10])}); a "
                "categorical column's empty cell is a category of its own"
            )
        if not _finite(constant):  # finite where it lives: a float32 feature
            raise UserError(
                f"data.na_fill={constant!r}: give a finite number a float32 holds "
                f"(at most {FLOAT32_MAX:.3g} in size)"
            )
        if not isinstance(indicator, bool):
            raise UserError(f"data.na_indicator={indicator!r}: give true or false")
        return cls(
            str(default), {str(k): str(v) for k, v in columns.items()}, float(constant), indicator
        )

    def mode(self, column: str) -> str:
        return self.columns.get(column, self.default)

    def refused(self, column: str, path: Path, line: int, text: str) -> UserError:
        shown = repr(text.strip()) if text.strip() else "empty"
        return UserError(
            f"{path} line {line}, column {column!r}: {shown} is a missing value; "
            "fill it, or choose what gaps become: data.na=mean|median|constant|drop "
            f"(or data.na_columns={{{column}: median}})"
        )

    def fit(self, features: torch.Tensor, numeric: Sequence[str], path: Path) -> None:
        """The fill values and indicator columns, from the train split's number columns
        (``features[:, :len(numeric)]``, NaN at the gaps)."""
        self.fills, self.indicators = {}, []
        for index, name in enumerate(numeric):
            values = features[:, index]
            gaps = torch.isnan(values)
            if bool(gaps.all()):
                raise UserError(
                    f"{path}: column {name!r} is empty in every train row; leave it "
                    "out of data.features"
                )
            mode = self.mode(name)
            if mode in FILLED:  # also for a column with no gaps here: val, test or predict's may
                self.fills[name] = fill_value(values[~gaps].double(), mode, self.constant)
            if self.indicator and mode != "drop" and bool(gaps.any()):
                self.indicators.append(name)
        gapped = [
            name
            for index, name in enumerate(numeric)
            if name in self.fills and bool(torch.isnan(features[:, index]).any())
        ]
        if gapped:  # the columns that had gaps here, not every column a fill was fitted for
            shown = ", ".join(f"{name}={self.fills[name]:.4g}" for name in gapped[:6])
            shown += ", ..." if len(gapped) > 6 else ""
            log.info(
                "%s: gaps filled from the train split (%s)%s",
                path.name,
                shown,
                f"; indicator columns for {', '.join(self.indicators)}" if self.indicators else "",
            )

    def apply(
        self, features: torch.Tensor, numeric: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(features with the gaps filled and the indicator columns appended, the rows kept):
        the rows a ``drop`` column has a gap in are not kept. Gaps in a column the train split
        had none in are filled with its fitted value too."""
        gaps = torch.isnan(features[:, : len(numeric)])
        keep = torch.ones(len(features), dtype=torch.bool)
        filled = features.clone()
        for index, name in enumerate(numeric):
            if self.mode(name) == "drop":
                keep &= ~gaps[:, index]
            elif name in self.fills:
                filled[gaps[:, index], index] = self.fills[name]
        columns = [gaps[:, numeric.index(name)].float()[:, None] for name in self.indicators]
        return torch.cat([filled, *columns], dim=1) if columns else filled, keep

    def record(self) -> dict:
        """What :meth:`from_record` rebuilds the fitted gaps from (the table record keeps it)."""
        return {
            "default": self.default,
            "columns": self.columns,
            "constant": self.constant,
            "fills": self.fills,
            "indicators": self.indicators,
        }

    @classmethod
    def from_record(cls, record: Any, numeric: Sequence[str]) -> MissingValues:
        """A checkpoint's gaps record (untrusted: checked against the table's ``numeric``
        columns: a fill for every column whose mode fills, indicators of those columns only);
        a table recorded before gaps could be filled refuses them, as it did."""
        if record is None:
            return cls()
        try:
            ok = (
                record["default"] in MODES
                and isinstance(record["columns"], dict)
                and all(isinstance(k, str) and m in MODES for k, m in record["columns"].items())
                and _finite(record["constant"])
                and isinstance(record["fills"], dict)
                and all(isinstance(k, str) and _finite(v) for k, v in record["fills"].items())
                and isinstance(record["indicators"], list)
                and all(isinstance(name, str) for name in record["indicators"])
                and set(record["columns"]) <= set(numeric)
                and set(record["fills"]) <= set(numeric)
                and len(set(record["indicators"])) == len(record["indicators"])
                and set(record["indicators"]) <= set(numeric)
                and all(
                    name in record["fills"]
                    for name in numeric
                    if record["columns"].get(name, record["default"]) in FILLED
                )
            )
        except (KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise UserError(
                "the checkpoint's table record of missing values is not what "
                "torchloom writes (was it edited?)"
            )
        return cls(
            record["default"],
            dict(record["columns"]),
            float(record["constant"]),
            bool(record["indicators"]),
            dict(record["fills"]),
            list(record["indicators"]),
        )


def fill_value(known: torch.Tensor, mode: str, constant: float) -> float:
    """What a ``mode`` column's gaps become, from its ``known`` train values."""
    if mode == "mean":
        return float(known.mean())
    return float(known.quantile(0.5)) if mode == "median" else constant


FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # features live in float32


def _finite(value: Any) -> bool:
    """A number that stays finite as a float32 feature (1e39 is finite only in float64)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= FLOAT32_MAX
    )
