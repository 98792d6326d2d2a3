"""RandAugment and TrivialAugment on a batch (``data.augment.auto_augment``), per sample:
each sample draws its own operations and magnitudes (data/augmentation/images.py ``Draws``), and
the samples that drew the same operation are transformed together, as tensor ops.

Policies:

- timm's string syntax, ``rand-m9-mstd0.5-inc1`` (``m`` magnitude of 10, ``n`` layers, ``p``
  the chance each layer applies, ``mstd`` the magnitude's noise, above 100 uniform in [0, m],
  ``mmax`` its bound, ``inc1`` the operations that grow with the magnitude): timm's
  ``rand_augment_transform`` with its operation set, level-to-argument maps and hparams
  (translations up to 45% of the side, filled with the dataset mean); interpolation is
  bilinear (timm draws bilinear or bicubic per use);
- ``trivial``: torchvision's ``TrivialAugmentWide``: one of 14 operations, its magnitude one of
  31 bins, nearest interpolation, filled with 0.

Each operation is the Pillow operation timm calls (``ImageOps``/``ImageEnhance``/affine
``transform``) on pixels in [0, 255] rounded down to whole values after each, as Pillow's
uint8 results are — tested against timm's functions on fixed arguments. Posterize keeps 0 bits
as black (Pillow 13's ``ImageOps.posterize`` raises there).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from utils.errors import UserError

LEVEL_DENOM = 10.0  # timm's magnitude scale: m10 is an operation's largest argument
# timm's _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS (inc1)
RAND = [
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
]
RAND_INCREASING = [
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
]
# torchvision's TrivialAugmentWide, in its order
TRIVIAL = [
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
]
TRIVIAL_BINS = 31
MAX_LAYERS = 16  # operations per sample: each layer's draws have streams of their own
SIGNED = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel"}
SIGNED |= {"TranslateYRel", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing"}
SIGNED |= {"SharpnessIncreasing"}
TRIVIAL_SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness"}
TRIVIAL_SIGNED |= {"Color", "Contrast", "Sharpness"}
GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"}
GEOMETRIC |= {"TranslateXRel", "TranslateYRel"}
HELP = (
    "a timm RandAugment string such as rand-m9-mstd0.5-inc1 (m magnitude, n layers, p chance, "
    "mstd, mmax, inc), trivial, or null"
)


@dataclass(frozen=True)
class Policy:
    """A parsed ``data.augment.auto_augment``: which operations, how many per sample, with
    what chance and magnitude."""

    text: str
    ops: tuple[str, ...]
    layers: int = 2
    prob: float = 0.5
    magnitude: float = 10.0
    magnitude_std: float = 0.0
    magnitude_max: float = LEVEL_DENOM
    trivial: bool = False

    @classmethod
    def parse(cls, text: str | None) -> Policy | None:
        """``text`` as timm parses it (``rand_augment_transform``); a section it would not
        accept, or one this does not build (timm's weighted sets, AutoAugment, AugMix), is
        one line naming it."""
        if text is None or text is False or str(text).lower() in ("", "none", "null", "false"):
            return None
        text = str(text)
        if text == "trivial":
            return cls(text, tuple(TRIVIAL), layers=1, prob=1.0, trivial=True)
        sections = text.split("-")
        if sections[0] != "rand":
            raise UserError(f"data.augment.auto_augment={text}: must be {HELP}")
        values = {"m": 10.0, "n": 2.0, "p": 0.5, "mstd": 0.0, "mmax": LEVEL_DENOM, "inc": 0.0}
        for section in sections[1:]:
            match = re.fullmatch(r"(mstd|mmax|inc|m|n|p)(\d+(?:\.\d*)?)", section)
            if not match:
                raise UserError(
                    f"data.augment.auto_augment={text}: section '{section}' is not one "
                    f"this reads; give {HELP}"
                )
            values[match.group(1)] = float(match.group(2))
        layers = int(values["n"])
        if not 1 <= layers <= MAX_LAYERS or not 0 < values["p"] <= 1 or values["mmax"] <= 0:
            raise UserError(
                f"data.augment.auto_augment={text}: n must be in 1..{MAX_LAYERS}, p in (0, 1] "
                "and mmax above 0"
            )
        std = math.inf if values["mstd"] > 100 else values["mstd"]
        ops = RAND_INCREASING if values["inc"] else RAND
        return cls(text, tuple(ops), layers, values["p"], values["m"], std, values["mmax"], False)


def apply(pixels: torch.Tensor, policy: Policy, draws, fill: torch.Tensor) -> torch.Tensor:
    """``pixels`` [N, C, H, W] in [0, 255] (whole values) through ``policy``, each sample its
    own operations and magnitudes from ``draws`` (data/augmentation/images.py ``Draws``); a
    geometric operation fills uncovered pixels with ``fill`` [C] (in [0, 255])."""
    count = len(pixels)
    pixels = pixels.clone()  # written in place below, one operation's samples at a time
    for layer in range(policy.layers):
        choice = (
            (draws.uniform(200 + layer) * len(policy.ops)).long().clamp(max=len(policy.ops) - 1)
        )
        applies = draws.uniform(300 + layer) < policy.prob
        which = torch.where(applies, choice, len(policy.ops))  # len(ops): left as it is
        levels = _levels(policy, draws, layer, count)
        negate = draws.uniform(500 + layer) < 0.5
        order = torch.argsort(which, stable=True)
        counts = torch.bincount(which, minlength=len(policy.ops) + 1).tolist()  # one sync
        start = 0
        for index, name in enumerate(policy.ops):
            if counts[index]:
                rows = order[start : start + counts[index]]
                args = argument(name, levels[rows], negate[rows], policy, pixels.shape[-2:])
                done = operate(name, pixels[rows], args, fill, policy.trivial)
                pixels.index_copy_(0, rows, done)
            start += counts[index]
    return pixels


def _levels(policy: Policy, draws, layer: int, count: int) -> torch.Tensor:
    """[N] each sample's magnitude for ``layer``: timm's (``m`` with its noise, clamped to
    [0, mmax]), or TrivialAugmentWide's bin index in 0..30."""
    if policy.trivial:
        return (draws.uniform(400 + layer) * TRIVIAL_BINS).floor().clamp(max=TRIVIAL_BINS - 1)
    level = torch.full((count,), policy.magnitude, device=draws.keys.device)
    if policy.magnitude_std == math.inf:
        level = draws.uniform(400 + 2 * layer) * policy.magnitude
    elif policy.magnitude_std > 0:
        level = level + policy.magnitude_std * draws.normal(400 + 2 * layer)
    return level.clamp(0, policy.magnitude_max)


def argument(
    name: str, level: torch.Tensor, negate: torch.Tensor, policy: Policy, size
) -> torch.Tensor:
    """[M] the operation's argument for each sample: timm's level-to-argument maps (the
    level in [0, mmax], out of 10), or TrivialAugmentWide's bins (``level`` the bin)."""
    signed = TRIVIAL_SIGNED if policy.trivial else SIGNED
    sign = torch.where(negate, -1.0, 1.0) if name in signed else torch.ones_like(level)
    if policy.trivial:
        fraction = level / (TRIVIAL_BINS - 1)
        wide = {"ShearX": 0.99, "ShearY": 0.99, "TranslateX": 32.0, "TranslateY": 32.0}
        wide |= {"Rotate": 135.0, "Brightness": 0.99, "Color": 0.99, "Contrast": 0.99}
        wide |= {"Sharpness": 0.99}
        if name in wide:
            value = fraction * wide[name] * sign
            if name.startswith("Translate"):
                return -value.trunc()  # torchvision: int(magnitude), moving the image by it
            return value if name in GEOMETRIC else 1 + value  # enhance factors: 1 + magnitude
        if name == "Posterize":
            return 8 - torch.round(level / ((TRIVIAL_BINS - 1) / 6))
        if name == "Solarize":
            return 255.0 * (1 - fraction)
        return level  # Identity, AutoContrast, Equalize take none
    scaled = level / LEVEL_DENOM
    height, width = size
    maps = {
        "Rotate": lambda: scaled * 30 * sign,
        "ShearX": lambda: scaled * 0.3 * sign,
        "ShearY": lambda: scaled * 0.3 * sign,
        "TranslateXRel": lambda: scaled * 0.45 * sign * width,
        "TranslateYRel": lambda: scaled * 0.45 * sign * height,
        "Posterize": lambda: (scaled * 4).floor().clamp(0, 8),  # mmax above 10: still bits
        "PosterizeIncreasing": lambda: (4 - (scaled * 4).floor()).clamp(0, 8),
        "Solarize": lambda: (scaled * 256).floor().clamp(max=256),
        "SolarizeIncreasing": lambda: 256 - (scaled * 256).floor().clamp(max=256),
        "SolarizeAdd": lambda: (scaled * 110).floor().clamp(max=128),
    }
    if name in maps:
        return maps[name]()
    if name.endswith("Increasing"):  # Color, Contrast, Brightness, Sharpness
        return (1 + scaled * 0.9 * sign).clamp(min=0.1)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return scaled * 1.8 + 0.1
    return level  # AutoContrast, Equalize, Invert take none


def operate(
    name: str, x: torch.Tensor, arg: torch.Tensor, fill: torch.Tensor, nearest: bool
) -> torch.Tensor:
    """The operation ``name`` on ``x`` [M, C, H, W] in [0, 255], with [M] arguments."""
    name = name.removesuffix("Increasing")
    view = arg.view(-1, 1, 1, 1).to(x.dtype)
    if name == "Identity":
        return x
    if name == "Invert":
        return 255 - x
    if name == "Posterize":
        step = torch.pow(2.0, 8 - view)
        return torch.floor(x / step) * step
    if name == "Solarize":
        return torch.where(x >= view, 255 - x, x)
    if name == "SolarizeAdd":
        return torch.where(x < 128, (x + view).clamp(max=255), x)
    if name == "AutoContrast":
        return auto_contrast(x)
    if name == "Equalize":
        return equalize(x)
    if name in ("Brightness", "Color", "Contrast", "Sharpness"):
        return blend(degenerate(name, x), x, view)
    return affine(x, coefficients(name, arg, x.shape[-2:]), fill, nearest)


def grey(x: torch.Tensor) -> torch.Tensor:
    """[M, 1, H, W]: Pillow's conversion to "L" (ITU-R 601-2, rounded), grey left as it is."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return torch.floor((r * 19595 + g * 38470 + b * 7471 + 32768) / 65536).unsqueeze(1)


def degenerate(name: str, x: torch.Tensor) -> torch.Tensor:
    """The image ImageEnhance blends away from: black, grey, the grey mean, the smoothed."""
    if name == "Brightness":
        return torch.zeros_like(x)
    if name == "Color":
        return grey(x).expand_as(x)
    if name == "Contrast":
        mean = grey(x).mean(dim=(1, 2, 3), keepdim=True)
        return torch.floor(mean + 0.5).expand_as(x)
    # Sharpness: ImageFilter.SMOOTH ([1 1 1; 1 5 1; 1 1 1] / 13, rounded), the border kept
    kernel = torch.ones(3, 3, dtype=x.dtype, device=x.device)
    kernel[1, 1] = 5
    channels = x.shape[1]
    smooth = F.conv2d(x, (kernel / 13).expand(channels, 1, 3, 3), groups=channels)
    out = x.clone()
    out[..., 1:-1, 1:-1] = torch.floor(smooth + 0.5)
    return out


def blend(base: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Pillow's ``Image.blend(base, x, factor)``: clamped to [0, 255], truncated."""
    return torch.floor((base + factor * (x - base)).clamp(0, 255))


def auto_contrast(x: torch.Tensor) -> torch.Tensor:
    """``ImageOps.autocontrast``: each channel stretched from its [min, max] to [0, 255]."""
    low = x.amin(dim=(2, 3), keepdim=True)
    high = x.amax(dim=(2, 3), keepdim=True)
    spread = high - low
    scale = 255 / spread.clamp(min=1)
    stretched = torch.floor(x * scale - low * scale).clamp(0, 255)
    return torch.where(spread > 0, stretched, x)


def equalize(x: torch.Tensor) -> torch.Tensor:
    """``ImageOps.equalize``: each channel through the lookup table of its histogram."""
    m, c, h, w = x.shape
    values = x.reshape(m * c, h * w).long().clamp(0, 255)
    hist = torch.zeros(m * c, 256, dtype=torch.int64, device=x.device)
    hist.scatter_add_(1, values, torch.ones_like(values))
    last = 255 - (hist.flip(1) > 0).long().argmax(1, keepdim=True)  # the last used bin
    step = (h * w - hist.gather(1, last)) // 256
    before = hist.cumsum(1) - hist  # pixels in lower bins
    lut = ((step // 2 + before) // step.clamp(min=1)).clamp(max=255)
    lut = torch.where(step > 0, lut, torch.arange(256, device=x.device))
    return lut.gather(1, values).reshape(m, c, h, w).to(x.dtype)


def coefficients(name: str, arg: torch.Tensor, size) -> torch.Tensor:
    """[M, 6] Pillow's affine ``(a, b, c, d, e, f)``: an output point (x, y) is read from
    the input at (a x + b y + c, d x + e y + f) (pixel centres at +0.5)."""
    height, width = size
    one, zero = torch.ones_like(arg), torch.zeros_like(arg)
    if name == "ShearX":
        return torch.stack([one, arg, zero, zero, one, zero], 1)
    if name == "ShearY":
        return torch.stack([one, zero, zero, arg, one, zero], 1)
    if name in ("TranslateX", "TranslateXRel"):
        return torch.stack([one, zero, arg, zero, one, zero], 1)
    if name in ("TranslateY", "TranslateYRel"):
        return torch.stack([one, zero, zero, zero, one, arg], 1)
    # Rotate: counter-clockwise by ``arg`` degrees about the centre (Image.rotate)
    angle = -torch.deg2rad(arg)
    cos, sin = torch.cos(angle), torch.sin(angle)
    cx, cy = width / 2, height / 2
    c = cos * -cx + sin * -cy + cx
    f = -sin * -cx + cos * -cy + cy
    return torch.stack([cos, sin, c, -sin, cos, f], 1)


def affine(x: torch.Tensor, coef: torch.Tensor, fill: torch.Tensor, nearest: bool) -> torch.Tensor:
    """``x`` resampled through per-sample affine maps (``coefficients``), bilinear or
    nearest, points outside the image ``fill``; whole values, as Pillow's uint8."""
    m, c, h, w = x.shape
    if nearest:  # Pillow's 16.16 fixed-point walk (affine_fixed), exactly
        fixed = torch.floor(coef.to(torch.float64) * 65536 + 0.5).long()
        a, b, cc, d, e, f = (fixed[:, k].view(m, 1, 1) for k in range(6))
        start_x = torch.floor((coef[:, 2] + (coef[:, 0] + coef[:, 1]) / 2).double() * 65536 + 0.5)
        start_y = torch.floor((coef[:, 5] + (coef[:, 3] + coef[:, 4]) / 2).double() * 65536 + 0.5)
        cols = torch.arange(w, device=x.device).view(1, 1, w)
        rows = torch.arange(h, device=x.device).view(1, h, 1)
        u = torch.div(
            start_x.long().view(m, 1, 1) + cols * a + rows * b, 65536, rounding_mode="floor"
        )
        v = torch.div(
            start_y.long().view(m, 1, 1) + cols * d + rows * e, 65536, rounding_mode="floor"
        )
        inside = ((u >= 0) & (u < w) & (v >= 0) & (v < h)).unsqueeze(1)
        index = (v.clamp(0, h - 1) * w + u.clamp(0, w - 1)).view(m, 1, h * w)
        flat = x.reshape(m, c, h * w)
        sampled = flat.gather(2, index.expand(m, c, h * w)).view(m, c, h, w)
    else:
        xs = torch.arange(w, dtype=x.dtype, device=x.device).view(1, 1, w) + 0.5
        ys = torch.arange(h, dtype=x.dtype, device=x.device).view(1, h, 1) + 0.5
        a, b, cc, d, e, f = (coef[:, k].to(x.dtype).view(m, 1, 1) for k in range(6))
        u = a * xs + b * ys + cc  # input coordinates, pixel edges at whole numbers
        v = d * xs + e * ys + f
        # Pillow: a point inside is read with the edge pixels repeated, one outside is the fill
        inside = ((u >= 0) & (u < w) & (v >= 0) & (v < h)).unsqueeze(1)
        grid = torch.stack((2 * u / w - 1, 2 * v / h - 1), dim=-1)
        sampled = F.grid_sample(
            x, grid, mode="bilinear", padding_mode="border", align_corners=False
        )
    out = torch.where(inside, sampled, fill.view(1, -1, 1, 1).to(x.dtype))
    return torch.floor(out).clamp(0, 255)
