"""MixUp and CutMix (``data.augment.mixup_alpha``, ``cutmix_alpha``, ``mix_prob``,
``mix_switch_prob``, ``mix_off_epoch``): training batches blended with a shuffled copy of
themselves, their targets blended by the same share.

    python train.py data.augment.mixup_alpha=0.2 data.augment.cutmix_alpha=1.0

A batch is mixed with probability ``mix_prob``; when both alphas are above 0, CutMix is chosen
with probability ``mix_switch_prob``, else MixUp. The share λ of the batch's own images is drawn
from Beta(α, α). MixUp blends whole images, ``λ·x + (1-λ)·x[perm]``; CutMix pastes one box of
``x[perm]`` into every image, of area ``1-λ`` as far as the image's edges allow, and λ becomes
the share of pixels kept. The targets are ``λ·onehot(y) + (1-λ)·onehot(y[perm])``: class
probabilities that sum to 1, which the task's loss smooths once (utils/tasks.py). Label sets
(``task=multilabel``) blend the same way, into per-label probabilities; values
(``task=regression``) are not mixed, and mixing is refused for them.

Everything a batch's mixing draws — whether, which, λ, the box and the pairing ``perm`` — is a
pure function of (seed, epoch, batch index, rank), as the rest of a batch is (data/batching/dataset.py),
so a run resumed at any batch mixes exactly as an uninterrupted one. The pairing is a seeded
permutation of the batch, so any batch size works, odd or 1. The ops are batched tensor ops on
the batch's device; λ and the box are drawn on the host from the seed alone, so nothing waits
for the device. Mixing runs in the first ``mix_off_epoch`` epochs (null: every epoch);
validation and test batches are never mixed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from utils.config.arguments import NON_NEGATIVE, POSITIVE_INT, UNIT_INTERVAL, Rule, check_values
from utils.system.seeding import mix_seed

MIX_STREAM = 0x4D1C  # keeps mixing's draws apart from the crop-and-flip draws of the same batch
# What the keys mean when a config has none of them (one stored before they existed): off.
MIXING_OFF = {
    "mixup_alpha": 0.0,
    "cutmix_alpha": 0.0,
    "mix_prob": 1.0,
    "mix_switch_prob": 0.5,
    "mix_off_epoch": None,
}
# Beta(α, α) for α this large is λ = 0.5 to within 1%; far larger ones (1e308) never finish
# drawing.
MAX_ALPHA = 1000
ALPHA = Rule(lambda v: NON_NEGATIVE.test(v) and v <= MAX_ALPHA, f"0 or more, at most {MAX_ALPHA}")
RULES = {
    "mixup_alpha": ALPHA,
    "cutmix_alpha": ALPHA,
    "mix_prob": UNIT_INTERVAL,
    "mix_switch_prob": UNIT_INTERVAL,
    "mix_off_epoch": Rule(lambda v: v is None or POSITIVE_INT.test(v), "1 or more, or null"),
}


@dataclass(frozen=True)
class Draw:
    """One batch's mixing: ``kind`` (mixup | cutmix), the share ``lam`` of its own images, and
    for CutMix the box ``(top, bottom, left, right)`` pasted from the paired images."""

    kind: str
    lam: float
    box: tuple[int, int, int, int] | None = None


@dataclass(frozen=True)
class Mixing:
    mixup_alpha: float
    cutmix_alpha: float
    mix_prob: float
    mix_switch_prob: float
    mix_off_epoch: int | None

    @classmethod
    def from_augment(cls, augment: Mapping[str, Any]) -> Mixing | None:
        """The mixing ``data.augment`` asks for, its values checked; None when both alphas
        are 0."""
        values = {key: augment.get(key, off) for key, off in MIXING_OFF.items()}
        check_values("data.augment", values, RULES)
        mixing = cls(**values)
        return mixing if mixing.mixup_alpha > 0 or mixing.cutmix_alpha > 0 else None

    def on_in(self, epoch: int) -> bool:
        """Whether batches of ``epoch`` (counted from 0) are mixed."""
        return self.mix_off_epoch is None or epoch < self.mix_off_epoch

    def draw(self, seed: int, image_size: tuple[int, ...]) -> Draw | None:
        """The mixing of the batch whose draws come from ``seed`` (CutMix's box fits
        ``image_size``, (height, width)); None: not mixed."""
        rng = random.Random(seed)
        if rng.random() >= self.mix_prob:
            return None
        both = self.mixup_alpha > 0 and self.cutmix_alpha > 0
        cutmix = rng.random() < self.mix_switch_prob if both else self.cutmix_alpha > 0
        if not cutmix:
            return Draw("mixup", rng.betavariate(self.mixup_alpha, self.mixup_alpha))
        lam = rng.betavariate(self.cutmix_alpha, self.cutmix_alpha)
        height, width = image_size
        cut = math.sqrt(1.0 - lam)
        cut_h, cut_w = int(height * cut), int(width * cut)
        cy, cx = rng.randrange(height), rng.randrange(width)
        top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
        left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
        kept = 1.0 - (bottom - top) * (right - left) / (height * width)
        return Draw("cutmix", kept, (top, bottom, left, right))


def mixed(
    images: torch.Tensor, labels: torch.Tensor, draw: Draw, perm: torch.Tensor, classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``images`` mixed with ``images[perm]`` as ``draw`` says, and their class-probability
    targets."""
    layout = (
        torch.channels_last
        if images.dim() == 4
        and not images.is_contiguous()
        and images.is_contiguous(memory_format=torch.channels_last)
        else torch.contiguous_format
    )
    if draw.kind == "mixup":
        images = images.lerp(images[perm], 1.0 - draw.lam)
    else:
        top, bottom, left, right = draw.box
        images = images.clone(memory_format=layout)
        images[..., top:bottom, left:right] = images[perm][..., top:bottom, left:right]
    # Class indices become one-hot rows; label sets (task=multilabel) already are 0/1 rows.
    onehot = (
        labels.to(images.dtype)
        if labels.is_floating_point()
        else (F.one_hot(labels, classes).to(images.dtype))
    )
    targets = onehot.lerp(onehot[perm], 1.0 - draw.lam)
    return images.contiguous(memory_format=layout), targets


class MixedBatches:
    """Training ``batches`` with MixUp/CutMix applied: the same length and order, each batch
    either mixed (images and class-probability targets) or as it was (class indices)."""

    def __init__(self, batches: Any, mixing: Mixing, classes: int, plan: Any) -> None:
        self.batches, self.mixing, self.classes, self.plan = batches, mixing, classes, plan

    def __len__(self) -> int:
        return len(self.batches)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.mixing.on_in(epoch):
            yield from self.batches.epoch(epoch, start)
            return
        plan = self.plan
        for index, (images, labels) in enumerate(self.batches.epoch(epoch, start), start):
            seed = mix_seed(plan.seed, MIX_STREAM, epoch, index * plan.world_size + plan.rank)
            draw = self.mixing.draw(seed, tuple(images.shape[-2:]))
            if draw is None:
                yield images, labels
                continue
            generator = torch.Generator(device=images.device).manual_seed(seed)
            perm = torch.randperm(len(labels), device=images.device, generator=generator)
            yield mixed(images, labels, draw, perm, self.classes)
