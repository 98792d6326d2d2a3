"""Pixels: uint8 images [C, H, W], normalised from [0, 255] on the device, and what this kind
answers (data/batching/inputs.py): the digits, MNIST, CIFAR-10, image folders and manifests,
image shards, uint8 arrays, synthetic images.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.batching.batches import BatchTransform
from data.batching.inputs import Normalised, example_values, shown_values
from data.images.pixels import decoded, is_crop_pct
from data.tables.inputs import TABLE_EXTENSIONS
from utils.errors import UserError

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}
PIXELS_DTYPE = torch.uint8


@dataclass(frozen=True, kw_only=True)
class Pixels:
    """Images; ``crop_pct``: the centre share evaluation keeps of a larger resize
    (``data.crop_pct``; 1: the whole image)."""

    crop_pct: float = 1.0
    name = "pixels"

    @classmethod
    def claims(cls, record: dict, path: Path) -> Pixels | None:
        """A stored inputs record of images (a shape [C, H, W]), its centre share checked."""
        if len(record["shape"]) != 3:
            return None
        crop_pct = record.get("crop_pct", 1.0)
        if not is_crop_pct(crop_pct):
            raise UserError(
                f"{path}: its inputs record's crop_pct={crop_pct!r} is not a share in [0.1, 1] "
                "(was it edited?)"
            )
        return cls(crop_pct=float(crop_pct))

    def at(self, crop_pct: float) -> Pixels:
        return dataclasses.replace(self, crop_pct=crop_pct)

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
        # What the model takes ([H, W]) and evaluation's centre share: a split held larger
        # (data.cache_size) is cut to it (data/batching/batches.py BatchTransform.fitted).
        view = (tuple(shape)[1:], self.crop_pct) if len(shape) == 3 else None
        return BatchTransform(mean, std, device, augment, channels_last, view)

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
        return {"crop_pct": self.crop_pct} if self.crop_pct != 1.0 else {}

    def following(self, stored: Any) -> Pixels:
        return self  # evaluation's view is this data's own (data.crop_pct)

    def fixed(self, train: Any) -> Pixels:
        return self

    def check_encoded_as(self, stored: Any, source: Any, name: str, use: str, fills: bool) -> None:
        """The shape and the classes say it (data/batching/dataset.py)."""

    def targets_in(self) -> str:
        return "the labels"

    def read_raw(self, path: Path, shape: Sequence[int]) -> tuple[list[str], torch.Tensor, Any]:
        """An image or a folder of images, decoded as an image folder's are: uint8 [N, C, H, W]."""
        if path.is_file() and path.suffix.lower() in TABLE_EXTENSIONS:
            raise UserError(
                f"input={path} is a table, but the checkpoint's model takes images "
                f"of shape {list(shape)}; give an image or a folder"
            )
        files = (
            [path]
            if path.is_file()
            else sorted(
                p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
            )
        )
        if not files:
            extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
            raise UserError(f"input={path}: no image files ({extensions})")
        channels, height, width = shape
        size = (height, width)
        images = torch.stack(
            [decoded(str(f), size, channels, str(f), self.crop_pct) for f in files]
        )
        base = path if path.is_dir() else path.parent
        return [str(f.relative_to(base)) for f in files], images, None

    def front(
        self, model: nn.Module, mean: Sequence[float], std: Sequence[float], shape: Sequence[int]
    ) -> nn.Module:
        return RawPixels(model, mean, std, shape, self.crop_pct)

    def picture(self, samples: torch.Tensor) -> torch.Tensor | None:
        """uint8 pixels as they are; float ones each scaled to its own range; grey repeated
        into RGB; other channel counts (a multispectral stack) have no picture."""
        if samples.shape[1] not in (1, 3):
            return None
        images = samples.float()
        if samples.dtype == torch.uint8:
            images = images / 255
        else:
            low = images.amin(dim=(1, 2, 3), keepdim=True)
            high = images.amax(dim=(1, 2, 3), keepdim=True)
            images = (images - low) / (high - low).clamp(min=1e-12)
        return images.expand(-1, 3, -1, -1).permute(0, 2, 3, 1).clamp(0, 1)

    def shown(self, sample: torch.Tensor) -> str:
        """An image's size and its first values (a picture: utils/run/report.py's grid)."""
        return "image " + "×".join(map(str, sample.shape)) + ": " + shown_values(sample)


class RawPixels(Normalised):
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
