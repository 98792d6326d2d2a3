"""RandAugment (timm's policy strings) and TrivialAugment on the cached path
(data.augment.auto_augment): each operation is timm's / torchvision's on fixed arguments, the
level-to-argument maps are timm's, each sample draws its own operations, and a policy string
timm would not read is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import error_line, run_train, write_imagefolder
from PIL import Image

from data.augmentation.images import Draws, ImageAugment, augmented
from data.augmentation.policies import GEOMETRIC, TRIVIAL, Policy, apply, argument, operate

timm_aa = pytest.importorskip("timm.data.auto_augment", reason="the timm extra")


def picture(height=40, width=48, channels=3):
    """Gradients, a flat box and noise: every operation has something to change."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width]
    image = np.stack([(xx * 5) % 256, (yy * 6) % 256, ((xx + yy) * 3) % 256], -1)
    image[10:25, 12:30] = [200, 40, 90]
    image = np.clip(image + rng.integers(-20, 20, image.shape), 0, 255).astype(np.uint8)
    return image[..., :1] if channels == 1 else image


def ours(name, image, arg, fill=(128, 128, 128), nearest=False):
    x = torch.from_numpy(image).permute(2, 0, 1).float().unsqueeze(0)
    fill = torch.tensor(fill[: x.shape[1]], dtype=torch.float32)
    out = operate(name, x, torch.tensor([float(arg)]), fill, nearest)
    return out[0].permute(1, 2, 0).numpy().astype(int)


TIMM = [
    ("AutoContrast", 0, "auto_contrast", ()),
    ("Equalize", 0, "equalize", ()),
    ("Invert", 0, "invert", ()),
    ("Posterize", 2, "posterize", (2,)),
    ("Solarize", 100, "solarize", (100,)),
    ("SolarizeAdd", 60, "solarize_add", (60,)),
    ("Color", 1.6, "color", (1.6,)),
    ("Color", 0.3, "color", (0.3,)),
    ("Contrast", 1.7, "contrast", (1.7,)),
    ("Contrast", 0.4, "contrast", (0.4,)),
    ("Brightness", 1.5, "brightness", (1.5,)),
    ("Sharpness", 1.9, "sharpness", (1.9,)),
    ("Sharpness", 0.2, "sharpness", (0.2,)),
    ("Rotate", 20, "rotate", (20,)),
    ("Rotate", -27.5, "rotate", (-27.5,)),
    ("ShearX", 0.2, "shear_x", (0.2,)),
    ("ShearY", -0.25, "shear_y", (-0.25,)),
    ("TranslateXRel", 7.3, "translate_x_abs", (7.3,)),
    ("TranslateYRel", -9, "translate_y_abs", (-9,)),
]


@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize(("name", "arg", "function", "args"), TIMM)
def test_each_operation_is_timms_on_fixed_arguments(name, arg, function, args, channels):
    """Pixel operations: equal. Geometric ones (bilinear): within 1 of 255, where float32
    and Pillow's double land on either side of a whole value."""
    image = picture(channels=channels)
    pil = Image.fromarray(image[..., 0] if channels == 1 else image)
    fill = 128 if channels == 1 else (128, 128, 128)
    kwargs = {"fillcolor": fill, "resample": Image.BILINEAR} if name in GEOMETRIC else {}
    expected = np.asarray(getattr(timm_aa, function)(pil, *args, **kwargs)).astype(int)
    got = ours(name, image, arg)
    got = got[..., 0] if channels == 1 else got
    difference = np.abs(expected - got)
    assert difference.max() <= (1 if name in GEOMETRIC else 0), difference.max()
    assert difference.mean() < 0.1


def test_trivial_operations_are_torchvisions_trivial_augment_wide_on_fixed_bins():
    """Each of TrivialAugmentWide's 14 operations at bins 0, 7 and 30, either sign, against
    torchvision's own (on a PIL image: nearest, filled with 0): equal."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import autoaugment as tv

    image = picture()
    policy = Policy.parse("trivial")
    space = tv.TrivialAugmentWide()._augmentation_space(31)
    for name in TRIVIAL:
        magnitudes, signed = space[name]
        for level in (0, 7, 30):
            for negate in (False, True) if signed else (False,):
                magnitude = float(magnitudes[level]) if magnitudes.ndim > 0 else 0.0
                magnitude = -magnitude if negate else magnitude
                pil = Image.fromarray(image)
                expected = tv._apply_op(pil, name, magnitude, InterpolationMode.NEAREST, None)
                arg = argument(
                    name, torch.tensor([float(level)]), torch.tensor([negate]), policy, (40, 48)
                )
                got = ours(name, image, arg.item(), fill=(0, 0, 0), nearest=True)
                assert np.array_equal(np.asarray(expected).astype(int), got), (name, level, negate)


def test_the_level_maps_are_timms():
    """Each operation's argument at a level, either sign, is one timm's map gives."""
    hparams = {"translate_const": 100, "img_mean": (128, 128, 128)}
    for name in Policy.parse("rand-inc1").ops + Policy.parse("rand").ops:
        level_to_arg = timm_aa.LEVEL_TO_ARG[name]
        if level_to_arg is None:
            continue
        for level in (0.0, 3.0, 5.5, 9.0, 10.0):
            mine = {
                round(
                    argument(
                        name,
                        torch.tensor([level]),
                        torch.tensor([negate]),
                        Policy.parse("rand"),
                        (20, 40),
                    ).item(),
                    5,
                )
                for negate in (False, True)
            }
            for _ in range(8):  # timm negates at random
                theirs = level_to_arg(level, hparams)[0]
                theirs *= {"TranslateXRel": 40, "TranslateYRel": 20}.get(name, 1)  # pixels
                assert round(theirs, 5) in mine, (name, level, mine, theirs)


def test_posterize_to_no_bits_is_black():
    """Pillow 13's ImageOps.posterize raises at 0 bits (timm's top magnitude); ours keeps 0
    bits, as Pillow's lookup table would."""
    assert ours("Posterize", picture(), 0).max() == 0
    assert np.array_equal(ours("Posterize", picture(), 8), picture().astype(int))


def test_policy_strings_read_as_timm_reads_them():
    policy = Policy.parse("rand-m9-mstd0.5-inc1")
    assert (policy.magnitude, policy.magnitude_std, policy.layers, policy.prob) == (9, 0.5, 2, 0.5)
    assert "PosterizeIncreasing" in policy.ops and "Posterize" not in policy.ops
    policy = Policy.parse("rand-n3-m7-p1.0-mstd101-mmax20")
    assert (policy.layers, policy.magnitude, policy.prob, policy.magnitude_max) == (3, 7, 1.0, 20)
    assert policy.magnitude_std == float("inf") and "Posterize" in policy.ops
    assert Policy.parse(None) is None and Policy.parse("null") is None


def test_each_sample_draws_its_own_operations_and_the_same_on_any_batch():
    """One batch: the samples take different operations (not one per batch); a sample's
    result is the same in a batch of 64 or alone."""
    policy = Policy.parse("rand-m9-n1-p1.0")
    images = torch.from_numpy(picture()).permute(2, 0, 1).float().expand(64, 3, 40, 48)
    fill = torch.full((3,), 128.0)
    draws = Draws.of(5, 2, torch.arange(64))
    out = apply(images.clone(), policy, draws, fill)
    distinct = {tuple(row.flatten()[::97].tolist()) for row in out}
    assert len(distinct) >= 12  # 15 operations, most drawn by some of 64 samples
    alone = apply(images[:1].clone(), policy, Draws.of(5, 2, torch.tensor([17])), fill)
    assert torch.equal(alone[0], out[17])
    again = apply(images.clone(), policy, Draws.of(5, 3, torch.arange(64)), fill)
    assert not torch.equal(again, out)  # another epoch draws anew


def test_augmented_batches_stay_normalised_and_whole_pixel_values():
    mean, std = torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.2, 0.25, 0.3])
    pixels = torch.from_numpy(picture()).permute(2, 0, 1).float().expand(32, 3, 40, 48) / 255
    images = (pixels - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    augment = ImageAugment(auto_augment=Policy.parse("trivial"))
    out = augmented(images, augment, (mean, std), Draws.of(0, 0, torch.arange(32)))
    back = (out * std.view(1, 3, 1, 1) + mean.view(1, 3, 1, 1)) * 255
    assert torch.allclose(back, back.round(), atol=1e-3)
    assert float(back.min()) > -1e-3 and float(back.max()) < 255 + 1e-3


@pytest.mark.parametrize("policy", ["rand-x3", "augmix-m5", "rand-n0"])
def test_a_policy_timm_would_not_read_is_one_line(tmp_path, policy):
    write_imagefolder(tmp_path / "images", per_class=4, size=(12, 12))
    key = f"data.augment.auto_augment={policy}"
    result = run_train(tmp_path, "data=imagefolder", "data.root=images", key, ok=False)
    assert result.returncode == 2 and key in error_line(result)


def test_a_magnitude_above_ten_keeps_posterize_within_its_bits():
    """mmax lets the magnitude pass 10 (timm's TF-style RandAugment): posterize still keeps
    between 0 and 8 bits, never a negative count that would blow the pixels up."""
    policy = Policy.parse("rand-m30-mmax30-inc1")
    for name in ("Posterize", "PosterizeIncreasing"):
        bits = argument(
            name, torch.tensor([0.0, 10.0, 30.0]), torch.tensor([False] * 3), policy, (8, 8)
        )
        assert bool(((bits >= 0) & (bits <= 8)).all()), (name, bits)
        out = ours(name.removesuffix("Increasing"), picture(), bits[-1].item())
        assert out.min() >= 0 and out.max() <= 255
