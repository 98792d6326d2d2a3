"""ImageNet-style augmentation of a training batch, per sample and batched, on the batch's
device (``data.augment.random_resized_crop``, ``color_jitter``, ``random_erasing``).

Each operation draws its parameters for every sample at once from the batch's generator (seeded
by (seed, epoch, batch, rank): a resume sees the same draws), and applies them as tensor ops —
no loop over the samples in Python. Each follows torchvision's definition of the operation
(tested against it on fixed parameters):

- ``random_resized_crop``: a box of ``scale`` × the image's area and aspect ratio in ``ratio``
  (log-uniform), drawn as torchvision's ``RandomResizedCrop.get_params`` draws it (ten tries,
  then the centre crop of the nearest ratio), resized back to the image's size bilinearly
  (``torchvision.transforms.functional.resized_crop``, ``antialias=False``);
- ``color_jitter``: brightness, contrast and saturation factors drawn in
  ``[max(0, 1 - s), 1 + s]`` and applied in that order on the pixels in [0, 1] (torchvision's
  ``adjust_*``; its ColorJitter shuffles the order per image, here it is fixed);
- ``random_erasing``: with that probability, a box of 2%–33% of the area and aspect ratio in
  [0.3, 3.3] filled with per-pixel normal noise (timm's ``--remode pixel``), on the normalised
  image.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from utils.errors import UserError

log = logging.getLogger("torchloom")
TRIES = 10  # boxes drawn per sample before the centre crop (torchvision's)
# data.augment's keys of this kind as conf/data/*.yaml leave them: off (a config stored before
# they existed compares as holding these, utils/run/resume_changes.py)
IMAGE_AUGMENT_OFF = {
    "random_resized_crop": False,
    "scale": [0.08, 1.0],
    "ratio": [0.75, 1.3333],
    "color_jitter": 0.0,
    "random_erasing": 0.0,
}
ERASE_SCALE, ERASE_RATIO = (0.02, 1 / 3), (0.3, 3.3)  # torchvision's RandomErasing defaults


@dataclass(frozen=True)
class ImageAugment:
    """What a training batch's images get: the padded random crop and the flip
    (``crop_padding``, ``horizontal_flip``, data/batching/batches.py), then this module's."""

    crop_padding: int = 0
    horizontal_flip: bool = False
    random_resized_crop: bool = False
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    color_jitter: float = 0.0
    random_erasing: float = 0.0

    @classmethod
    def from_augment(
        cls, augment: Mapping[str, Any], shape: Sequence[int] = (3, 1, 1), name: str = ""
    ) -> ImageAugment:
        """``data.augment``'s keys of this kind (absent: off), checked in one line each
        against the inputs' ``shape`` (images only), and said at start-up."""
        scale = tuple(augment.get("scale") or (0.08, 1.0))
        ratio = tuple(augment.get("ratio") or (3 / 4, 4 / 3))
        if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
            raise UserError(f"data.augment.scale={list(scale)} must be [low, high] in (0, 1]")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise UserError(f"data.augment.ratio={list(ratio)} must be [low, high] above 0")
        jitter = float(augment.get("color_jitter") or 0.0)
        erasing = float(augment.get("random_erasing") or 0.0)
        if not 0 <= jitter <= 1:
            raise UserError(f"data.augment.color_jitter={jitter} must be in [0, 1]")
        if not 0 <= erasing <= 1:
            raise UserError(f"data.augment.random_erasing={erasing} must be a probability")
        rrc = bool(augment.get("random_resized_crop") or False)
        made = cls(0, False, rrc, scale, ratio, jitter, erasing)
        if made.on and len(shape) != 3:
            raise UserError(
                f"data.augment: {', '.join(made.said())} augment images, and {name}'s "
                f"inputs are {tuple(shape)}, not (C, H, W); turn them off"
            )
        if made.on:
            log.info("data.augment: %s, per image, on the device", ", ".join(made.said()))
        return made

    @property
    def on(self) -> bool:
        """Whether any of this module's operations is on (the crop and flip aside)."""
        return self.random_resized_crop or self.color_jitter > 0 or self.random_erasing > 0

    def said(self) -> list[str]:
        parts = []
        if self.random_resized_crop:
            parts.append(f"random_resized_crop scale={list(self.scale)}")
        if self.color_jitter:
            parts.append(f"color_jitter={self.color_jitter}")
        if self.random_erasing:
            parts.append(f"random_erasing={self.random_erasing}")
        return parts


def crop_boxes(
    count: int, size: tuple[int, int], scale: Sequence, ratio: Sequence, generator: Any
) -> torch.Tensor:
    """[count, 4] boxes (top, left, height, width) as torchvision's RandomResizedCrop draws
    them: ``TRIES`` draws of an area and a log-uniform aspect ratio each, the first that fits;
    else the centre crop of the aspect ratio nearest the image's within ``ratio``."""
    height, width = size
    device = generator.device
    area = height * width
    shape = (count, TRIES)
    target = area * torch.empty(shape, device=device).uniform_(
        scale[0], scale[1], generator=generator
    )
    logs = (math.log(ratio[0]), math.log(ratio[1]))
    aspect = torch.exp(torch.empty(shape, device=device).uniform_(*logs, generator=generator))
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.where(
        fits.any(1), fits.float().argmax(1), torch.full((count,), -1, device=device)
    )
    u_top = torch.rand(shape, device=device, generator=generator)
    u_left = torch.rand(shape, device=device, generator=generator)
    rows = torch.arange(count, device=device)
    pick = first.clamp(min=0)
    h, w = h[rows, pick], w[rows, pick]
    top = torch.floor(u_top[rows, pick] * (height - h + 1))
    left = torch.floor(u_left[rows, pick] * (width - w + 1))
    # the fallback: the whole image cut to the nearest allowed aspect ratio, centred
    whole = width / height
    if whole < ratio[0]:
        fw, fh = width, round(width / ratio[0])
    elif whole > ratio[1]:
        fh, fw = height, round(height * ratio[1])
    else:
        fw, fh = width, height
    fallback = torch.tensor(
        [(height - fh) // 2, (width - fw) // 2, fh, fw], device=device, dtype=h.dtype
    )
    boxes = torch.stack([top, left, h, w], dim=1)
    return torch.where((first < 0).view(-1, 1), fallback, boxes)


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Each image's box resized to ``size``, bilinearly as torchvision's ``resized_crop``
    (crop, then ``interpolate`` with ``align_corners=False``, no antialias), as one
    ``grid_sample`` over the batch."""
    n, _, height, width = images.shape
    out_h, out_w = size
    top, left, h, w = (boxes[:, k].to(images.dtype).view(n, 1) for k in range(4))
    dst_y = torch.arange(out_h, device=images.device, dtype=images.dtype).view(1, -1)
    dst_x = torch.arange(out_w, device=images.device, dtype=images.dtype).view(1, -1)
    # a source coordinate inside the crop, clamped to its pixels (as resizing the crop alone)
    src_y = (top + ((dst_y + 0.5) * h / out_h - 0.5).clamp(min=0)).minimum(top + h - 1)
    src_x = (left + ((dst_x + 0.5) * w / out_w - 0.5).clamp(min=0)).minimum(left + w - 1)
    grid_y = (2 * src_y + 1) / height - 1  # pixel centres → grid_sample's [-1, 1]
    grid_x = (2 * src_x + 1) / width - 1
    grid = torch.stack(
        (
            grid_x.view(n, 1, out_w).expand(n, out_h, out_w),
            grid_y.view(n, out_h, 1).expand(n, out_h, out_w),
        ),
        dim=-1,
    )
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def jittered(pixels: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``pixels`` in [0, 1] with per-sample brightness, contrast and saturation ``factors``
    [N, 3], in that order, as torchvision's ``adjust_brightness``, ``adjust_contrast`` and
    ``adjust_saturation`` (grey images: saturation leaves them as they are)."""
    n = len(pixels)
    brightness, contrast, saturation = (factors[:, k].view(n, 1, 1, 1) for k in range(3))
    pixels = (pixels * brightness).clamp(0, 1)
    mean = _grey(pixels).mean(dim=(1, 2, 3), keepdim=True)
    pixels = (contrast * pixels + (1 - contrast) * mean).clamp(0, 1)
    if pixels.shape[1] == 3:
        pixels = (saturation * pixels + (1 - saturation) * _grey(pixels)).clamp(0, 1)
    return pixels


def _grey(pixels: torch.Tensor) -> torch.Tensor:
    if pixels.shape[1] == 1:
        return pixels
    r, g, b = pixels.unbind(dim=1)
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(1)


def erase_boxes(count: int, size: tuple[int, int], generator: Any) -> torch.Tensor:
    """[count, 4] boxes (top, left, height, width) of 2%–33% of the area, aspect ratio in
    [0.3, 3.3] log-uniform, ``TRIES`` draws each (torchvision's RandomErasing); a sample none
    fits gets an empty box."""
    height, width = size
    device = generator.device
    shape = (count, TRIES)
    area = (
        height
        * width
        * torch.empty(shape, device=device).uniform_(*ERASE_SCALE, generator=generator)
    )
    logs = (math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1]))
    aspect = torch.exp(torch.empty(shape, device=device).uniform_(*logs, generator=generator))
    h = torch.round(torch.sqrt(area * aspect))
    w = torch.round(torch.sqrt(area / aspect))
    fits = (h < height) & (w < width) & (h > 0) & (w > 0)
    pick = fits.float().argmax(1)
    rows = torch.arange(count, device=device)
    h = torch.where(fits.any(1), h[rows, pick], 0)
    w = torch.where(fits.any(1), w[rows, pick], 0)
    top = torch.floor(torch.rand(count, device=device, generator=generator) * (height - h + 1))
    left = torch.floor(torch.rand(count, device=device, generator=generator) * (width - w + 1))
    return torch.stack([top, left, h, w], dim=1)


def erased(
    images: torch.Tensor, boxes: torch.Tensor, chosen: torch.Tensor, generator: Any
) -> torch.Tensor:
    """The ``chosen`` images with their box filled by normal noise (normalised images)."""
    n, _, height, width = images.shape
    rows = torch.arange(height, device=images.device).view(1, height, 1)
    cols = torch.arange(width, device=images.device).view(1, 1, width)
    top, left, h, w = (boxes[:, k].view(n, 1, 1) for k in range(4))
    inside = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)
    inside &= chosen.view(n, 1, 1)
    noise = torch.randn(images.shape, device=images.device, generator=generator, dtype=images.dtype)
    return torch.where(inside.unsqueeze(1), noise, images)


def augmented(
    images: torch.Tensor,
    augment: ImageAugment,
    mean: torch.Tensor,
    std: torch.Tensor,
    generator: Any,
) -> torch.Tensor:
    """Normalised ``images`` [N, C, H, W] through ``augment``'s operations, each sample its
    own parameters from ``generator``: the crop, then the colours (on the pixels in [0, 1]),
    then the erasing."""
    n, _, height, width = images.shape
    if augment.random_resized_crop:
        boxes = crop_boxes(n, (height, width), augment.scale, augment.ratio, generator)
        images = resized_crops(images, boxes, (height, width))
    if augment.color_jitter:
        s = augment.color_jitter
        factors = torch.empty(n, 3, device=images.device).uniform_(
            max(0.0, 1 - s), 1 + s, generator=generator
        )
        scale, shift = std.view(1, -1, 1, 1), mean.view(1, -1, 1, 1)
        images = (jittered(images * scale + shift, factors) - shift) / scale
    if augment.random_erasing:
        chosen = torch.rand(n, device=images.device, generator=generator) < augment.random_erasing
        images = erased(images, erase_boxes(n, (height, width), generator), chosen, generator)
    return images
