"""ImageNet-style augmentation of a training batch, per sample and batched, on the batch's
device (``data.augment.random_resized_crop``, ``color_jitter``, ``random_erasing``).

Each operation draws its parameters for every sample at once (:class:`Draws`: a pure function
of (seed, epoch, the sample's index in its split), so a resume, another number of processes or
of workers all see the same augmented samples), and applies them as tensor ops — no loop over
the samples in Python. Each follows torchvision's definition of the operation
(tested against it on fixed parameters):

- ``random_resized_crop``: a box of ``scale`` × the image's area and aspect ratio in ``ratio``
  (log-uniform), drawn as torchvision's ``RandomResizedCrop.get_params`` draws it (ten tries,
  then the centre crop of the nearest ratio), resized back to the image's size bilinearly
  (``torchvision.transforms.functional.resized_crop``, ``antialias=False``);
- ``color_jitter``: brightness, contrast and saturation factors drawn in
  ``[max(0, 1 - s), 1 + s]`` and applied in that order on the pixels in [0, 1] (torchvision's
  ``adjust_*``; its ColorJitter shuffles the order per image, here it is fixed);
- ``auto_augment``: RandAugment (timm's policy strings) or TrivialAugment, per sample
  (data/augmentation/policies.py), after the crop and before the colour jitter;
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

from data.augmentation.policies import Policy, apply
from utils.errors import UserError
from utils.system.seeding import mix_seed

log = logging.getLogger("torchloom")
MASK = 0xFFFFFFFF  # the draws' integers are 32-bit, held in int64 (no overflow anywhere)
HASH = 0x45D9F3B  # a 32-bit integer hash's multiplier (27 bits: products stay below 2**59)
TRIES = 10  # boxes drawn per sample before the centre crop (torchvision's)
# data.augment's keys of this kind as conf/data/*.yaml leave them: off (a config stored before
# they existed compares as holding these, utils/run/resume_changes.py)
IMAGE_AUGMENT_OFF = {
    "random_resized_crop": False,
    "scale": [0.08, 1.0],
    "ratio": [0.75, 1.3333],
    "auto_augment": None,
    "color_jitter": 0.0,
    "random_erasing": 0.0,
    "repeats": 1,
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
    repeats: int = 1  # copies of each sample in a row of the epoch's order (data/batching/order.py)
    auto_augment: Policy | None = None

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
        repeats = augment.get("repeats", 1)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise UserError(f"data.augment.repeats={repeats!r} must be a whole number, 1 or more")
        policy = Policy.parse(augment.get("auto_augment"))
        made = cls(0, False, rrc, scale, ratio, jitter, erasing, repeats, policy)
        if made.on and len(shape) != 3:
            raise UserError(
                f"data.augment: {', '.join(made.said())} augment images, and {name}'s "
                f"inputs are {tuple(shape)}, not (C, H, W); turn them off"
            )
        if made.said():
            log.info("data.augment: %s, per image, on the device", ", ".join(made.said()))
        return made

    @property
    def on(self) -> bool:
        """Whether any of this module's operations is on (the crop and flip aside)."""
        return (
            self.random_resized_crop
            or self.auto_augment is not None
            or self.color_jitter > 0
            or self.random_erasing > 0
        )

    def said(self) -> list[str]:
        parts = []
        if self.random_resized_crop:
            parts.append(f"random_resized_crop scale={list(self.scale)}")
        if self.auto_augment is not None:
            parts.append(f"auto_augment={self.auto_augment.text}")
        if self.color_jitter:
            parts.append(f"color_jitter={self.color_jitter}")
        if self.random_erasing:
            parts.append(f"random_erasing={self.random_erasing}")
        if self.repeats > 1:
            parts.append(f"repeats={self.repeats}")
        return parts


def _hash(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of each element (int64 tensors holding values below 2**32)."""
    x = (((x >> 16) ^ x) * HASH) & MASK
    x = (((x >> 16) ^ x) * HASH) & MASK
    return (x >> 16) ^ x


class Draws:
    """The random numbers of a batch's samples, each sample's a pure function of (seed, epoch,
    its index in the split, the stream, the element): the same whichever batch, process or
    worker the sample is in, on the CPU and CUDA alike (integer arithmetic only)."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys  # [N] int64: each sample's key

    @classmethod
    def of(cls, seed: int, epoch: int, ids: torch.Tensor) -> Draws:
        mixed = mix_seed(seed, epoch)
        keys = _hash((ids.to(torch.int64) & MASK) ^ (mixed & MASK))
        return cls(_hash(keys ^ ((mixed >> 32) & MASK)))

    def __len__(self) -> int:
        return len(self.keys)

    def bits(self, stream: int, *shape: int) -> torch.Tensor:
        """[N, *shape] int64 holding 32 random bits each."""
        count = math.prod(shape)
        element = torch.arange(count, device=self.keys.device, dtype=torch.int64)
        start = _hash(self.keys ^ (stream * 0x9E3779B) & MASK).view(-1, 1)
        return _hash((start + element * 0x3C6EF35) & MASK).view(len(self.keys), *shape)

    def uniform(self, stream: int, *shape: int) -> torch.Tensor:
        """[N, *shape] float32 in [0, 1), 24 bits each."""
        return (self.bits(stream, *shape) >> 8).to(torch.float32) / 2**24

    def normal(self, stream: int, *shape: int) -> torch.Tensor:
        """[N, *shape] standard normal (Box–Muller of two uniform streams)."""
        radius = torch.sqrt(-2 * torch.log1p(-self.uniform(stream, *shape)))
        return radius * torch.cos(2 * math.pi * self.uniform(stream + 1, *shape))

    def noise(self, stream: int, *shape: int) -> torch.Tensor:
        """[N, *shape] standard normal noise at half :meth:`normal`'s cost: Box–Muller of the
        two 16-bit halves of one hash (pixel noise needs no finer uniforms)."""
        x = self.bits(stream, *shape)
        outer = ((x >> 16).to(torch.float32) + 0.5) / 2**16  # in (0, 1): log is finite
        angle = (x & 0xFFFF).to(torch.float32) * (2 * math.pi / 2**16)
        return torch.sqrt(-2 * torch.log(outer)) * torch.cos(angle)


def crop_boxes(
    draws: Draws, size: tuple[int, int], scale: Sequence, ratio: Sequence
) -> torch.Tensor:
    """[N, 4] boxes (top, left, height, width) as torchvision's RandomResizedCrop draws
    them: ``TRIES`` draws of an area and a log-uniform aspect ratio each, the first that fits;
    else the centre crop of the aspect ratio nearest the image's within ``ratio``."""
    height, width = size
    count, device = len(draws), draws.keys.device
    area = height * width
    target = area * (scale[0] + (scale[1] - scale[0]) * draws.uniform(10, TRIES))
    logs = (math.log(ratio[0]), math.log(ratio[1]))
    aspect = torch.exp(logs[0] + (logs[1] - logs[0]) * draws.uniform(11, TRIES))
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.where(
        fits.any(1), fits.float().argmax(1), torch.full((count,), -1, device=device)
    )
    rows = torch.arange(count, device=device)
    pick = first.clamp(min=0)
    h, w = h[rows, pick], w[rows, pick]
    top = torch.floor(draws.uniform(12) * (height - h + 1))
    left = torch.floor(draws.uniform(13) * (width - w + 1))
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


def resized_crops(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: tuple[int, int],
    flip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each image's box resized to ``size``, bilinearly as torchvision's ``resized_crop``
    (crop, then ``interpolate`` with ``align_corners=False``, no antialias), as one
    ``grid_sample`` over the batch; the samples ``flip`` marks come out mirrored (the flip
    costs nothing there)."""
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
    if flip is not None:
        grid_x = torch.where(flip.view(n, 1), grid_x.flip(1), grid_x)
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


def erase_boxes(draws: Draws, size: tuple[int, int]) -> torch.Tensor:
    """[N, 4] boxes (top, left, height, width) of 2%–33% of the area, aspect ratio in
    [0.3, 3.3] log-uniform, ``TRIES`` draws each (torchvision's RandomErasing); a sample none
    fits gets an empty box."""
    height, width = size
    count, device = len(draws), draws.keys.device
    area = (
        height
        * width
        * (ERASE_SCALE[0] + (ERASE_SCALE[1] - ERASE_SCALE[0]) * draws.uniform(31, TRIES))
    )
    logs = (math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1]))
    aspect = torch.exp(logs[0] + (logs[1] - logs[0]) * draws.uniform(32, TRIES))
    h = torch.round(torch.sqrt(area * aspect))
    w = torch.round(torch.sqrt(area / aspect))
    fits = (h < height) & (w < width) & (h > 0) & (w > 0)
    pick = fits.float().argmax(1)
    rows = torch.arange(count, device=device)
    h = torch.where(fits.any(1), h[rows, pick], 0)
    w = torch.where(fits.any(1), w[rows, pick], 0)
    top = torch.floor(draws.uniform(33) * (height - h + 1))
    left = torch.floor(draws.uniform(34) * (width - w + 1))
    return torch.stack([top, left, h, w], dim=1)


def erased(
    images: torch.Tensor, boxes: torch.Tensor, chosen: torch.Tensor, draws: Draws
) -> torch.Tensor:
    """The ``chosen`` images with their box filled by normal noise (normalised images); the
    noise is drawn for the chosen images only (each sample's own, whichever are chosen)."""
    picked = chosen.nonzero().flatten()  # one sync a batch: the rest is a quarter of the work
    if len(picked) == 0:
        return images
    n, channels, height, width = len(picked), *images.shape[1:]
    rows = torch.arange(height, device=images.device).view(1, height, 1)
    cols = torch.arange(width, device=images.device).view(1, 1, width)
    top, left, h, w = (boxes[picked, k].view(n, 1, 1) for k in range(4))
    inside = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)
    noise = Draws(draws.keys[picked]).noise(35, channels, height, width).to(images.dtype)
    filled = torch.where(inside.unsqueeze(1), noise, images[picked])
    return images.index_copy(0, picked, filled)


def augmented(
    images: torch.Tensor,
    augment: ImageAugment,
    statistics: tuple[torch.Tensor, torch.Tensor],
    draws: Draws,
    size: Sequence[int] | None = None,
    flip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Normalised ``images`` [N, C, H, W] (by the per-channel ``statistics``, mean and std)
    through ``augment``'s operations, each sample its own parameters from ``draws``: the crop
    (resized to ``size``, by default the images'; the samples ``flip`` marks mirrored), then
    the policy and colours (on the pixels), then the erasing."""
    mean, std = statistics
    _, _, height, width = images.shape
    if augment.random_resized_crop:
        boxes = crop_boxes(draws, (height, width), augment.scale, augment.ratio)
        images = resized_crops(images, boxes, tuple(size or (height, width)), flip)
        height, width = images.shape[-2:]
    scale, shift = std.view(1, -1, 1, 1), mean.view(1, -1, 1, 1)
    if augment.auto_augment is not None:
        policy = augment.auto_augment
        # on whole pixel values in [0, 255], as the Pillow operations it follows
        pixels = torch.round(images * (255 * scale) + 255 * shift).clamp_(0, 255)
        fill = torch.zeros_like(mean) if policy.trivial else torch.round(255 * mean).clamp(0, 255)
        pixels = apply(pixels, policy, draws, fill.to(pixels.device))
        images = pixels * (1 / (255 * scale)) - shift / scale
    if augment.color_jitter:
        s = augment.color_jitter
        low = max(0.0, 1 - s)
        factors = low + (1 + s - low) * draws.uniform(20, 3).to(images.device)
        images = (jittered(images * scale + shift, factors) - shift) / scale
    if augment.random_erasing:
        chosen = draws.uniform(30) < augment.random_erasing
        images = erased(images, erase_boxes(draws, (height, width)), chosen, draws)
    return images
