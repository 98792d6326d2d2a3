"""ImageNet-style augmentation on the cached path (data.augment.random_resized_crop,
color_jitter, random_erasing): each operation matches torchvision's definition on fixed
parameters, its draws are torchvision's, and a run with all of them resumes exactly."""

from __future__ import annotations

import signal

import pytest
import torch
import torchvision.transforms.functional as TF
from conftest import checkpoint, error_line, killed_at, run_train, write_imagefolder

from data.augmentation.images import (
    Draws,
    ImageAugment,
    augmented,
    crop_boxes,
    erase_boxes,
    jittered,
    resized_crops,
)
from data.augmentation.policies import Policy


def images(n=6, channels=3, size=(20, 24)):
    return torch.rand(n, channels, *size, generator=torch.Generator().manual_seed(0))


def test_resized_crops_are_torchvisions_resized_crop_on_the_same_boxes():
    batch = images()
    boxes = torch.tensor(
        [[0, 0, 20, 24], [3, 5, 10, 12], [7, 2, 5, 20], [0, 10, 20, 4], [12, 0, 8, 8], [1, 1, 2, 3]]
    )
    got = resized_crops(batch, boxes, (20, 24))
    for image, box, out in zip(batch, boxes.tolist(), got, strict=True):
        expected = TF.resized_crop(image, *box, [20, 24], antialias=False)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    flip = torch.tensor([True, False, True, True, False, True])
    mirrored = resized_crops(batch, boxes, (20, 24), flip)  # the flip folded into the crop
    expected = torch.where(flip.view(-1, 1, 1, 1), got.flip(3), got)
    torch.testing.assert_close(mirrored, expected, rtol=0, atol=1e-5)


def test_crop_boxes_are_drawn_as_torchvision_draws_them():
    boxes = crop_boxes(Draws.of(3, 0, torch.arange(20_000)), (32, 48), (0.08, 1.0), (3 / 4, 4 / 3))
    top, left, h, w = boxes.T
    assert bool((top >= 0).all() and (left >= 0).all())
    assert bool((top + h <= 32).all() and (left + w <= 48).all() and (h >= 1).all())
    area = (h * w / (32 * 48)).mean().item()
    # torchvision's own draws, the same rule: their mean area within sampling noise
    import torchvision.transforms as T

    torch.manual_seed(3)
    theirs = [
        T.RandomResizedCrop.get_params(torch.zeros(1, 32, 48), [0.08, 1.0], [3 / 4, 4 / 3])
        for _ in range(20_000)
    ]
    their_area = sum(b[2] * b[3] for b in theirs) / (20_000 * 32 * 48)
    assert abs(area - their_area) < 0.01, (area, their_area)
    fallback = crop_boxes(Draws.of(0, 0, torch.arange(4)), (10, 100), (0.99, 1.0), (1.0, 1.0))
    assert fallback[0].tolist() == [0, 45, 10, 10]  # no square of 99% fits: the centre square


def test_colour_jitter_is_torchvisions_adjustments_in_order():
    batch = images()
    factors = torch.tensor([[1.2, 0.7, 1.5]] * 3 + [[0.6, 1.3, 0.2]] * 3)
    got = jittered(batch, factors)
    for image, (b, c, s), out in zip(batch, factors.tolist(), got, strict=True):
        expected = TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(image, b), c), s)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    grey = jittered(images(channels=1), factors)
    for image, (b, c, _), out in zip(images(channels=1), factors.tolist(), grey, strict=True):
        torch.testing.assert_close(
            out, TF.adjust_contrast(TF.adjust_brightness(image, b), c), rtol=0, atol=1e-5
        )


def test_random_erasing_fills_one_box_of_its_size_in_the_chosen_images_only():
    batch = images(n=200)
    boxes = erase_boxes(Draws.of(1, 0, torch.arange(200)), (20, 24))
    area = boxes[:, 2] * boxes[:, 3] / (20 * 24)
    assert bool(((area >= 0.01) & (area <= 0.4)).all())  # 2%-33%, in whole pixels
    augment = ImageAugment(random_erasing=0.5)
    out = augmented(
        batch, augment, (torch.zeros(3), torch.ones(3)), Draws.of(2, 0, torch.arange(200))
    )
    changed = (out != batch).flatten(1).any(1)
    assert 60 < int(changed.sum()) < 140  # about half
    assert torch.equal(out[~changed], batch[~changed])


@pytest.mark.parametrize("key", ["data.augment.scale=[0.5,1.5]", "data.augment.random_erasing=2"])
def test_a_wrong_setting_is_one_line(tmp_path, key):
    write_imagefolder(tmp_path / "images", per_class=4, size=(12, 12))
    result = run_train(tmp_path, "data=imagefolder", "data.root=images", key, ok=False)
    assert result.returncode == 2 and key.split("=")[0] in error_line(result)


@pytest.mark.slow  # four runs of a timm model (44 s): the kill matrices' company
def test_a_run_with_every_operation_is_killed_and_resumes_bit_identically(tmp_path):
    """A timm model with drop-path, RandAugment, the crop, jitter, erasing and repeats:
    kill -9 mid-epoch, resume, the same weights bit for bit."""
    pytest.importorskip("timm", reason="the timm extra")
    write_imagefolder(tmp_path / "images", per_class=24, size=(16, 16))
    run = ("data=imagefolder", "data.root=images", "data.image_size=[16,16]", "model=timm")
    run += ("model._target_=signalling_model.timm_model", "model.name=resnet10t")
    run += ("model.drop_path_rate=0.1", "trainer.max_epochs=2")
    run += ("data.augment.random_resized_crop=true", "data.augment.color_jitter=0.4")
    run += ("data.augment.auto_augment=rand-m9-mstd0.5-inc1", "data.augment.repeats=2")
    run += (
        "data.augment.random_erasing=0.25",
        "trainer.checkpoint_every_n_steps=2",
        "data.batch_size=8",
    )
    said = run_train(tmp_path, *run, "run_name=straight")
    assert (
        "random_resized_crop scale=[0.08, 1.0], auto_augment=rand-m9-mstd0.5-inc1, "
        "color_jitter=0.4, random_erasing=0.25, repeats=2"
    ) in (said.stdout + said.stderr)
    plain = [a for a in run if not a.startswith("data.augment")]
    run_train(tmp_path, *plain, "run_name=plain")
    a, b = checkpoint(tmp_path, "straight")["model"], checkpoint(tmp_path, "plain")["model"]
    assert not all(torch.equal(a[k], b[k]) for k in a)  # the batches were augmented
    killed = run_train(
        tmp_path,
        *run,
        "run_name=killed",
        ok=False,
        env=killed_at(11),
    )
    assert killed.returncode == -signal.SIGKILL
    run_train(tmp_path, *run, "run_name=killed", "resume=auto")
    a, b = checkpoint(tmp_path, "straight")["model"], checkpoint(tmp_path, "killed")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resnet18_drops_residual_branches_per_sample_in_training_only():
    from models.resnet import resnet18

    plain = resnet18((3, 32, 32), 10, True, "default")
    dropping = resnet18((3, 32, 32), 10, True, "default", drop_path_rate=0.5)
    assert list(dropping.state_dict()) == list(plain.state_dict())  # torchvision's names
    dropping.load_state_dict(plain.state_dict())
    batch = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    plain.eval(), dropping.eval()
    torch.testing.assert_close(dropping(batch), plain(batch))  # evaluation keeps every branch
    plain.train(), dropping.train()
    torch.manual_seed(0)
    assert not torch.allclose(dropping(batch), plain(batch))
    rates = [m.drop_path for m in dropping.modules() if hasattr(m, "drop_path")]
    assert rates[0] == 0.0 and rates[-1] == 0.5 and rates == sorted(rates)


def test_the_built_in_cnn_drops_its_residual_branches_per_sample_in_training_only():
    from models.cnn import cnn

    plain = cnn((3, 16, 16), 10, [8, 16, 32], 0.0, "default")
    dropping = cnn((3, 16, 16), 10, [8, 16, 32], 0.0, "default", drop_path_rate=0.4)
    assert list(dropping.state_dict()) == list(plain.state_dict())  # the plain net's names
    assert sorted(dropping.branches.values()) == [0.0, 0.2, 0.4]
    batch = torch.randn(64, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    dropping.eval()
    kept = dropping(batch)
    torch.manual_seed(0)
    assert torch.equal(dropping(batch), kept)  # evaluation keeps every branch: no draws
    dropping.train()
    torch.manual_seed(0)
    first = dropping(batch)
    torch.manual_seed(1)
    assert not torch.allclose(dropping(batch), first)  # samples' branches dropped anew


def test_a_torchvision_models_head_dropout_acts_in_training_only():
    from models.pretrained import torchvision_model

    torch.manual_seed(0)
    plain = torchvision_model((3, 32, 32), 5, "resnet18", None, 0)
    dropping = torchvision_model((3, 32, 32), 5, "resnet18", None, 0, drop_rate=0.5)
    assert list(dropping.state_dict()) == list(plain.state_dict())  # fc.weight, as torchvision
    dropping.load_state_dict(plain.state_dict())
    batch = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    plain.eval(), dropping.eval()
    torch.testing.assert_close(dropping(batch), plain(batch))
    plain.train(), dropping.train()
    torch.manual_seed(0)
    assert not torch.allclose(dropping(batch), plain(batch))


def test_every_sample_draws_the_same_whatever_batch_or_process_it_is_in():
    """Draws are keyed by (seed, epoch, the sample's index): one process of batch 16 and two
    of batch 8 augment each sample alike, RandAugment's operations included; another epoch or
    seed draws anew."""
    from data.batching.batches import BatchPlan, BatchTransform, TensorBatches
    from data.batching.splits import TensorSplit

    split = TensorSplit(
        torch.rand(48, 3, 12, 12, generator=torch.Generator().manual_seed(0)), torch.arange(48)
    )
    policy = Policy.parse("rand-m9-mstd0.5-inc1")
    augment = ImageAugment(2, True, True, (0.2, 1.0), (0.75, 1.33), 0.4, 0.5, 1, policy)

    def batches(batch, rank, world, epoch=1, seed=7):
        transform = BatchTransform([0.5] * 3, [0.25] * 3, torch.device("cpu"), augment)
        plan = BatchPlan(
            batch_size=batch, train=True, seed=seed, rank=rank, world_size=world, keep_partial=False
        )
        return list(TensorBatches(split, plan, transform).epoch(epoch))

    one = batches(16, 0, 1)
    two = list(zip(batches(8, 0, 2), batches(8, 1, 2), strict=True))
    for (images, labels), ((first, a), (second, b)) in zip(one, two, strict=True):
        assert torch.equal(labels, torch.cat([a, b]))
        torch.testing.assert_close(images, torch.cat([first, second]), rtol=0, atol=1e-6)
    other = batches(16, 0, 1, epoch=2)
    assert not torch.equal(one[0][0], other[0][0])
    uniforms = Draws.of(7, 1, torch.arange(10_000)).uniform(5, 4)
    assert 0.49 < float(uniforms.mean()) < 0.51 and float(uniforms.max()) < 1.0


def test_repeated_augmentation_puts_each_samples_copies_in_one_global_batch_drawn_anew(tmp_path):
    """data.augment.repeats=3: the epoch keeps its length, each of a third of the samples
    comes three times in a row (so across the processes of one global batch), each copy
    augmented anew, alike on one process or two."""
    from data.batching.batches import BatchPlan, BatchTransform, TensorBatches
    from data.batching.splits import TensorSplit

    split = TensorSplit(
        torch.rand(30, 3, 8, 8, generator=torch.Generator().manual_seed(0)), torch.arange(30)
    )
    augment = ImageAugment(2, True, repeats=3)

    def batches(batch, rank, world):
        transform = BatchTransform([0.5] * 3, [0.25] * 3, torch.device("cpu"), augment)
        plan = BatchPlan(
            batch_size=batch,
            train=True,
            seed=7,
            rank=rank,
            world_size=world,
            keep_partial=False,
            repeats=3,
        )
        return list(TensorBatches(split, plan, transform).epoch(0))

    one = batches(6, 0, 1)
    labels = torch.cat([b for _, b in one])
    assert (
        len(labels) == 30 and sorted(torch.bincount(labels)[labels.unique()].tolist()) == [3] * 10
    )
    first = one[0]
    assert first[1][:3].unique().numel() == 1 and not torch.equal(first[0][0], first[0][1])
    two = list(zip(batches(3, 0, 2), batches(3, 1, 2), strict=True))
    for (images, _), ((a, _), (b, _)) in zip(one, two, strict=True):
        torch.testing.assert_close(images, torch.cat([a, b]), rtol=0, atol=1e-6)
    write_imagefolder(tmp_path / "images", per_class=8, size=(8, 8))
    for cache in ("memory", "off"):  # the cached and the DataLoader paths
        result = run_train(
            tmp_path,
            "data=imagefolder",
            "data.root=images",
            "data.augment.repeats=2",
            f"data.cache={cache}",
            "data.num_workers=0",
            "trainer.max_epochs=1",
            f"run_name={cache}",
        )
        assert "repeats=2" in result.stdout + result.stderr
