"""Image folders at in-memory speed? ``data.cache`` against the DataLoader path and the floor.

    python benchmarks/image_folder_speed.py            # about 5 minutes on 2 cores
    python benchmarks/image_folder_speed.py --smoke    # 200 images a folder: checks it runs

It writes its own image folders in the real on-disk formats (60,000 28×28 grey PNGs; 10,000
64×64 RGB JPEGs; a tenth of each is the val split) and trains a small MLP (one hidden layer of
32, so that the step costs little next to reading the data) on each, as
``python train.py data=imagefolder ...`` runs with the live bar and TensorBoard on, once per way
of holding the images:

- ``floor``:   the same decoded uint8 tensors handed to train.py as an in-memory dataset (the
               whole-tensor path of MNIST), read from a file written before the run;
- ``memory``:  ``data.cache=memory`` (the first such run builds the cache: its build time);
- ``disk``:    ``data.cache=disk``, the cache file memory-mapped;
- ``off``:     ``data.cache=off``, the DataLoader + PIL path with torchloom's default workers;
- ``shards``:  ``data=parquet`` over uint8-pixel shards on local disk (``shard.py``, 1,024-row
               groups), read ahead by torchloom's default workers in its block order;
- ``shards_png``: the same over PNG-encoded shards (decoded when read);
- ``shards_s3``: the pixel shards served by a real S3-compatible server on 127.0.0.1
               (``rclone serve s3``, when rclone is installed), ``data.shard_cache_gb=0``:
               every epoch reads them over the network anew;
- ``shards_s3_cached``: the same with the local cache of fetched row groups (the default for
               an object store): the first epoch fetches, the later ones read local disk.

For the S3 modes the first epoch's speed (over the network, nothing cached) is reported too.

Each run is its own process, so its peak resident memory is its own. An epoch's speed is the
run's own ``train/samples_per_second``; the figure is the median over the epochs after each
run's first, of ``--rounds`` runs per mode taken in turns (the shared machine's speed drifts).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import resource
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
FOLDERS = {  # name: (images, side, channels, format)
    "grey_png": (60_000, 28, 1, "png"),
    "rgb_jpeg": (10_000, 64, 3, "jpeg"),
}
MODES = ("floor", "memory", "disk", "off", "shards", "shards_png", "shards_s3", "shards_s3_cached")
S3_MODES = ("shards_s3", "shards_s3_cached")
ROWS_PER_GROUP = 1024


def write_folder(root: Path, count: int, side: int, channels: int, kind: str) -> None:
    """``count`` images in 10 class folders, a tenth of them in val/: each class a random
    prototype plus noise, so the MLP has something to learn."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    prototypes = rng.integers(0, 256, (10, side, side, channels))
    for index in range(count):
        split = "val" if (index // 10) % 10 == 0 else "train"
        label = index % 10
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        noise = rng.integers(-40, 41, (side, side, channels))
        pixels = np.clip(prototypes[label] + noise, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels)
        image.save(folder / f"{index}.{'png' if kind == 'png' else 'jpg'}", quality=90)


def load_floor(root: str, image_size, channels: int, **keys):
    """The floor's dataset: the decoded tensors written by :func:`write_floor`, as an
    in-memory dataset (the cache keys of the imagefolder config are ignored)."""
    import torch

    from data.batching.dataset import Batching, Data, Splits
    from data.batching.splits import TensorSplit
    from data.images.inputs import Pixels

    saved = torch.load(Path(root) / "floor.pt", weights_only=True)
    splits = Splits(*(TensorSplit(*saved[name]) for name in ("train", "val")))
    batching = {k: keys[k] for k in ("batch_size", "eval_batch_size", "mean", "std", "augment")}
    return Data("floor", splits, 10, Batching(**batching), inputs=Pixels())


def write_floor(root: Path, side: int, channels: int) -> None:
    """The images as the cache holds them, saved for the floor's run."""
    import torch

    sys.path.insert(0, str(ROOT))
    from data.images.imagefolder import load_imagefolder

    keys = {
        "batch_size": 128,
        "eval_batch_size": 512,
        "mean": [0.5],
        "std": [0.25],
        "augment": {"crop_padding": 0, "horizontal_flip": False},
    }
    data = load_imagefolder(str(root), [side, side], channels, cache="memory", **keys)
    splits = {
        name: (data.splits[name].inputs, data.splits[name].labels) for name in ("train", "val")
    }
    torch.save(splits, root / "floor.pt")


def overrides(root: Path, side: int, channels: int, mode: str, epochs: int) -> list[str]:
    mean = "[0.5]" if channels == 1 else "[0.5,0.5,0.5]"
    std = "[0.25]" if channels == 1 else "[0.25,0.25,0.25]"
    args = [
        "data=imagefolder",
        f"data.root={root}",
        f"data.image_size=[{side},{side}]",
        f"data.channels={channels}",
        "data.batch_size=128",
        f"data.mean={mean}",
        f"data.std={std}",
        "data.augment.crop_padding=0",
        "data.augment.horizontal_flip=false",
        "model=mlp",  # model=auto would choose the CNN for 28×28 images
        "model.hidden_sizes=[32]",
        "optim=adamw",
        "scheduler=none",
        "precision=fp32",
        "trainer.device=cpu",
        f"trainer.max_epochs={epochs}",
        f"run_name={mode}",
        "overwrite=true",
    ]
    if mode.startswith("shards"):
        where = f"s3://bucket/{root.name}" if mode in S3_MODES else root / f"{mode}_set"
        imagefolder_only = ("data=", "data.root", "data.image_size", "data.channels")
        kept = [a for a in args if not a.startswith(imagefolder_only)]
        cache = {
            "shards_s3": ["data.shard_cache_gb=0"],
            "shards_s3_cached": [f"data.shard_cache_dir={root / 'shard-cache'}"],
        }
        return ["data=parquet", f"data.path={where}", *kept, *cache.get(mode, [])]
    if mode == "floor":
        args.append("data._target_=image_folder_speed.load_floor")
    else:
        args.append(f"data.cache={mode}")
    return args


def write_shards(workdir: Path, root: Path, side: int, env: dict | None) -> None:
    """The folder as uint8-pixel and PNG shards on local disk (and the pixels on the S3
    server, when ``env`` points at one), by shard.py as a user runs it."""
    folder = ["data=imagefolder", f"data.root={root}", f"data.image_size=[{side},{side}]"]
    folder += ["data.cache=memory", f"rows_per_group={ROWS_PER_GROUP}"]
    outs = [(root / "shards_set", "pixels", None), (root / "shards_png_set", "png", None)]
    if env:
        outs.append((f"s3://bucket/{root.name}", "pixels", env))
    for out, images, extra in outs:
        result = subprocess.run(
            [sys.executable, str(ROOT / "shard.py"), *folder, f"out={out}", f"images={images}"],
            cwd=workdir,
            capture_output=True,
            text=True,
            env={**os.environ, **(extra or {})},
        )
        if result.returncode != 0:
            raise SystemExit(f"error: shard.py out={out}: {result.stderr.strip()[-2000:]}")


@contextlib.contextmanager
def s3_server(workdir: Path):
    """``rclone serve s3`` over a folder with a bucket, on 127.0.0.1; None without rclone."""
    import socket
    import time

    beside = Path(sys.executable).parent / "rclone"  # where pip put it, on PATH or not
    rclone = str(beside) if beside.is_file() else shutil.which("rclone")
    if rclone is None:
        yield None
        return
    (workdir / "store" / "bucket").mkdir(parents=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = [rclone, "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key", "bench,bench"]
    server = subprocess.Popen(
        [*serve, "--config", "/dev/null", str(workdir / "store")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("error: rclone serve s3 did not start") from None
            time.sleep(0.1)
    try:
        yield {
            "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


def child(args: list[str]) -> None:
    """One run of train.py in this process; prints its epochs' speed, peak memory and cache
    build time as one JSON line."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sys.path[:0] = [str(ROOT), str(HERE)]
    sys.argv = [str(ROOT / "train.py"), *args]
    os.environ["TTY_COMPATIBLE"] = "1"  # the live rich bar, as on a terminal
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        try:
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
        except SystemExit as exit_:
            if exit_.code:
                sys.stderr.write(shown.getvalue()[-3000:])
                raise
    run_name = next(a.split("=", 1)[1] for a in args if a.startswith("run_name="))
    events = EventAccumulator(str(Path("runs") / run_name))
    events.Reload()
    rates = [event.value for event in events.Scalars("train/samples_per_second")]
    built = [float(s) for s in re.findall(r"images decoded in ([\d.]+) s", shown.getvalue())]
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "rates": rates,
                "peak_rss_mb": round(own),
                "children_peak_rss_mb": round(workers),
                "build_seconds": round(sum(built), 2) if built else None,
            }
        )
    )


def run_mode(workdir: Path, args: list[str], env: dict | None = None) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if result.returncode != 0:
        raise SystemExit(f"error: {args}: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny folders, 2 epochs")
    parser.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up")
    parser.add_argument("--cases", nargs="+", choices=list(FOLDERS), default=list(FOLDERS))
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, in turns")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    epochs = 2 if args.smoke else args.epochs
    args.rounds = 1 if args.smoke else args.rounds
    with tempfile.TemporaryDirectory() as tmp, s3_server(Path(tmp)) as s3:
        workdir = Path(tmp)
        modes = MODES if s3 else MODES[: -len(S3_MODES)]
        for name in args.cases:
            count, side, channels, kind = FOLDERS[name]
            count = min(count, 200) if args.smoke else count
            root = workdir / name
            write_folder(root, count, side, channels, kind)
            write_floor(root, side, channels)
            write_shards(workdir, root, side, s3)
            shutil.rmtree(root / ".torchloom-cache")  # the memory run builds it, timed
            print(
                f"\n{name}: {count} {side}×{side}×{channels} {kind.upper()} images "
                f"({count - count // 10} train, {count // 10} val)",
                flush=True,
            )
            rates: dict[str, list[float]] = {m: [] for m in modes}
            results: dict[str, dict] = {}
            first_epoch: dict[str, float] = {}
            for _ in range(args.rounds):  # the modes take turns: the machine's speed drifts
                for mode in modes:
                    shutil.rmtree(root / "shard-cache", ignore_errors=True)  # fetched anew
                    run = overrides(root, side, channels, mode, epochs)
                    result = run_mode(workdir, run, s3 if mode in S3_MODES else None)
                    first_epoch.setdefault(mode, result["rates"][0])
                    rates[mode] += result["rates"][1:] or result["rates"]  # after the warm-up
                    results.setdefault(mode, result)  # the first memory run built the cache
                    results[mode]["peak_rss_mb"] = max(
                        results[mode]["peak_rss_mb"], result["peak_rss_mb"]
                    )
            speed = {m: statistics.median(r) for m, r in rates.items()}
            report = {
                "case": name,
                "images": count,
                "build_seconds": results["memory"]["build_seconds"],
            }
            for mode in modes:
                report[f"{mode}_samples_per_second"] = round(speed[mode], 1)
                report[f"{mode}_peak_rss_mb"] = results[mode]["peak_rss_mb"]
                report[f"{mode}_children_peak_rss_mb"] = results[mode]["children_peak_rss_mb"]
                print(
                    f"  {mode:<7} {speed[mode]:>10,.0f} samples/s  {speed[mode] / speed['floor']:.2f}× "
                    f"floor  {speed[mode] / speed['off']:.2f}× DataLoader  peak RSS "
                    f"{results[mode]['peak_rss_mb']} MB (+ child processes "
                    f"{results[mode]['children_peak_rss_mb']} MB)",
                    flush=True,
                )
            report["memory_to_floor"] = round(speed["memory"] / speed["floor"], 3)
            report["memory_to_dataloader"] = round(speed["memory"] / speed["off"], 2)
            report["disk_to_dataloader"] = round(speed["disk"] / speed["off"], 2)
            report["shards_to_memory"] = round(speed["shards"] / speed["memory"], 3)
            report["shards_png_to_dataloader"] = round(speed["shards_png"] / speed["off"], 2)
            if "shards_s3" in speed:
                report["shards_s3_to_shards"] = round(speed["shards_s3"] / speed["shards"], 3)
                for mode in S3_MODES:
                    report[f"{mode}_first_epoch_samples_per_second"] = round(first_epoch[mode], 1)
                    print(f"  {mode} first epoch: {first_epoch[mode]:,.0f} samples/s", flush=True)
                cached = speed["shards_s3_cached"] / speed["shards"]
                report["shards_s3_cached_to_shards"] = round(cached, 3)
            print(f"  cache build (first run): {report['build_seconds']} s", flush=True)
            print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
