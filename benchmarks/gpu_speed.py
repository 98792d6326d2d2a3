"""Training speed on one CUDA GPU, torchloom against a hand-written loop of the same
configuration, in one process and on the same data, model, optimizer, batch size and seed.

    python benchmarks/gpu_speed.py               # a few minutes on one GPU
    python benchmarks/gpu_speed.py --smoke       # tiny sizes, any device: checks the script runs

1. ResNet-18 on CIFAR-shaped (3×32×32) synthetic data, batch 256: fp32, fp16 and bf16, each
   with and without ``channels_last``; ``torch.compile`` on top for the fastest precision
   (compiling is the slow part of the script: one compile per run). The hand-written loop holds
   the data on the GPU, slices a permutation, and uses one autocast and one GradScaler.
2. The data path on MNIST-sized data (60,000 × 1×28×28, the 784-256-10 MLP, batch 128): the
   whole-tensor, GPU-resident path against ``DataLoader(TensorDataset)`` with pinned memory,
   each in a hand-written loop, and torchloom.
3. The fp16 GradScaler path end to end: ``python train.py precision=fp16`` as a user runs it,
   with its exit code, test accuracy, skipped steps and final loss scale.
4. DDP against FSDP (``trainer.strategy``) through torchrun: speed and the bytes each process
   holds, on every GPU here, or (with ``--smoke --device cpu``) 2 CPU processes over gloo.
5. A language model: ``experiment=shakespeare_char`` (nanoGPT's GPU configuration, bf16 where
   the GPU has it) through train.py for ``--gpt-steps`` steps, its ``train/tokens_per_second``
   and whole-split ``test/loss``, against a hand-written loop of the same GPT (models/gpt.py),
   optimizer and batches of random windows, timed after warm-up.

The first epoch of every run is warm-up (cuDNN autotuning, compiling) and is not counted;
images/s is the median of the other epochs, each timed after a device sync. For torchloom it is
the run's own ``train/samples_per_second``. One JSON line per case ends the output.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop_speed import ROOT, build_case, epoch_batches, normalised_train_split, torchloom_run

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
COMMON = ["optim=adamw", "scheduler=none", "trainer.val_every_n_epochs=1000"]


def resnet_overrides(samples: int, batch: int = 256) -> list[str]:
    return [
        "data=synthetic",
        f"data.num_samples={samples}",
        "data.shape=[3,32,32]",
        f"data.val_size={batch}",
        f"data.test_size={batch}",
        f"data.batch_size={batch}",
        "model=resnet18",
        *COMMON,
    ]


def mnist_overrides(samples: int) -> list[str]:
    return [
        "data=synthetic",
        f"data.num_samples={samples}",
        "data.shape=[1,28,28]",
        "data.val_size=256",
        "data.test_size=256",
        "data.batch_size=128",
        "model=mlp",
        "model.hidden_sizes=[256]",
        "model.dropout=0.0",
        *COMMON,
    ]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Setting:
    """How one case runs: where, at which precision and layout, compiled or not, how long."""

    device: torch.device
    precision: str
    channels_last: bool
    compile_model: bool
    epochs: int


def hand_written(
    data, model_and_optimizer, setting: Setting, seed: int, loader: bool = False
) -> list[float]:
    """The loop a careful user writes by hand: one autocast, one GradScaler (enabled for fp16
    only), the data either whole on the device or from a pinned-memory DataLoader."""
    device, precision, channels_last = setting.device, setting.precision, setting.channels_last
    compile_model, epochs = setting.compile_model, setting.epochs
    inputs, labels = normalised_train_split(data)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model, optimizer = model_and_optimizer()
    model = model.to(device, memory_format=memory_format)  # moves the optimizer's parameters too
    step_model = torch.compile(model) if compile_model else model
    dtype = DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    batch, n = data.batch_size, len(labels)
    count, samples = epoch_batches(data, n)  # torchloom's batches, its last partial one too
    if loader:
        batches_of = DataLoader(
            TensorDataset(inputs, labels),
            batch_size=batch,
            shuffle=True,
            drop_last=samples < n,  # as torchloom: its partial batch, or none
            pin_memory=device.type == "cuda",
            num_workers=2,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(seed),
        )
    else:
        inputs = inputs.to(device).contiguous(memory_format=memory_format)
        labels = labels.to(device)
    generator = torch.Generator().manual_seed(seed)
    rates = []
    for _ in range(epochs):
        sync(device)
        start = time.perf_counter()
        model.train()
        if loader:
            epoch = (
                (
                    x.to(device, non_blocking=True).contiguous(memory_format=memory_format),
                    y.to(device, non_blocking=True),
                )
                for x, y in batches_of
            )
        else:
            order = torch.randperm(n, generator=generator).to(device)
            epoch = (
                (
                    inputs[order[i * batch : (i + 1) * batch]],
                    labels[order[i * batch : (i + 1) * batch]],
                )
                for i in range(count)
            )
        for images, targets in epoch:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = F.cross_entropy(step_model(images), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        loss.item()  # waits for the device
        rates.append(samples / (time.perf_counter() - start))
    return rates[1:]


def compare(
    name: str, overrides: list[str], setting: Setting, workdir: Path, loader_too: bool = False
) -> dict:
    device, precision, channels_last = setting.device, setting.precision, setting.channels_last
    compile_model, epochs = setting.compile_model, setting.epochs
    config = [
        *overrides,
        f"precision={precision}",
        f"trainer.device={device}",
        f"trainer.channels_last={str(channels_last).lower()}",
        f"trainer.compile={str(compile_model).lower()}",
    ]
    cfg, data, model_and_optimizer = build_case(config)
    rates = {
        "hand_written": hand_written(data, model_and_optimizer, setting, cfg.seed),
    }
    if loader_too:
        rates["dataloader"] = hand_written(
            data, model_and_optimizer, setting, cfg.seed, loader=True
        )
    rates["torchloom"] = torchloom_run(config, epochs, workdir, name)[0][1:]
    floor = statistics.median(rates["hand_written"])
    result = {
        "case": name,
        "precision": precision,
        "channels_last": channels_last,
        "compile": compile_model,
        "batch": data.batch_size,
    }
    for method, values in rates.items():
        result[f"{method}_images_per_second"] = round(statistics.median(values), 1)
        result[f"{method}_ratio"] = round(statistics.median(values) / floor, 3)
    shown = "  ".join(
        f"{method} {result[f'{method}_images_per_second']:>9,.0f}/s ({result[f'{method}_ratio']:.2f}×)"
        for method in rates
    )
    print(f"{name:<34} {shown}", flush=True)
    return result


def fp16_end_to_end(device: torch.device, overrides: list[str], workdir: Path) -> dict:
    """``python train.py precision=fp16`` in a subprocess, exactly as a user starts it."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        *overrides,
        "precision=fp16",
        f"trainer.device={device}",
        "trainer.max_epochs=3",
        "run_name=fp16",
        f"paths.runs={workdir / 'runs'}",
        f"paths.checkpoints={workdir / 'checkpoints'}",
    ]
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    result = {
        "case": "fp16_end_to_end",
        "exit_code": finished.returncode,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    if finished.returncode != 0:
        result["error"] = (finished.stderr.strip().splitlines() or ["(no output)"])[-1]
    else:
        metrics = json.loads((workdir / "runs" / "fp16" / "metrics.json").read_text())
        last = torch.load(
            workdir / "checkpoints" / "fp16" / "last.pt", weights_only=True, map_location="cpu"
        )
        result.update(
            {
                "images_per_second": round(metrics["train/samples_per_second"], 1),
                "test_acc": metrics["test/acc"],
                "train_loss": metrics["train/loss"],
                "skipped_steps": metrics["train/skipped_steps"],
                "loss_scale": last["scaler"].get("scale"),
            }
        )
    print(f"fp16 end to end through train.py: {result}", flush=True)
    return result


def gpt_case(device: torch.device, workdir: Path, steps: int, smoke: bool) -> dict:
    """torchloom's nanoGPT GPU preset against a hand-written loop of the same model."""
    sys.path.insert(0, str(ROOT))
    from data.corpus.corpus import BUNDLED, corpus_text
    from data.corpus.vocabulary import fitted
    from models.gpt import GPT

    sizes = dict(n_layer=2, n_head=2, n_embd=64, block_size=64) if smoke else {}
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    overrides = ["experiment=shakespeare_char", f"trainer.max_steps={steps}"]
    overrides += [f"trainer.val_every_n_steps={steps}", f"trainer.device={device}"]
    overrides += [f"model.{k}={v}" for k, v in sizes.items()]
    overrides += ["precision=bf16" if bf16 else "precision=fp32", "run_name=gpt"]
    overrides += ["data.batch_size=8"] if smoke else []
    command = [sys.executable, str(ROOT / "train.py"), *overrides]
    command += [f"paths.runs={workdir / 'runs'}", f"paths.checkpoints={workdir / 'checkpoints'}"]
    finished = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    if finished.returncode != 0:
        return {"case": "gpt", "error": (finished.stderr.strip().splitlines() or ["?"])[-1]}
    metrics = json.loads((workdir / "runs" / "gpt" / "metrics.json").read_text())
    text = corpus_text(BUNDLED, "text")
    train = fitted("char", text, text, "auto", "corpus").encode(text[: int(len(text) * 0.9)], "t")
    shape = {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, **sizes}
    batch, window = (8 if smoke else 64), shape["block_size"]
    torch.manual_seed(0)
    model = GPT(65, window, shape["n_layer"], shape["n_head"], shape["n_embd"], 0.2, False)
    model = model.to(device)
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), **fused)
    tokens = train.to(device)
    span = torch.arange(window + 1, device=device)
    timed, start = 0, 0.0
    for step in range(steps):
        if step == min(10, steps // 2):
            sync(device)
            start, timed = time.perf_counter(), 0
        rows = torch.randint(len(tokens) - window - 1, (batch, 1), device=device) + span
        windows = tokens[rows]
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            logits = model(windows[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timed += 1
    sync(device)
    hand = timed * batch * window / (time.perf_counter() - start)
    result = {
        "case": "gpt_shakespeare_char",
        "steps": steps,
        "torchloom_tokens_per_second": round(metrics["train/tokens_per_second"]),
        "hand_written_tokens_per_second": round(hand),
        "ratio": round(metrics["train/tokens_per_second"] / hand, 3),
        "val_loss_whole_split": metrics["test/loss"],
    }
    print(f"GPT (experiment=shakespeare_char): {result}", flush=True)
    return result


def free_port() -> int:
    """A port nothing listens on now (the OS picks it), for torchrun's rendezvous."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


WHY = re.compile(r"(?i)terminate called|what\(\):|error|exception|abort|timed? ?out")


def strategies(device: torch.device, overrides: list[str], workdir: Path, epochs: int) -> list:
    """``trainer.strategy=ddp`` against ``fsdp`` through torchrun, on every GPU here (one
    process each), or 2 processes with gloo on the CPU: the speed and the bytes each process
    holds (parameters, optimizer state; on CUDA the peak), from each run's metrics.json. On
    the CPU the model is an MLP of three 1,024-wide blocks on the bundled digits."""
    processes = torch.cuda.device_count() if device.type == "cuda" else 2
    job = overrides or ["model=mlp", "model.hidden_sizes=[1024,1024,1024]", "precision=fp32"]
    rows = []
    for strategy in ("ddp", "fsdp"):
        run = f"strategy_{strategy}"
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
        launch += [
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(ROOT / "train.py"),
        ]
        args = [*job, f"trainer.device={device.type}", f"trainer.max_epochs={epochs}"]
        args += [f"trainer.strategy={strategy}", f"run_name={run}", "logger=[]"]
        done = subprocess.run([*launch, *args], cwd=workdir, capture_output=True, text=True)
        if done.returncode != 0:  # the processes' own words first: torchrun's summary is long
            said = [line for line in done.stderr.splitlines() if WHY.search(line)][:20]
            sys.exit(f"error: {strategy}: {chr(10).join(said)}\n{done.stderr.strip()[-2000:]}")
        metrics = json.loads((workdir / "runs" / run / "metrics.json").read_text())
        row = {"case": f"strategy_{strategy}", "processes": processes}
        row |= {k: v for k, v in metrics.items() if k.startswith("memory/")}
        row["samples_per_second"] = round(metrics["train/samples_per_second"], 1)
        rows.append(row)
        shown = ", ".join(f"{k.removeprefix('memory/')} {v:,}" for k, v in row.items() if "/" in k)
        print(f"  {strategy}: {row['samples_per_second']:,} samples/s; {shown}", flush=True)
    ratio = rows[1]["memory/param_bytes_per_process"] / rows[0]["memory/param_bytes_per_process"]
    print(f"  fsdp holds {ratio:.2f}× the parameter bytes per process of ddp", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, no compile, fp32 only: proves the script runs",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up")
    parser.add_argument("--gpt-steps", type=int, default=500, help="the language model's steps")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA GPU here; this benchmark needs one (or --smoke --device cpu)")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {name}", flush=True)
    if args.smoke:  # 2 ResNet steps of 16 per epoch: seconds on a CPU
        precisions, compiled, epochs = ["fp32"], [], 2
        resnet_samples, resnet_batch, mnist_samples = 32, 16, 512
    else:
        precisions = ["fp32", "fp16"]
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            precisions.append("bf16")
        compiled, epochs = [precisions[-1]], args.epochs
        resnet_samples, resnet_batch, mnist_samples = 10240, 256, 60000
    resnet = resnet_overrides(resnet_samples, resnet_batch)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        print(f"\nResNet-18, 3×32×32, batch {resnet_batch}", flush=True)
        for precision in precisions:
            for channels_last in (False, True):
                for compile_model in (False, True) if precision in compiled else (False,):
                    name = (
                        f"resnet18 {precision}{' channels_last' if channels_last else ''}"
                        f"{' compile' if compile_model else ''}"
                    )
                    setting = Setting(device, precision, channels_last, compile_model, epochs)
                    results.append(compare(name.replace(" ", "_"), resnet, setting, workdir))
        print("\nData path: MNIST-sized, MLP 784-256-10, batch 128, fp32", flush=True)
        setting = Setting(device, "fp32", False, False, epochs)
        results.append(
            compare(
                "mnist_mlp_data_path",
                mnist_overrides(mnist_samples),
                setting,
                workdir,
                loader_too=True,
            )
        )
        if not args.smoke:
            print(flush=True)
            results.append(fp16_end_to_end(device, resnet, workdir))
        print("\nDDP against FSDP (trainer.strategy), through torchrun", flush=True)
        results += strategies(device, resnet if device.type == "cuda" else [], workdir, epochs)
        print("\nA GPT on tiny Shakespeare (experiment=shakespeare_char)", flush=True)
        results.append(gpt_case(device, workdir, 20 if args.smoke else args.gpt_steps, args.smoke))
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
