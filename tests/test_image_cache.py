"""Image folders decoded once into a uint8 cache (data/images/image_cache.py): batches bitwise those of
the DataLoader path in the same order, a cache rebuilt when the folder changes or the file is
broken, concurrent builders, an unwritable folder, a full disk, runs that are the same cached
or not, and an evaluation that follows no stored cache folder."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from conftest import EVALUATE, ROOT, read_metrics, run_python, run_train, write_imagefolder

import data.images.image_cache as image_cache
from data.batching.batches import MappedBatches, Placement, TensorBatches
from data.batching.loader import LoaderBatches
from data.images.imagefolder import load_imagefolder
from utils.errors import UserError

KEYS = {
    "batch_size": 4,
    "eval_batch_size": 5,
    "mean": [0.5] * 3,
    "std": [0.25] * 3,
    "augment": {"crop_padding": 2, "horizontal_flip": True},
    "num_workers": 0,
}
CPU = torch.device("cpu")


def load(root, cache: str, **keys):
    return load_imagefolder(str(root), [8, 8], 3, cache=cache, **{**KEYS, **keys})


def batches(data, split: str, epoch: int = 1, **placement):
    return list(data.batches(split, Placement(CPU, **placement), seed=3).epoch(epoch))


def cache_files(root) -> list[str]:
    return sorted(os.listdir(root / ".torchloom-cache"))


@pytest.mark.parametrize("cache", ["memory", "disk"])
@pytest.mark.parametrize("shard", [{}, {"rank": 1, "world_size": 2}])
def test_cached_batches_are_bitwise_the_decoded_ones_in_the_same_order(tmp_path, cache, shard):
    root = write_imagefolder(tmp_path, per_class=5, size=(12, 10))  # resized to 8×8
    uncached, cached = load(root, "off"), load(root, cache)
    kind = TensorBatches if cache == "memory" else MappedBatches
    assert isinstance(cached.batches("train", Placement(CPU), 0), kind)
    assert isinstance(uncached.batches("train", Placement(CPU), 0), LoaderBatches)
    for split in ("train", "val", "test"):
        expected, got = batches(uncached, split, **shard), batches(cached, split, **shard)
        assert len(got) == len(expected) > 0
        for (x, y), (x2, y2) in zip(expected, got, strict=True):
            assert torch.equal(x, x2) and torch.equal(y, y2), split


def test_auto_holds_what_fits_in_memory_and_maps_the_rest(tmp_path, caplog):
    root = write_imagefolder(tmp_path, per_class=5)
    caplog.set_level(logging.INFO, logger="torchloom")
    assert isinstance(load(root, "auto").splits["train"], image_cache.TensorSplit)
    assert "train: data.cache=auto chose memory: " in caplog.text  # it says which
    tiny = load(root, "auto", cache_max_gb=1e-6)  # 1 KiB: no split fits
    assert isinstance(tiny.splits["train"], image_cache.MappedSplit)
    assert "train: data.cache=auto chose disk: " in caplog.text and " is over the " in caplog.text


def test_a_touched_removed_or_added_file_rebuilds_the_cache(tmp_path, caplog):
    root = write_imagefolder(tmp_path, per_class=4)  # 12 training images in 3 classes
    caplog.set_level(logging.INFO, logger="torchloom")
    load(root, "disk")
    unchanged = [n for n in cache_files(root) if not n.startswith("train-")]
    cat, dog = root / "train" / "cat", root / "train" / "dog"
    later = time.time_ns() + 10**9
    steps = [
        (lambda: os.utime(cat / "0.png", ns=(later, later)), 12),  # touched
        (lambda: (cat / "0.png").unlink(), 11),  # removed
        (lambda: (dog / "9.png").write_bytes((dog / "1.png").read_bytes()), 12),  # added
    ]
    for change, count in steps:
        before = [n for n in cache_files(root) if n.startswith("train-")]
        change()
        caplog.clear()
        data = load(root, "disk")
        assert "the image folder changed" in caplog.text
        now = [n for n in cache_files(root) if n.startswith("train-")]
        assert len(now) == 1 and now != before  # the stale cache is replaced, not kept
        assert len(data.splits["train"]) == count
        expected = batches(load(root, "off"), "train")
        assert all(
            torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            for a, b in zip(expected, batches(data, "train"), strict=True)
        )
    assert [n for n in cache_files(root) if not n.startswith("train-")] == unchanged  # reused


@pytest.mark.parametrize(
    "damage", ["truncate", "header", "cut and padded", "a byte changed", "planted"]
)
def test_a_short_or_corrupt_cache_file_is_rebuilt_with_a_warning(tmp_path, caplog, damage):
    """A byte changed amid one image of 60 (not the first or last) was trained on before: the
    check decoded ten images, at random. A planted file of other images with their own
    hashes is the variant the random decoding finds."""
    # 60 val images: random checks alone would miss one wrong image most times
    root = write_imagefolder(tmp_path, per_class=20 if damage != "truncate" else 3)
    expected = batches(load(root, "disk"), "val")
    path = root / ".torchloom-cache" / next(n for n in cache_files(root) if n.startswith("val-"))
    raw = path.read_bytes()
    damaged = {
        "truncate": raw[: len(raw) - 7],
        "header": b"garbage!" + raw[8:],
        # a copy cut short, padded with zeros to the right size: only its end is wrong
        "cut and padded": raw[: len(raw) - 7] + bytes(7),
    }
    if damage == "a byte changed":
        changed = bytearray(raw)
        changed[image_cache.HEADER_BYTES + 31 * 3 * 8 * 8 + 17] ^= 0x01  # image 31's pixels
        damaged[damage] = bytes(changed)
    elif damage == "planted":  # every image inverted, each with its own hash: a file that
        files = load(root, "off").splits["val"]  # checks itself, of other images
        count, pixels = len(files), len(files) * 3 * 8 * 8
        start = image_cache.HEADER_BYTES
        inverted = 255 - torch.frombuffer(bytearray(raw[start : start + pixels]), dtype=torch.uint8)
        hashes = image_cache.sample_hashes(inverted.view(count, 3, 8, 8), files.targets)
        damaged[damage] = raw[:start] + inverted.numpy().tobytes() + hashes.numpy().tobytes()
    path.write_bytes(damaged[damage])
    caplog.set_level(logging.WARNING, logger="torchloom")
    again = batches(load(root, "disk"), "val")
    assert "rebuilding it" in caplog.text
    if damage == "a byte changed":
        assert "damaged (its image 31 does not match the hash written with it" in caplog.text
    assert all(torch.equal(a[0], b[0]) for a, b in zip(expected, again, strict=True))
    assert image_cache.check_file(path, load(root, "off").splits["val"]) is None


def test_two_builders_at_once_end_with_one_valid_cache(tmp_path):
    root = write_imagefolder(tmp_path, per_class=30, size=(32, 32))
    build = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from data.images.imagefolder import load_imagefolder; "
        "load_imagefolder(sys.argv[2], [16, 16], 3, cache='disk', batch_size=4, "
        "eval_batch_size=4, mean=[0.5], std=[0.5], num_workers=0, "
        "augment={'crop_padding': 0, 'horizontal_flip': False})"
    )
    builders = [
        subprocess.Popen(
            [sys.executable, "-c", build, str(ROOT), str(root)], stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for builder in builders:
        assert builder.wait(timeout=120) == 0, builder.stderr.read()
    names = cache_files(root)
    assert len(names) == 3 and all(not n.startswith(".") for n in names)  # no temporary left
    files = load_imagefolder(
        str(root), [16, 16], 3, cache="off", **{**KEYS, "mean": [0.5], "std": [0.5]}
    )
    for name in names:
        split = files.splits[name.split("-")[0]]
        assert image_cache.check_file(root / ".torchloom-cache" / name, split) is None


def test_an_unwritable_cache_folder_falls_back_to_memory_with_one_warning(tmp_path, caplog):
    root = write_imagefolder(tmp_path / "images", per_class=3)
    (tmp_path / "a_file").write_text("")
    caplog.set_level(logging.WARNING, logger="torchloom")
    data = load(root, "auto", cache_dir=str(tmp_path / "a_file" / "cache"))
    assert isinstance(data.splits["train"], image_cache.TensorSplit)
    assert caplog.text.count("cannot be written") == 3  # one line per split
    assert all(
        torch.equal(a[0], b[0])
        for a, b in zip(batches(data, "train"), batches(load(root, "off"), "train"), strict=True)
    )
    caplog.clear()
    mapped = load(root, "disk", cache_dir=str(tmp_path / "a_file" / "cache"))
    assert not isinstance(mapped.splits["train"], image_cache.MappedSplit)  # DataLoader path
    assert "reading it with the DataLoader" in caplog.text


def test_a_full_disk_while_building_leaves_no_partial_cache_and_says_so(tmp_path, monkeypatch):
    root = write_imagefolder(tmp_path, per_class=3)
    decoded = image_cache.decoded_batches

    def disk_fills(*args):
        yield next(decoded(*args))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(image_cache, "decoded_batches", disk_fills)
    with pytest.raises(UserError, match=r"no space left in .*\.torchloom-cache for the train"):
        load(root, "disk")
    assert cache_files(root) == []


def test_a_cached_run_trains_exactly_as_an_uncached_one(tmp_path):
    root = write_imagefolder(tmp_path / "images", per_class=8, size=(8, 8), test=False)
    run = [
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=[8,8]",
        "data.batch_size=4",
        "data.num_workers=0",
        "model.hidden_sizes=[16]",
        "trainer.max_epochs=2",
    ]
    for cache in ("off", "memory", "disk"):
        run_train(tmp_path, *run, f"data.cache={cache}", f"run_name={cache}")
    final = {c: read_metrics(tmp_path / "runs" / c) for c in ("off", "memory", "disk")}
    assert (
        final["off"]["train/loss"] == final["memory"]["train/loss"] == final["disk"]["train/loss"]
    )
    weights = {
        c: torch.load(tmp_path / "checkpoints" / c / "last.pt", weights_only=True)["model"]
        for c in final
    }
    for name, tensor in weights["off"].items():
        assert torch.equal(tensor, weights["memory"][name])
        assert torch.equal(tensor, weights["disk"][name])


def test_evaluate_follows_no_stored_cache_folder(tmp_path):
    root = write_imagefolder(tmp_path / "images", per_class=4, size=(8, 8), test=False)
    stored_dir = tmp_path / "elsewhere"
    run_train(
        tmp_path,
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=[8,8]",
        "data.batch_size=4",
        "data.num_workers=0",
        "data.cache=disk",
        f"data.cache_dir={stored_dir}",
        "model.hidden_sizes=[8]",
        "trainer.max_epochs=1",
        "run_name=cached",
    )
    shutil.rmtree(stored_dir)
    best = tmp_path / "checkpoints" / "cached" / "best.pt"
    run_python(tmp_path, str(EVALUATE), f"ckpt={best}", "split=val")
    assert not stored_dir.exists() and not (root / ".torchloom-cache").exists()  # cache off
    run_python(tmp_path, str(EVALUATE), f"ckpt={best}", "split=val", "data.cache=memory")
    assert not stored_dir.exists()  # asked for here: built under data.root, not where stored
    assert [n.split("-")[0] for n in cache_files(root)] == ["train", "val"]  # every split


def test_a_stop_during_a_cache_build_ends_the_decoding_workers_at_once(tmp_path, monkeypatch):
    """DataLoader's shutdown waits up to 5 s for each busy worker in turn: with workers that
    never finish their batch, a stop ended the build only after 5 s a worker (35 s once, under
    load). The workers are ended at once now, and the build stops at the first batch read."""
    from utils.system.signals import Interrupted

    root = write_imagefolder(tmp_path, per_class=40, size=(8, 8))
    files = load(root, "off").splits["train"]
    monkeypatch.setattr(image_cache, "stop_requested", lambda: "SIGTERM")
    monkeypatch.setattr(image_cache, "DECODED_AT_ONCE", 1)
    slow = type(files)  # each worker's second image never arrives
    monkeypatch.setattr(slow, "__getitem__", _stuck_after_the_first(slow.__getitem__))
    started = time.perf_counter()
    with pytest.raises(Interrupted):
        list(image_cache.decoded_batches(files, 3, "train"))
    assert time.perf_counter() - started < 4.5  # one busy worker's join alone waits 5 s


def _stuck_after_the_first(getitem):
    def stuck(self, index):
        if index > 0:
            time.sleep(3600)
        return getitem(self, index)

    return stuck


def test_hidden_folders_and_files_in_an_image_folder_are_not_classes_or_images(tmp_path):
    """A .ipynb_checkpoints/ folder beside the class folders became a class, and macOS's
    ._name.png files images that do not decode."""
    root = write_imagefolder(tmp_path, per_class=4, size=(8, 8))
    plain = load(root, "off")
    hidden = root / "train" / ".ipynb_checkpoints"
    hidden.mkdir()
    first = next((root / "train").glob("*/*.png"))
    shutil.copy(first, hidden / first.name)
    (first.parent / f"._{first.name}").write_bytes(b"\x00\x05\x16\x07 resource fork")
    again = load(root, "off")
    assert again.targets.names == plain.targets.names
    assert len(again.splits["train"]) == len(plain.splits["train"])
