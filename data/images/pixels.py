"""An image's bytes as uint8 pixels [C, H, W]: one decoder for a file in a folder, a manifest's
path and an encoded image in a shard, so each reads exactly the same pixels.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from utils.errors import UserError


def decoded(
    source: Any, image_size: Sequence[int], channels: int, name: str, crop_pct: float = 1.0
) -> torch.Tensor:
    """The image at ``source`` (a path or a binary file object) as uint8 [C, H, W], RGB (3
    channels) or grey (1), resized to ``image_size`` (bilinear); with ``crop_pct`` below 1,
    resized to ``image_size / crop_pct`` (rounded down) and its centre ``image_size`` cut out,
    as timm's evaluation transform does (``data.crop_pct``). An image PIL cannot read —
    not an image, empty, truncated, or a decompression bomb (more pixels than PIL's
    ``Image.MAX_IMAGE_PIXELS``) — is one line naming it (``name``)."""
    height, width = image_size
    outer = (math.floor(width / crop_pct), math.floor(height / crop_pct))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as image:
                image = image.convert("RGB" if channels == 3 else "L")
                if image.size != outer:
                    image = image.resize(outer, Image.Resampling.BILINEAR)
                if outer != (width, height):  # torchvision's CenterCrop
                    left, top = round((outer[0] - width) / 2), round((outer[1] - height) / 2)
                    image = image.crop((left, top, left + width, top + height))
                pixels = torch.from_numpy(np.array(image, dtype=np.uint8))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise UserError(
            f"refusing image {name}: more pixels than Image.MAX_IMAGE_PIXELS "
            f"({Image.MAX_IMAGE_PIXELS}), a possible decompression bomb; remove or shrink it"
        ) from None
    except Exception as error:  # any decoder failure on a hostile file is bad input
        reason = str(error).split(":")[0] or type(error).__name__
        raise UserError(f"cannot decode image {name} ({reason}); remove or replace it") from None
    return pixels.view(height, width, -1).permute(2, 0, 1).contiguous()


def is_crop_pct(value: Any) -> bool:
    """A centre share ``data.crop_pct`` may be (a config's, or a checkpoint's record)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.1 <= value <= 1
