"""What every kind of input answers, so that nothing outside a kind's own folder asks which
kind it holds.

A kind of input (pixels, rows, tokens, values) is one class in its family's ``inputs.py``
(data/images/, data/tables/, data/text/, data/arrays/), registered once in data/kinds.py. A
dataset builder hands its :class:`data.batching.dataset.Data` one (``Data.inputs``); a
checkpoint's inputs record reads one back (utils/checkpoint/record.py). Everything else —
batches, the model's builder, the shape checks and the tuning, the checkpoint, predict.py,
the exports, what a person is shown — asks it, never the kind:

    claims(record, path)               a stored inputs record read back as this kind, if it is
    transform(mean, std, device, ...)  how its batches are moved and normalised on the device
    example(shape, batch, device, ...)  an example batch of what the model takes
    model_hints(shape, train, mean, std)  what it hands a model's builder (HINTS)
    builder_hints()                    what it hands the data builder of a run it resumes
    record()                           its part of a checkpoint's inputs record
    following(stored) / fixed(train)   fitted as a checkpoint recorded it / as ``train`` is now
    check_encoded_as(stored, ...)      data encoded otherwise than ``stored`` refused
    targets_in()                       where its targets were read, for a message
    read_raw(path, shape)              predict.py's inputs of that kind, read from a file
    front(model, mean, std, shape)     what an export takes, in front of the model
    shown(sample)                      one sample as a person reads it (a snippet, a row)

and two questions a kind answers only where it has an answer (:func:`picture_of`,
:func:`plain_of`; a kind without them has none, as a new kind starts):

    picture(samples)                   samples as a person sees them (a report's image grid)
    plain(samples)                     samples as a simple model reads them (a baseline's)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from data.batching.batches import BatchTransform

# What a model's builder may take from the data besides ``input_shape`` and the output's width,
# each None where the kind has none (utils/model/modules.py passes those the builder names).
HINTS = ("feature_quantiles", "train_rows", "indicator_features", "vocab_size", "pad_id")


class Inputs(Protocol):
    """What a kind of input answers (see the module's docstring)."""

    name: str  # pixels, rows, tokens or values: how the exports and messages name it

    @classmethod
    def claims(cls, record: dict, path: Path) -> Inputs | None:
        """This kind read from a checkpoint's checked inputs ``record`` (its own part checked
        as untrusted data), or None when the record is another kind's."""
        ...

    def transform(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device,
        *,
        shape: Sequence[int] = (),
        augment: Any = None,
        channels_last: bool = False,
    ) -> BatchTransform: ...

    def example(
        self,
        shape: Sequence[int],
        batch: int,
        device: torch.device,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor: ...

    def model_hints(
        self, shape: Sequence[int], train: Any, mean: Sequence[float], std: Sequence[float]
    ) -> dict[str, Any]: ...

    def builder_hints(self) -> dict[str, Any]: ...

    def record(self) -> dict[str, Any]: ...

    def following(self, stored: Inputs) -> Inputs: ...

    def fixed(self, train: Any) -> Inputs: ...

    def check_encoded_as(
        self, stored: Inputs, source: Any, name: str, use: str, fills: bool
    ) -> None: ...

    def targets_in(self) -> str: ...

    def read_raw(self, path: Path, shape: Sequence[int]) -> tuple[list[str], torch.Tensor, Any]: ...

    def front(
        self, model: nn.Module, mean: Sequence[float], std: Sequence[float], shape: Sequence[int]
    ) -> nn.Module: ...

    def shown(self, sample: torch.Tensor) -> str: ...


def picture_of(inputs: Inputs, samples: torch.Tensor) -> torch.Tensor | None:
    """Samples as held [N, ...] as RGB pictures [N, H, W, 3] in [0, 1] (a report's grid), by
    their kind's ``picture``; None where the kind has none (a sample is read, not seen: it is
    shown by ``shown``)."""
    picture = getattr(inputs, "picture", None)
    return picture(samples) if picture is not None else None


def plain_of(inputs: Inputs, samples: torch.Tensor) -> Any:
    """Samples as scikit-learn's simple models read them (utils/evaluation/baselines.py), by
    their kind's ``plain``: rows of numbers [N, F] for a table, a list of texts for texts;
    None where no simple model applies (images, arrays, a corpus, a kind without ``plain``)."""
    plain = getattr(inputs, "plain", None)
    return plain(samples) if plain is not None else None


def example_values(
    shape: Sequence[int], batch: int, device: torch.device, generator: torch.Generator | None
) -> torch.Tensor:
    """A batch of normalised floats: zeros (a shape check's), or standard normal draws of
    ``generator`` (a tuning's, a guard's)."""
    if generator is None:
        return torch.zeros(batch, *shape, device=device)
    return torch.randn(batch, *shape, device=device, generator=generator)


def shown_values(sample: torch.Tensor, most: int = 8) -> str:
    """A sample's first ``most`` values, as a person reads them."""
    values = sample.flatten().tolist()
    more = f" … ({len(values)} values)" if len(values) > most else ""
    return " ".join(f"{v:.3g}" for v in values[:most]) + more


class Normalised(nn.Module):
    """An export's front (:meth:`Inputs.front`): ``model`` behind the normalisation per channel
    (per feature for rows), x·scale + shift with the float32 constants and in the order
    training's batches are normalised (data/batching/batches.py BatchTransform): an export
    computes what predict.py computes, to the bit where the runtime does, so a model that is
    steep somewhere in its inputs (a table's bins) gives the same outputs. Each front says what
    it takes (``describe()``, the export's metadata), what else the export carries
    (``carries()``) and draws example inputs of its kind for the parity check (``example``)."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float], unit: float):
        super().__init__()
        self.model = model
        std_t = torch.tensor(list(std), dtype=torch.float32)
        mean_t = torch.tensor(list(mean), dtype=torch.float32)
        self.register_buffer("scale", 1.0 / (unit * std_t))
        self.register_buffer("shift", -mean_t / std_t)
        self.register_buffer("offset", unit * mean_t)  # the mean in the inputs' units

    def normalised(self, x: torch.Tensor) -> torch.Tensor:
        per_channel = (1, -1) + (1,) * (x.dim() - 2)
        return x * self.scale.view(per_channel) + self.shift.view(per_channel)

    def carries(self) -> dict:
        """What the export's metadata holds besides what it takes: nothing, for numbers."""
        return {}


class RawValues(Normalised):
    """float32 values in the data's own units (sequences [N, C, L], arrays) → outputs."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float], shape: Any):
        super().__init__(model, mean, std, 1.0)
        self.shape = tuple(shape)

    def forward(self, values: torch.Tensor) -> Any:
        return self.model(self.normalised(values))

    def example(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        per_channel = (1, -1) + (1,) * (len(self.shape) - 1)  # the data's own units and spread
        noise = torch.randn(batch, *self.shape, generator=generator)
        return noise / self.scale.view(per_channel) + self.offset.view(per_channel)

    def describe(self) -> dict:
        return {
            "kind": "values",
            "dtype": "float32",
            "shape": ["batch", *self.shape],
            "normalised_inside": "(x - mean) / std per channel",
        }
