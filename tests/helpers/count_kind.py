"""A fifth kind of input, written in this one file: word counts per document, int64 [F], which
the model takes as log(1 + count) normalised per feature. tests/test_a_new_kind.py registers
it (data/kinds.py's one line) and runs it through train.py, the checkpoint's record, a file
read for predict.py and an export's front: no module of torchloom changes for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.batching.batches import BatchTransform
from data.batching.dataset import Batching, Data, Splits
from data.batching.inputs import Normalised, example_values, shown_values
from data.batching.splits import TensorSplit, holdout
from utils.errors import UserError


class LogCounts(BatchTransform):
    """Counts on the device as log(1 + count), then (x - mean) / std per feature."""

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        logs = torch.log1p(images.to(self.device).to(torch.float32))
        return (logs - self.mean) / self.std


@dataclass(frozen=True, kw_only=True)
class Counts:
    """Documents as counts of the words of ``vocabulary``."""

    vocabulary: tuple[str, ...]
    name = "counts"

    @classmethod
    def claims(cls, record: dict, path: Path) -> Counts | None:
        words = record.get("vocabulary")
        if words is None:
            return None
        if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
            raise UserError(f"{path}: its vocabulary is not a list of words (was it edited?)")
        return cls(vocabulary=tuple(words))

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
        return LogCounts(mean, std, device, augment)

    def example(
        self,
        shape: Sequence[int],
        batch: int,
        device: torch.device,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        return example_values(shape, batch, device, generator)

    def model_hints(self, shape: Any, train: Any, mean: Any, std: Any) -> dict[str, Any]:
        return {}

    def builder_hints(self) -> dict[str, Any]:
        return {}

    def record(self) -> dict[str, Any]:
        return {"vocabulary": list(self.vocabulary)}

    def following(self, stored: Any) -> Counts:
        return self

    def fixed(self, train: Any) -> Counts:
        return self

    def check_encoded_as(self, stored: Any, source: Any, name: str, use: str, fills: bool) -> None:
        if isinstance(stored, Counts) and stored.vocabulary != self.vocabulary:
            raise UserError(f"{source} counted other words than {name}; {use} on its words")

    def targets_in(self) -> str:
        return "the labels"

    def read_raw(self, path: Path, shape: Sequence[int]) -> tuple[list[str], torch.Tensor, Any]:
        """A text file of one document's counts a line, separated by spaces."""
        lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
        counts = torch.tensor([[int(v) for v in line] for line in lines], dtype=torch.long)
        return [str(n) for n in range(1, len(lines) + 1)], counts, None

    def front(self, model: nn.Module, mean: Any, std: Any, shape: Any) -> nn.Module:
        return RawCounts(model, mean, std)

    def shown(self, sample: torch.Tensor) -> str:
        return "counts " + shown_values(sample)


class RawCounts(Normalised):
    """int64 counts [N, F] → log(1 + count), normalised → the model's outputs."""

    def __init__(self, model: nn.Module, mean: Any, std: Any) -> None:
        super().__init__(model, mean, std, 1.0)

    def forward(self, counts: torch.Tensor) -> Any:
        return self.model(self.normalised(torch.log1p(counts.to(torch.float32))))


def load_counts(
    num_samples: int, shape: Sequence[int], num_classes: int, noise: float, seed: int, **options
) -> Data:
    """conf/data/synthetic.yaml's keys: documents of ``shape[-1]`` word counts, each class
    with words of its own more frequent."""
    val_size, test_size = options.pop("val_size"), options.pop("test_size")
    options.pop("mean"), options.pop("std")
    words = shape[-1]
    generator = torch.Generator().manual_seed(seed)
    rates = 0.5 + 4 * torch.rand(num_classes, words, generator=generator)
    total = num_samples + val_size + test_size
    labels = torch.randint(0, num_classes, (total,), generator=generator)
    counts = torch.poisson(rates[labels], generator=generator).long()
    train, val, test = holdout(TensorSplit(counts, labels), [val_size, test_size], seed)
    logs = torch.log1p(train.inputs.float())
    mean, std = logs.mean(0).tolist(), logs.std(0).clamp_min(1e-3).tolist()
    vocabulary = Counts(vocabulary=tuple(f"word{i}" for i in range(words)))
    batching = Batching(mean=mean, std=std, **options)
    splits = Splits(train, val, test)
    return Data("counts", splits, num_classes, batching, inputs=vocabulary)
