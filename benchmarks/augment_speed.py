"""Augmented batches per second: torchloom's cached path against timm's DataLoader pipeline, on
the same image folder, with the same recipe.

    python benchmarks/augment_speed.py               # about 3 minutes on 2 cores
    python benchmarks/augment_speed.py --smoke       # 256 images: checks it runs

The folder is written in the real on-disk format: ``--images`` JPEG photographs, 112×112 crops
cut at random places and scales from the two photographs scikit-learn ships
(``sklearn.datasets.load_sample_images``; when scikit-learn is absent, smooth random images),
in 10 class folders. The recipe is timm's ImageNet training transform at 64×64: random resized
crop (scale 0.08-1), horizontal flip, RandAugment ``rand-m9-mstd0.5-inc1``, normalisation and
random erasing at 0.25 (pixel mode):

- ``timm``:      ``torchvision.datasets.ImageFolder`` with ``timm.data.create_transform(...,
                 is_training=True)``, a ``DataLoader`` of batch 128 with one worker per core
                 (persistent), decoding and augmenting each image with PIL, as timm's
                 ``train.py`` does. timm 1.0.31's RandAugment raises with Pillow 13 at
                 posterize's 0 bits (magnitude 10, which mstd reaches); its posterize is given
                 Pillow's own lookup-table posterize for that one case.
- ``torchloom``: ``data=imagefolder data.cache=memory data.cache_size=[80,80]`` with the same
                 ``data.augment`` keys: decoded once (the build is reported apart), then each
                 batch is a gather and the per-sample augmentation as batched tensor ops
                 (data/augmentation/), on the CPU here.

Both yield normalised float batches [128, 3, 64, 64] and their labels; no model runs, so the
figure is the data path's alone. Each pipeline's epochs alternate with the other's (``--rounds``
rounds of ``--epochs`` each; the first epoch of a run is warm-up), and the ratio is of the
median epoch speeds. The last line is machine-readable JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZE, CACHE, SIDE, BATCH, CLASSES = 64, 80, 112, 128, 10
POLICY, ERASING = "rand-m9-mstd0.5-inc1", 0.25
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photographs() -> list[np.ndarray]:
    try:
        from sklearn.datasets import load_sample_images

        return list(load_sample_images().images)
    except ImportError:  # smooth random images: JPEG decodes them at the same cost per pixel
        rng = np.random.default_rng(0)
        small = rng.integers(0, 256, (2, 27, 40, 3), dtype=np.uint8)
        return [np.asarray(Image.fromarray(s).resize((640, 427), Image.BICUBIC)) for s in small]


def write_folder(root: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    sources = photographs()
    for index in range(count):
        photo = sources[index % len(sources)]
        side = int(rng.integers(SIDE, min(photo.shape[:2])))
        top = int(rng.integers(0, photo.shape[0] - side + 1))
        left = int(rng.integers(0, photo.shape[1] - side + 1))
        crop = Image.fromarray(photo[top : top + side, left : left + side]).resize((SIDE, SIDE))
        folder = root / "train" / f"class{index % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        crop.save(folder / f"{index}.jpg", quality=90)
    for name in range(CLASSES):  # a val split, as an image folder has one
        (root / "val" / f"class{name}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(sources[0][:SIDE, :SIDE]).save(root / "val" / f"class{name}" / "0.jpg")


def timm_batches(root: Path, workers: int):
    import timm.data.auto_augment as aa
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder

    def posterize(img, bits_to_keep, **_):  # Pillow 13 raises at 0 bits: its lookup table
        if bits_to_keep >= 8:
            return img
        if bits_to_keep <= 0:
            return img.point([0] * 256 * len(img.getbands()))
        return ImageOps.posterize(img, bits_to_keep)

    for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        aa.NAME_TO_OP[name] = posterize
    transform = create_transform(
        (3, SIZE, SIZE),
        is_training=True,
        auto_augment=POLICY,
        re_prob=ERASING,
        re_mode="pixel",
        interpolation="bilinear",
        mean=MEAN,
        std=STD,
    )
    dataset = ImageFolder(str(root / "train"), transform=transform)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        drop_last=True,
    )
    return lambda epoch: iter(loader)


def torchloom_batches(root: Path, workers: int):
    from data.batching.batches import Placement
    from data.images.imagefolder import load_imagefolder

    augment = {
        "spatial": "on",
        "crop_padding": 0,
        "horizontal_flip": True,
        "random_resized_crop": True,
        "scale": [0.08, 1.0],
        "ratio": [0.75, 1.3333],
        "auto_augment": POLICY,
        "color_jitter": 0.0,
        "random_erasing": ERASING,
        "repeats": 1,
        "mixup_alpha": 0.0,
        "cutmix_alpha": 0.0,
    }
    started = time.perf_counter()
    data = load_imagefolder(
        str(root),
        [SIZE, SIZE],
        3,
        cache="memory",
        cache_dir=str(root / ".cache"),
        cache_size=[CACHE, CACHE],
        batch_size=BATCH,
        eval_batch_size=256,
        mean=list(MEAN),
        std=list(STD),
        augment=augment,
        num_workers=workers,
    )
    built = time.perf_counter() - started
    batches = data.batches("train", Placement(torch.device("cpu")), seed=0, keep_partial=False)
    return (lambda epoch: batches.epoch(epoch)), built


def epoch_speed(make, epoch: int) -> float:
    started, samples = time.perf_counter(), 0
    for images, labels in make(epoch):
        assert images.shape[1:] == (3, SIZE, SIZE) and images.dtype == torch.float32
        samples += len(labels)
    return samples / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.images, args.rounds, args.epochs = 256, 1, 2
    workers = os.cpu_count() or 1
    torch.set_num_threads(workers)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_folder(root, args.images)
        timm_make = timm_batches(root, workers)
        ours_make, built = torchloom_batches(root, workers)
        speeds: dict[str, list[float]] = {"timm": [], "torchloom": []}
        epoch = 0
        for _ in range(args.rounds):
            for name, make in (("timm", timm_make), ("torchloom", ours_make)):
                for index in range(args.epochs + 1):
                    speed = epoch_speed(make, epoch)
                    epoch += 1
                    if index:  # the first epoch of each run is warm-up
                        speeds[name].append(speed)
    median = {name: statistics.median(values) for name, values in speeds.items()}
    ratio = median["torchloom"] / median["timm"]
    print(f"{args.images} JPEGs {SIDE}x{SIDE} → batches of {BATCH} at {SIZE}x{SIZE}, {POLICY}")
    print(f"timm DataLoader ({workers} workers): {median['timm']:,.0f} samples/s")
    print(f"torchloom cached path:  {median['torchloom']:,.0f} samples/s  ({ratio:.2f}×)")
    print(f"torchloom's one-off decode into the cache: {built:.1f} s")
    print(json.dumps({"samples_per_s": median, "ratio": ratio, "cache_build_s": built}))


if __name__ == "__main__":
    main()
