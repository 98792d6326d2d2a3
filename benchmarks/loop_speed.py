"""Training throughput of torchloom against hand-written loops, in one process, on the same data,
model, optimizer, batch size and seed; and train.py's start-up time against ``import torch``.

    python benchmarks/loop_speed.py                      # every case
    python benchmarks/loop_speed.py --cases mlp --rounds 5

For each case it times, round after round (interleaved, so drift in the machine's speed hits
every method alike):

1. floor       — a hand-written loop slicing whole tensors held in memory;
2. dataloader  — the same loop over ``DataLoader(TensorDataset)``, the usual way;
3. torchloom   — ``train.py``'s own ``main``, entered as the command line enters it, with the
                 progress bar live (TTY_COMPATIBLE=1) and TensorBoard logging on;
4. lightning   — only if it is installed (it is never a dependency).

Each method trains ``--epochs`` epochs per round (by default about a second's worth: see
``EPOCHS``); the first epoch of each is warm-up and is not counted. Throughput is training
samples per second per epoch, the optimizer step included and evaluation excluded (for
torchloom, its own ``train/samples_per_second``). In a round the floor runs first, then after
each method; a method's ratio is the median over rounds of its median epoch against the floor
runs just before and after it, which keeps drift in the machine's speed out of the ratio.
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
        "data=synthetic", "data.num_samples=20000", "data.shape=[1,28,28]", "data.batch_size=128",
        "model=mlp", "model.hidden_sizes=[256]", "model.dropout=0.0",
    ],
    # The cnn model on CIFAR-shaped 32×32×3 samples.
    "cnn": [
        "data=synthetic", "data.num_samples=1024", "data.shape=[3,32,32]", "data.batch_size=128",
        "model=cnn",
    ],
    # The default job: MLP on the bundled digits.
    "digits": [],
}  # fmt: skip
COMMON = ["optim=adamw", "scheduler=none", "precision=fp32", "trainer.device=cpu"]
# Epochs per round: enough that each method trains for about a second a round, so one slow
# epoch (the machine's speed drifts) moves the median little. A digits epoch is 19 steps.
EPOCHS = {"mlp": 6, "cnn": 3, "digits": 30}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import utils.config  # noqa: F401  (registers the schema)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides)


def build_case(overrides: list[str]):
    """The case's data (as torchloom builds it) and a fresh model and optimizer factory."""
    from hydra.utils import instantiate

    from utils.optim import build_optimizer

    cfg = compose(overrides)
    torch.manual_seed(cfg.seed)
    data = instantiate(cfg.data)

    def model_and_optimizer():
        torch.manual_seed(cfg.seed)
        model = instantiate(cfg.model, input_shape=data.input_shape, num_classes=data.num_classes)
        return model, build_optimizer(model, cfg.optim)

    return cfg, data, model_and_optimizer


def normalised_train_split(data) -> tuple[torch.Tensor, torch.Tensor]:
    """What a hand-written loop would hold: the training split as normalised floats."""
    split = data.splits["train"]
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    return (split.inputs.float() / 255 - mean) / std, split.labels


def floor_loop(data, model_and_optimizer, epochs: int, seed: int) -> list[float]:
    inputs, labels = normalised_train_split(data)
    model, optimizer = model_and_optimizer()
    batch, n = data.batch_size, len(labels)
    generator = torch.Generator().manual_seed(seed)
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=generator)
        for i in range(n // batch):
            rows = order[i * batch : (i + 1) * batch]
            loss = F.cross_entropy(model(inputs[rows]), labels[rows])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        rates.append((n // batch) * batch / (time.perf_counter() - start))
    return rates[1:]


def dataloader_loop(data, model_and_optimizer, epochs: int, seed: int) -> list[float]:
    inputs, labels = normalised_train_split(data)
    model, optimizer = model_and_optimizer()
    loader = DataLoader(
        TensorDataset(inputs, labels), batch_size=data.batch_size, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        model.train()
        for images, targets in loader:
            loss = F.cross_entropy(model(images), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        rates.append(len(loader) * data.batch_size / (time.perf_counter() - start))
    return rates[1:]


def torchloom_run(overrides: list[str], epochs: int, workdir: Path, name: str) -> list[float]:
    """``python train.py OVERRIDES``, run in this process: the script runs as ``__main__``."""
    import runpy

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    argv = [
        str(ROOT / "train.py"), *overrides, f"trainer.max_epochs={epochs}", f"run_name={name}",
        f"paths.runs={workdir / 'runs'}", f"paths.checkpoints={workdir / 'checkpoints'}",
    ]  # fmt: skip
    saved_argv, saved_env = sys.argv, dict(os.environ)
    sys.argv = argv
    os.environ["TTY_COMPATIBLE"] = "1"  # the live rich bar, as on a terminal
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    events = EventAccumulator(str(workdir / "runs" / name))
    events.Reload()
    return [event.value for event in events.Scalars("train/samples_per_second")][1:]


def lightning_run(data, model_and_optimizer, epochs: int) -> list[float] | None:
    try:
        import lightning as L
    except ImportError:
        return None
    inputs, labels = normalised_train_split(data)
    model, optimizer = model_and_optimizer()
    rates: list[float] = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, _):
            images, targets = batch
            return F.cross_entropy(self.model(images), targets)

        def configure_optimizers(self):
            return optimizer

        def on_train_epoch_start(self):
            self.started = time.perf_counter()

        def on_train_epoch_end(self):
            steps = len(labels) // data.batch_size
            rates.append(steps * data.batch_size / (time.perf_counter() - self.started))

    loader = DataLoader(TensorDataset(inputs, labels), batch_size=data.batch_size, shuffle=True,
                        drop_last=True)  # fmt: skip
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Module(), loader)
    return rates[1:]


def bench_case(name: str, rounds: int, epochs: int) -> dict:
    overrides = [*CASES[name], *COMMON]
    cfg, data, model_and_optimizer = build_case(overrides)
    samples: dict[str, list[float]] = {
        "floor": [],
        "dataloader": [],
        "torchloom": [],
        "lightning": [],
    }
    ratios: dict[str, list[float]] = {method: [] for method in samples}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            # Floor, method, floor, method, ..., floor: each method is compared with the floor
            # runs just before and just after it, so a machine that speeds up or slows down
            # during the round does not bias its ratio.
            run_name = f"{name}-{round_index}"
            methods = {
                "torchloom": partial(torchloom_run, overrides, epochs, Path(tmp), run_name),
                "dataloader": partial(dataloader_loop, data, model_and_optimizer, epochs, cfg.seed),
                "lightning": partial(lightning_run, data, model_and_optimizer, epochs),
            }
            before = floor_loop(data, model_and_optimizer, epochs, cfg.seed)
            samples["floor"] += before
            ratios["floor"].append(1.0)
            for method, run in methods.items():
                rates = run() or []
                if not rates:
                    continue
                after = floor_loop(data, model_and_optimizer, epochs, cfg.seed)
                samples["floor"] += after
                samples[method] += rates
                floor = statistics.median(before + after)
                ratios[method].append(statistics.median(rates) / floor)
                before = after
    result = {"case": name, "threads": torch.get_num_threads(), "rounds": rounds}
    print(f"\n{name}: {data.sizes()['train']} training samples, batch {data.batch_size}")
    for method, rates in samples.items():
        if not rates:
            print(f"  {method:<11} not installed, skipped")
            continue
        median, ratio = statistics.median(rates), statistics.median(ratios[method])
        result[method] = round(median, 1)
        result[f"{method}_ratio"] = round(ratio, 3)
        spread = f"{min(ratios[method]):.2f}–{max(ratios[method]):.2f}"
        print(
            f"  {method:<11} {median:>10,.0f} samples/s   {ratio:5.2f}× floor  (rounds: {spread})"
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
    print(f"\nstart-up: import torch {result['import_torch_seconds']:.2f}s, a hand-written "
          f"script's start (import torch, build an AdamW) {result['hand_written_start_seconds']:.2f}s, "
          f"python train.py trainer.max_epochs=0 {train:.2f}s ({result['ratio']:.2f}× import torch, "
          f"{result['ratio_to_hand_written']:.2f}× the hand-written start)")  # fmt: skip
    print(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=[*CASES, "startup"],
                        choices=[*CASES, "startup"])  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case")
    parser.add_argument("--epochs", type=int, help="epochs per round (1 is warm-up); "
                        f"default per case: {EPOCHS}")  # fmt: skip
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    for case in args.cases:
        if case == "startup":
            startup(repeats=args.rounds)
        else:
            bench_case(case, args.rounds, args.epochs or EPOCHS[case])


if __name__ == "__main__":
    main()
