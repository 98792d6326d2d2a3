"""Training throughput of torchloom against hand-written loops, in one process, on the same data,
model, optimizer, batch size and seed; and train.py's start-up time against ``import torch``.

    python benchmarks/loop_speed.py                      # every case
    python benchmarks/loop_speed.py --cases mlp --rounds 5
    python benchmarks/loop_speed.py --cases mlp mlp_ema cnn cnn_mix   # the EMA's and mixing's cost
    python benchmarks/loop_speed.py --cases mlp mlp_logged            # three loggers' cost
    python benchmarks/loop_speed.py --cases mlp mlp_callbacks         # a no-op callback's cost
    python benchmarks/loop_speed.py --cases mlp mlp_checkpointed      # last.pt every 50 steps
    python benchmarks/loop_speed.py --cases digits_mlflow --rounds 5  # MLflow's wall-time cost
    python benchmarks/loop_speed.py --cases image_cnn                 # cnn on a 28×28 PNG folder
    python benchmarks/loop_speed.py --cases image_cnn image_cnn_augmented  # crops, colours, erasing
    python benchmarks/loop_speed.py --cases table table_ensemble      # k = 8 members against 1
    python benchmarks/loop_speed.py --cases table table_ensemble table_ensemble_own  # own rows
    python benchmarks/loop_speed.py --cases text   # length buckets against padding to max_length

For each case it times, in one process:

1. floor       — a hand-written loop slicing whole tensors held in memory;
2. dataloader  — the same loop over ``DataLoader(TensorDataset)``, the usual way;
3. torchloom   — ``train.py``'s own ``main``, entered as the command line enters it, with the
                 progress bar live (TTY_COMPATIBLE=1) and TensorBoard logging on;
4. lightning   — only if it is installed (it is never a dependency).

Throughput is training samples per second per epoch, the optimizer step included and
evaluation excluded (for torchloom, its own ``train/samples_per_second``); every method trains
the batches torchloom cuts from the training split, its last, partial batch included when
torchloom keeps it. The floor's epochs
alternate with every other method's: floor, method, floor, method, ..., floor (for torchloom a
floor epoch runs where validation runs, outside its timed epochs). Each of a method's epochs is
compared with the mean of the floor epochs just before and just after it, so drift in the
machine's speed, which on a shared machine moves from second to second, is kept out of the
ratio; the ratio reported is the median over epochs, with the middle half of them beside it.
Each method's first epoch per round is warm-up and is not counted; ``--rounds`` repeats each
method's run (``--epochs`` epochs, by default a few seconds' worth: see ``EPOCHS``).
The last line of each case is machine-readable JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # train.py's own modules, also from a checkout not pip-installed

CASES = {
    # 784-256-10 MLP on 20,000 MNIST-shaped samples, batch 128, AdamW.
    "mlp": [
        "data=synthetic",
        "data.num_samples=20000",
        "data.shape=[1,28,28]",
        "data.batch_size=128",
        "model=mlp",
        "model.hidden_sizes=[256]",
        "model.dropout=0.0",
    ],
    # The cnn model on CIFAR-shaped 32×32×3 samples: 4 steps an epoch (about 1 s on 2 cores),
    # so that floor and torchloom epochs alternate faster than this machine's speed drifts.
    "cnn": [
        "data=synthetic",
        "data.num_samples=512",
        "data.val_size=256",
        "data.test_size=256",
        "data.shape=[3,32,32]",
        "data.batch_size=128",
        "model=cnn",
    ],
    # The default job: MLP on the bundled digits.
    "digits": [],
    # The cnn model on a folder of 28×28 grey PNG files written for the run (IMAGE_FOLDER),
    # read through the image cache as a user's folder is; no crops or flips, as the floor has
    # none.
    # A table's rows (20,000 of 64 numbers, 8 classes, written for the run): model=tabular as
    # one member; table_ensemble below is the same with k = 8 members.
    "table": [
        "data=tensors",
        "data.path={table_file}",
        "data.batch_size=256",
        "model=tabular",
        "model.ensemble=1",
    ],
    # 4,000 texts of 5 to 250 words (written for the run), a 2-layer Transformer: torchloom's
    # length-bucketed batches, cut to their longest text, against the floor's batches padded
    # to data.max_length (what a hand-written loop over fixed-size tensors holds).
    "text": [
        "data=text",
        "data.path={text_file}",
        "data.tokenizer_cache={text_cache}",
        "data.max_length=256",
        "data.vocab_size=2000",
        "model=text_transformer",
        "model.width=64",
        "model.layers=2",
        "model.heads=2",
    ],
    "image_cnn": [
        "data=imagefolder",
        "model=cnn",
        "data.root={image_folder}",
        "data.image_size=[28,28]",
        "data.augment.spatial=off",
        "data.batch_size=64",
    ],
}
IMAGE_FOLDER = {"classes": 4, "train": 128, "val": 16}  # PNG files per class and split
# The recipe's costs: a case with one feature on, against the same case without it, each
# measured against the same hand-written floor in this process (cost = 1 - ratio / base ratio).
IMAGE_AUGMENT = [
    "data.augment.random_resized_crop=true",
    "data.augment.color_jitter=0.4",
    "data.augment.random_erasing=0.25",
]
NOOP_CALLBACK = ["+callbacks.noop._target_=noop_callback.NoOp", "+callbacks.noop.mutable=true"]
FEATURE_CASES = {
    "mlp_ema": ("mlp", ["trainer.ema.decay=0.999"]),
    "cnn_mix": ("cnn", ["data.augment.mixup_alpha=0.2", "data.augment.cutmix_alpha=1.0"]),
    # Three loggers at once (pip install -e ".[mlflow]"): MLflow is sent points at checkpoints.
    "mlp_logged": ("mlp", ["logger=[tensorboard,csv,mlflow]"]),
    # A callback doing nothing on every hook, the step hooks too (benchmarks/noop_callback.py).
    "mlp_callbacks": ("mlp", NOOP_CALLBACK),
    "digits_callbacks": ("digits", NOOP_CALLBACK),
    # last.pt inside the epoch, every 50 of an epoch's 157 steps (a 0.8 MB checkpoint).
    "mlp_checkpointed": ("mlp", ["trainer.checkpoint_every_n_steps=50"]),
    # ImageNet-style augmentation per image on the cached path (data/augmentation/images.py).
    "image_cnn_augmented": ("image_cnn", IMAGE_AUGMENT),
    # k = 8 members sharing one MLP, one batched forward (models/tabular/), against one.
    "table_ensemble": ("table", ["model.ensemble=8"]),
    # The same 8 members each on rows of its own (model.share_batches=false): 8 embeddings.
    "table_ensemble_own": ("table", ["model.ensemble=8", "model.share_batches=false"]),
}
for _case, (_base, _extra) in FEATURE_CASES.items():
    CASES[_case] = [*CASES[_base], *_extra]
COMMON = ["optim=adamw", "scheduler=none", "precision=fp32", "trainer.device=cpu"]
# Epochs per run: each method trains for a few seconds or more (a cnn epoch takes about 1 s on
# 2 cores, an MLP epoch 0.3 s, a digits epoch of 19 steps 35 ms).
EPOCHS = {"mlp": 16, "cnn": 16, "digits": 40, "mlp_ema": 16, "cnn_mix": 16, "mlp_logged": 16}
EPOCHS.update(mlp_callbacks=16, digits_callbacks=40, image_cnn=8, mlp_checkpointed=16)
EPOCHS.update(image_cnn_augmented=8, table=8, table_ensemble=8, table_ensemble_own=8, text=4)


def write_table_file(path: Path) -> Path:
    """20,000 rows of 64 numbers in 8 classes (a class's prototype plus noise), as ``.pt``."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 8, (20_000,), generator=generator)
    prototypes = torch.randn(8, 64, generator=generator)
    rows = prototypes[labels] + torch.randn(20_000, 64, generator=generator)
    torch.save({"x": rows, "y": labels}, path)
    return path


def write_text_file(path: Path) -> Path:
    """4,000 texts of 5 to 250 words (log-uniform: most short, some long) in 2 classes, the
    class said by one word among the others, as a CSV."""
    import csv
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for _ in range(4000):
            label = rng.randrange(2)
            length = int(5 * 50 ** rng.random())
            text = [rng.choice(words) for _ in range(length)]
            text.insert(rng.randrange(length), ("good", "bad")[label])
            writer.writerow([" ".join(text), label])
    return path


def write_image_folder(root: Path) -> Path:
    """28×28 grey PNG files in class folders: a bright square whose place is the class, on
    noise, so the model has something to learn."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label in range(IMAGE_FOLDER["classes"]):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for index in range(IMAGE_FOLDER[split]):
                pixels = torch.randint(0, 100, (28, 28), generator=generator, dtype=torch.uint8)
                row, col = divmod(label, 2)
                pixels[4 + 12 * row : 12 + 12 * row, 4 + 12 * col : 12 + 12 * col] = 220
                Image.fromarray(pixels.numpy()).save(folder / f"{index}.png")
    return root


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import utils.config  # noqa: F401  (registers the schema)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides)


def build_case(overrides: list[str]):
    """The case's data (as torchloom builds it) and a fresh model and optimizer factory."""
    from hydra.utils import instantiate

    from utils.model.optim import build_optimizer

    cfg = compose(overrides)
    torch.manual_seed(cfg.seed)
    data = instantiate(cfg.data)

    from utils.model.modules import accepted_by, model_shapes

    shapes = model_shapes(data.input_shape, data.num_classes, data.model_hints())  # as train.py

    def model_and_optimizer():
        torch.manual_seed(cfg.seed)
        model = instantiate(cfg.model, **accepted_by(cfg.model._target_, shapes))
        return model, build_optimizer(model, cfg.optim)

    return cfg, data, model_and_optimizer


def normalised_train_split(data) -> tuple[torch.Tensor, torch.Tensor]:
    """What a hand-written loop would hold: the training split as normalised floats (images
    per channel, a table's rows per feature)."""
    split = data.splits["train"]
    pad_id = getattr(data.inputs, "pad_id", None)  # texts: token ids
    if pad_id is not None:  # padded to data.max_length as fixed-size tensors are
        ids = torch.full((len(split.inputs), data.input_shape[0]), pad_id)
        ids[:, : split.inputs.shape[1]] = split.inputs
        return ids, split.labels
    per_channel = (1, -1) + (1,) * (split.inputs.dim() - 2)
    mean = torch.tensor(data.mean).view(per_channel)
    std = torch.tensor(data.std).view(per_channel)
    unit = 255 if split.inputs.dtype == torch.uint8 else 1
    return (split.inputs.float() / unit - mean) / std, split.labels


def cross_entropy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The hand-written loss; k members' outputs [N, k, C] (model=tabular): each member's,
    against its own rows' labels [N, k] where each member draws its own batches."""
    if outputs.dim() == 3 and labels.dim() == 2:
        return F.cross_entropy(outputs.flatten(0, 1), labels.flatten())
    if outputs.dim() == 3:
        k = outputs.shape[1]
        outputs, labels = outputs.flatten(0, 1), labels.repeat_interleave(k)
    return F.cross_entropy(outputs, labels)


def epoch_batches(data, n: int) -> tuple[int, int]:
    """The batches and samples of a training epoch of ``n`` samples as torchloom cuts it (its
    last, partial batch kept: data/batching/batches.py), so that every method trains on the
    same batches and its samples per second counts the same work."""
    from data.batching.batches import BatchPlan

    batches = BatchPlan(batch_size=data.batch_size, train=True, seed=0).batch_count(n)
    return batches, min(n, batches * data.batch_size)


def floor_epochs(data, model_and_optimizer, seed: int) -> Iterator[float]:
    """The floor: one epoch per ``next``, its training samples per second."""
    inputs, labels = normalised_train_split(data)
    model, optimizer = model_and_optimizer()
    batch, n = data.batch_size, len(labels)
    count, samples = epoch_batches(data, n)
    members = getattr(model, "batch_members", 1)  # k members each on its own rows: [B, k]
    generator = torch.Generator().manual_seed(seed)
    while True:
        start = time.perf_counter()
        model.train()
        order = torch.stack([torch.randperm(n, generator=generator) for _ in range(members)], 1)
        order = order if members > 1 else order[:, 0]
        for i in range(count):
            rows = order[i * batch : (i + 1) * batch]
            loss = cross_entropy(model(inputs[rows]), labels[rows])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        yield samples / (time.perf_counter() - start)


def dataloader_epochs(data, model_and_optimizer, seed: int) -> Iterator[float]:
    """The same loop over ``DataLoader(TensorDataset)``: one epoch per ``next``."""
    inputs, labels = normalised_train_split(data)
    model, optimizer = model_and_optimizer()
    _, samples = epoch_batches(data, len(labels))
    loaders = [
        DataLoader(
            TensorDataset(inputs, labels),
            batch_size=data.batch_size,
            shuffle=True,
            drop_last=samples < len(labels),  # as torchloom: its partial batch, or none
            generator=torch.Generator().manual_seed(seed + member),
        )
        for member in range(getattr(model, "batch_members", 1))  # k members: a loader each
    ]
    while True:
        start = time.perf_counter()
        model.train()
        for batches in zip(*loaders, strict=True):
            images = stacked([images for images, _ in batches])
            targets = stacked([targets for _, targets in batches])
            loss = cross_entropy(model(images), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        yield samples / (time.perf_counter() - start)


def stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    """The k members' batches side by side, [B, k, ...]; one member's as it is."""
    return parts[0] if len(parts) == 1 else torch.stack(parts, 1)


def alternate(method: Iterator[float], floor: Iterator[float], epochs: int):
    """Floor, method, floor, ..., method, floor: one epoch each."""
    rates, floors = [], [next(floor)]
    for _ in range(epochs):
        rates.append(next(method))
        floors.append(next(floor))
    return rates, floors


def torchloom_run(
    overrides, epochs: int, workdir: Path, name: str, floor: Iterator[float] | None = None
):
    """``python train.py OVERRIDES``, run in this process: the script runs as ``__main__``.
    Returns its epochs' samples/s. With ``floor``, one floor epoch runs before it and one at
    each evaluation, outside torchloom's timed epochs (validation runs after every epoch by
    default, and the test at the end); their samples/s are returned too."""
    import runpy

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import utils.evaluation.judge

    argv = [
        str(ROOT / "train.py"),
        *overrides,
        f"trainer.max_epochs={epochs}",
        f"run_name={name}",
        f"paths.runs={workdir / 'runs'}",
        f"paths.checkpoints={workdir / 'checkpoints'}",
    ]
    floors = [next(floor)] if floor else []
    evaluate = utils.evaluation.judge.evaluate

    def floor_epoch_then_evaluate(*args, **kwargs):
        if floor:
            floors.append(next(floor))
        return evaluate(*args, **kwargs)

    saved_argv, saved_env = sys.argv, dict(os.environ)
    sys.argv = argv
    os.environ["TTY_COMPATIBLE"] = "1"  # the live rich bar, as on a terminal
    utils.evaluation.judge.evaluate = (
        floor_epoch_then_evaluate  # what the run's validation and test call
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        utils.evaluation.judge.evaluate = evaluate
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    events = EventAccumulator(str(workdir / "runs" / name))
    events.Reload()
    rates = [event.value for event in events.Scalars("train/samples_per_second")]
    return rates, floors[: len(rates) + 1]


def lightning_run(data, model_and_optimizer, epochs: int, floor: Iterator[float]):
    """Lightning's Trainer on the DataLoader, if installed; a floor epoch runs at each epoch
    end, outside its timed epochs."""
    try:
        import lightning as L
    except ImportError:
        return None
    inputs, labels = normalised_train_split(data)
    model, optimizer = model_and_optimizer()
    if getattr(model, "batch_members", 1) > 1:  # its Trainer takes one loader's batches
        return None
    rates: list[float] = []
    floors = [next(floor)]

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, _):
            images, targets = batch
            return cross_entropy(self.model(images), targets)

        def configure_optimizers(self):
            return optimizer

        def on_train_epoch_start(self):
            self.started = time.perf_counter()

        def on_train_epoch_end(self):
            rates.append(samples / (time.perf_counter() - self.started))
            floors.append(next(floor))

    _, samples = epoch_batches(data, len(labels))
    loader = DataLoader(
        TensorDataset(inputs, labels),
        batch_size=data.batch_size,
        shuffle=True,
        drop_last=samples < len(labels),  # as torchloom: its partial batch, or none
    )
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader)
    return rates, floors


def bench_case(name: str, rounds: int, epochs: int) -> dict:
    with tempfile.TemporaryDirectory() as images:
        if any("{image_folder}" in override for override in CASES[name]):
            write_image_folder(Path(images) / "folder")
        if any("{table_file}" in override for override in CASES[name]):
            write_table_file(Path(images) / "table.pt")
        if any("{text_file}" in override for override in CASES[name]):
            write_text_file(Path(images) / "texts.csv")
        places = {
            "image_folder": Path(images) / "folder",
            "table_file": Path(images) / "table.pt",
            "text_file": Path(images) / "texts.csv",
            "text_cache": Path(images) / "tokenizers",
        }
        overrides = [o.format(**places) for o in CASES[name]]
        return bench_overrides(name, [*overrides, *COMMON], rounds, epochs)


def bench_overrides(name: str, overrides: list[str], rounds: int, epochs: int) -> dict:
    cfg, data, model_and_optimizer = build_case(overrides)
    floor = floor_epochs(data, model_and_optimizer, cfg.seed)
    next(floor)  # warm-up
    samples: dict[str, list[float]] = {
        "floor": [],
        "dataloader": [],
        "torchloom": [],
        "lightning": [],
    }
    ratios: dict[str, list[float]] = {method: [] for method in samples}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            run_name = f"{name}-{round_index}"
            methods = {
                "torchloom": partial(torchloom_run, overrides, epochs, Path(tmp), run_name, floor),
                "dataloader": partial(
                    alternate, dataloader_epochs(data, model_and_optimizer, cfg.seed), floor, epochs
                ),
                "lightning": partial(lightning_run, data, model_and_optimizer, epochs, floor),
            }
            for method, run in methods.items():
                measured = run()
                if measured is None:
                    continue
                rates, floors = measured
                # Epoch k is compared with the floor epochs just before and just after it; the
                # method's first epoch is its warm-up.
                for k in range(1, len(rates)):
                    ratios[method].append(rates[k] / statistics.mean(floors[k : k + 2]))
                samples[method] += rates[1:]
                samples["floor"] += floors[1:]
    result = {"case": name, "threads": torch.get_num_threads(), "rounds": rounds}
    print(f"\n{name}: {data.sizes()['train']} training samples, batch {data.batch_size}")
    ratios["floor"] = [1.0]
    for method, rates in samples.items():
        if not rates:
            print(f"  {method:<11} not installed, skipped")
            continue
        median, ratio = statistics.median(rates), statistics.median(ratios[method])
        result[method] = round(median, 1)
        result[f"{method}_ratio"] = round(ratio, 3)
        if method == "floor":
            print(f"  {method:<11} {median:>10,.0f} samples/s   1.00× floor")
            continue
        low, _, high = statistics.quantiles(ratios[method] * 2, n=4)  # (×2: one epoch works)
        result[f"{method}_pairs"] = len(ratios[method])
        print(
            f"  {method:<11} {median:>10,.0f} samples/s   {ratio:5.2f}× floor  (middle half of "
            f"{len(ratios[method])} epochs: {low:.2f}–{high:.2f})"
        )
    print(json.dumps(result))
    return result


def startup(repeats: int) -> dict:
    """Wall time of ``python train.py trainer.max_epochs=0`` against ``import torch`` alone and
    against the start of a hand-written script (import torch, build a model and an AdamW):
    the first use of any ``torch.optim`` optimizer imports ``torch._dynamo``, in every
    program."""

    def wall(command: list[str], cwd: str) -> float:
        start = time.perf_counter()
        subprocess.run(command, cwd=cwd, check=True, capture_output=True)
        return time.perf_counter() - start

    hand_written = (
        "import torch; model = torch.nn.Linear(64, 10); "
        "torch.optim.AdamW(model.parameters()).zero_grad()"
    )
    commands = {
        "import_torch": [sys.executable, "-c", "import torch"],
        "hand_written_start": [sys.executable, "-c", hand_written],
        "train_max_epochs_0": [sys.executable, str(ROOT / "train.py"), "trainer.max_epochs=0"],
    }
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):  # interleaved, like the training cases
            for name, command in commands.items():
                seconds[name].append(wall(command, tmp))
    result = {"case": "startup"}
    result.update(
        {f"{name}_seconds": round(statistics.median(s), 3) for name, s in seconds.items()}
    )
    train = result["train_max_epochs_0_seconds"]
    result["ratio"] = round(train / result["import_torch_seconds"], 2)
    result["ratio_to_hand_written"] = round(train / result["hand_written_start_seconds"], 2)
    print(
        f"\nstart-up: import torch {result['import_torch_seconds']:.2f}s, a hand-written "
        f"script's start (import torch, build an AdamW) {result['hand_written_start_seconds']:.2f}s, "
        f"python train.py trainer.max_epochs=0 {train:.2f}s ({result['ratio']:.2f}× import torch, "
        f"{result['ratio_to_hand_written']:.2f}× the hand-written start)"
    )
    print(json.dumps(result))
    return result


def mlflow_overhead(repeats: int) -> dict:
    """Wall time of the default digits job, ``python train.py``, with ``logger=tensorboard``
    against ``logger=[tensorboard,mlflow]``, each a fresh process (MLflow's import, its
    store's start-up check and every send counted), alternated so the machine's drift is kept
    out; on one ``runs/``, so the store is made by the first MLflow run (timed apart)."""

    def wall(logger: str, cwd: str, name: str) -> float:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, str(ROOT / "train.py"), f"logger={logger}", f"run_name={name}"],
            cwd=cwd,
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - start

    loggers = {"tensorboard": "tensorboard", "mlflow": "[tensorboard,mlflow]"}
    seconds: dict[str, list[float]] = {name: [] for name in loggers}
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        first = wall(loggers["mlflow"], tmp, "store")  # makes runs/mlflow.db
        for index in range(repeats):
            before = wall(loggers["tensorboard"], tmp, f"tb-{index}")
            tracked = wall(loggers["mlflow"], tmp, f"mlflow-{index}")
            after = wall(loggers["tensorboard"], tmp, f"tb-after-{index}")
            seconds["tensorboard"] += [before, after]
            seconds["mlflow"].append(tracked)
            ratios.append(tracked / statistics.mean([before, after]))
    result = {
        "case": "digits_mlflow",
        "repeats": repeats,
        "first_mlflow_run_seconds": round(first, 2),
        **{f"{n}_seconds": round(statistics.median(s), 2) for n, s in seconds.items()},
        "ratio": round(statistics.median(ratios), 3),
    }
    print(
        f"\ndigits job wall time: logger=tensorboard {result['tensorboard_seconds']:.2f}s, "
        f"logger=[tensorboard,mlflow] {result['mlflow_seconds']:.2f}s: {result['ratio']:.2f}× "
        f"(median of {repeats} side-by-side ratios); the run that made the store "
        f"{first:.2f}s"
    )
    print(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=[*CASES, "startup"],
        choices=[*CASES, "startup", "digits_mlflow"],
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each method per case")
    parser.add_argument(
        "--epochs", type=int, help=f"epochs per round (1 is warm-up); default per case: {EPOCHS}"
    )
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    results = {}
    for case in args.cases:
        if case == "startup":
            startup(repeats=args.rounds)
        elif case == "digits_mlflow":
            mlflow_overhead(repeats=args.rounds)
        else:
            results[case] = bench_case(case, args.rounds, args.epochs or EPOCHS[case])
    for case, (base, extra) in FEATURE_CASES.items():
        if case in results and base in results:
            ratio, base_ratio = results[case]["torchloom_ratio"], results[base]["torchloom_ratio"]
            cost = 1 - ratio / base_ratio
            print(
                f"\n{case} ({' '.join(extra)}): {ratio:.3f}× floor against {base}'s "
                f"{base_ratio:.3f}×: costs {cost:.1%} of torchloom's throughput"
            )
            print(json.dumps({"case": f"{case}_cost", "cost": round(cost, 4)}))


if __name__ == "__main__":
    main()
