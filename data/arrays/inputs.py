"""Values: float inputs in their own units that are neither a table's rows nor pixels —
sequences [C, L] (``model=cnn1d``), float images, any array of two or more axes
(``data=tensors``) — and what this kind answers (data/batching/inputs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.batching.batches import BatchTransform
from data.batching.inputs import RawValues, example_values, shown_values
from utils.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Values:
    """Numbers in their own units, normalised per channel."""

    name = "values"

    @classmethod
    def claims(cls, record: dict, path: Path) -> Values:
        """Any stored inputs record no other kind claims (the last in data/kinds.py)."""
        return cls()

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
        return {}

    def builder_hints(self) -> dict[str, Any]:
        return {}

    def record(self) -> dict[str, Any]:
        return {}

    def following(self, stored: Any) -> Values:
        return self

    def fixed(self, train: Any) -> Values:
        return self

    def check_encoded_as(self, stored: Any, source: Any, name: str, use: str, fills: bool) -> None:
        """The shape and the targets say it (data/batching/dataset.py)."""

    def targets_in(self) -> str:
        return "the labels"

    def read_raw(self, path: Path, shape: Sequence[int]) -> tuple[list[str], torch.Tensor, Any]:
        raise UserError(
            f"input={path}: the checkpoint's model takes arrays of shape {list(shape)}, which "
            "predict.py does not read from files; evaluate.py scores them (data.path=...), and "
            "an export (export=model.pt2) takes them as float32"
        )

    def front(
        self, model: nn.Module, mean: Sequence[float], std: Sequence[float], shape: Sequence[int]
    ) -> nn.Module:
        return RawValues(model, mean, std, shape)

    def shown(self, sample: torch.Tensor) -> str:
        return shown_values(sample)
