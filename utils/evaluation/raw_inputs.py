"""What an export takes: the inputs a user has, not the tensors training made of them.

An exported program (.pt2, .onnx) holds its data's preparation in front of the model, so code
that knows nothing of torchloom can feed it:

- images: ``uint8`` pixels ``[N, C, H, W]`` at the trained size (grey: C = 1; colour: RGB),
  scaled by 1/255 and normalised with the recorded per-channel mean and std inside;
- a table: ``float32`` ``[N, K]``, the raw columns in :meth:`RawColumns.describe`'s order: each
  number column as it is in the file, a gap as NaN (filled as training filled it, with its
  0/1 indicator where training added one), then each categorical column as the integer code
  of its value in the recorded vocabulary (any other code: a value training never saw, all
  zeros, as predict.py encodes it); standardised inside;
- anything else (sequences, arrays): ``float32`` in the data's own units, normalised inside.

Each wrapper says what it takes (:meth:`describe`, the export's metadata) and draws example
inputs of that kind for the export's parity check (:meth:`example`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from data.text.tokenizer import from_record

PIXELS_DTYPE = torch.uint8


class _Normalised(nn.Module):
    """``model`` behind the normalisation per channel (per feature for rows), x·scale + shift
    with the float32 constants and in the order training's batches are normalised
    (data/batching/batches.py BatchTransform): an export computes what predict.py computes,
    to the bit where the runtime does, so a model that is steep somewhere in its inputs (a
    table's bins) gives the same outputs."""

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


class RawPixels(_Normalised):
    """uint8 pixels [N, C, H, W] → the model's outputs."""

    def __init__(
        self,
        model: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        shape: Any,
        crop_pct: float = 1.0,
    ):
        super().__init__(model, mean, std, 255.0)
        self.shape = tuple(shape)
        self.crop_pct = crop_pct  # said in describe(): how an image reaches this size

    def forward(self, pixels: torch.Tensor) -> Any:
        return self.model(self.normalised(pixels.to(torch.float32)))

    def example(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(0, 256, (batch, *self.shape), generator=generator).to(PIXELS_DTYPE)

    def describe(self) -> dict:
        channels = {1: "grey", 3: "RGB"}.get(self.shape[0], f"{self.shape[0]} channels")
        return {
            "kind": "pixels",
            "dtype": "uint8",
            "shape": ["batch", *self.shape],
            "layout": f"NCHW, {channels}, {self.shape[1]}x{self.shape[2]} (the trained size)",
            "resize": (
                "bilinear to the trained size"
                if self.crop_pct == 1.0
                else f"bilinear to the trained size / {self.crop_pct} (rounded down), then the "
                "centre at the trained size"
            ),
            "normalised_inside": "x / 255, then (x - mean) / std per channel",
        }


class RawValues(_Normalised):
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


class RawColumns(_Normalised):
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


class RawTokens(nn.Module):
    """Token ids [N, L] and their mask [N, L] (int64, 1 for a token, texts padded on the right
    with ``pad_id``) → the model's outputs. The export's record carries the tokenizer's JSON,
    ``max_length`` and ``pad_id``, so a program that imports nothing of torchloom tokenizes
    with ``tokenizers`` alone as predict.py does (data/text/dataset.py)."""

    input_names = ("ids", "mask")

    def __init__(self, model: nn.Module, text: dict) -> None:
        super().__init__()
        self.model, self.text = model, text
        tokenizer = from_record(text, "the checkpoint")  # checked: size, sha256, pad id
        self.vocab_size, self.pad_id = tokenizer.vocab_size, tokenizer.pad_id
        self.max_length = tokenizer.max_length

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> Any:
        return self.model(ids, mask)

    def example(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` texts of 1 to L tokens, L growing with the batch (the length is dynamic)."""
        length = min(self.max_length, 3 + 2 * batch)
        ids = torch.randint(0, self.vocab_size, (batch, length), generator=generator)
        held = torch.randint(1, length + 1, (batch, 1), generator=generator)
        mask = (torch.arange(length).view(1, -1) < held).long()
        return ids.masked_fill(mask == 0, self.pad_id), mask

    def describe(self) -> dict:
        return {
            "kind": "tokens",
            "dtype": "int64",
            "shape": ["batch", "length"],
            "inputs": "ids and mask, int64 [batch, length]: the tokenizer's ids (special tokens "
            "as its post-processor adds them, cut at max_length), padded on the right with "
            "pad_id; mask 1 for a token, 0 for padding",
        }


def raw_inputs(model: nn.Module, record: Any, pixels: bool) -> nn.Module:
    """``model`` behind the preparation of what its inputs ``record`` says it was trained on
    (utils/checkpoint/record.py InputRecord): pixels when ``pixels`` (uint8 data), a table's
    columns when it has a table record, else values in their own units."""
    if getattr(record, "text", None) is not None:
        return RawTokens(model, record.text)
    if record.table is not None:
        return RawColumns(model, record.mean, record.std, record.table)
    if pixels:
        return RawPixels(model, record.mean, record.std, record.input_shape, record.crop_pct)
    return RawValues(model, record.mean, record.std, record.input_shape)
