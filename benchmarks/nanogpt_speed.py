"""torchloom's ``experiment=shakespeare_char_cpu`` beside nanoGPT's own ``train.py`` running the
CPU command of its README, on the same tiny Shakespeare split, in one benchmark run.

    python benchmarks/nanogpt_speed.py --nanogpt ~/src/nanoGPT            # a checkout you provide
    python benchmarks/nanogpt_speed.py --nanogpt ~/src/nanoGPT --max-steps 500 --rounds 2
    python benchmarks/nanogpt_speed.py --nanogpt ~/src/nanoGPT \
        --presets shakespeare_char_cpu shakespeare_char_cpu_tuned   # ours at the same cost, LR 3e-3
    python benchmarks/nanogpt_speed.py --nanogpt ~/src/nanoGPT --their-windows  # + nanoGPT's draws

Both train a 4-layer, 4-head, 128-wide GPT with a 64-character context on batches of 12, for
``--max-steps`` steps (2,000, the README's), lr 1e-3 to 1e-4 on a cosine after 100 warmup steps,
β2 0.99, weight decay 0.1, clipping at 1.0, dropout 0, in float32 on the CPU, with the threads
torch takes by default. nanoGPT's data are written here as its ``prepare.py`` writes them
(uint16 ids of the sorted characters; the first 90% of the characters train, the last 10%
validate) from the corpus torchloom bundles, in a folder of this run; nothing in the checkout
is changed, and none of its code is copied: its ``train.py`` runs as its README says, in that
folder.

Both run at one seed (``--seed``, nanoGPT's 1337 by default; another seed reaches nanoGPT's
``torch.manual_seed(1337)`` through a launcher that shifts the number it is given, its code
unchanged): built after it, torchloom's GPT holds the initial weights nanoGPT's holds (checked
at the start, printed), so the two runs part only in the training windows they draw (both 12
random starts a step, with replacement: nanoGPT's from torch's global generator, torchloom's
from its own, which a resume restores) and in how each is written. Over several seeds the two
tools' losses compare as distributions, not as one draw each. With ``--their-windows`` the first
preset also trains on the very windows nanoGPT's run draws (replayed here from its seed: its
model's initialisation, its first batch, then each step's next batch and, every
``eval_interval`` steps, its loss estimate's batches, all from torch's global generator), so
the two runs part only in how each is written: their losses then compare to the last digit.

Reported, for each tool:

- training tokens per second: for nanoGPT, the tokens of its logged iterations (12 × 64
  each) over the sum of their ``time``, leaving out those that evaluated or saved; for
  torchloom, its own ``train/tokens_per_second``: its training tokens over the time of its
  epochs, evaluation left out (both means, over every step but nanoGPT's first);
- the validation loss over the whole val split, in consecutive 64-character windows (the
  last one shorter), of the checkpoint each run keeps (nanoGPT's ``ckpt.pt``, torchloom's
  best.pt), computed here the same way for both, beside nanoGPT's own 20-batch estimate;
- the wall time of the whole command.

The last line is machine-readable JSON.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pickle
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "assets" / "tinyshakespeare.txt.gz"
WINDOW = 64
NANOGPT_SEED = 1337  # its train.py's torch.manual_seed(1337 + seed_offset), offset 0 on one process
BATCH = 12  # the command's --batch_size
EVAL_INTERVAL, EVAL_ITERS = 250, 20  # its config file's eval_interval, the command's eval_iters
VOCABULARY = 65  # tiny Shakespeare's distinct characters


# nanoGPT's train.py run unchanged, its torch.manual_seed(1337 + offset) shifted to SEED + offset.
SEEDED = (
    "import runpy, sys, torch; seed = int(sys.argv.pop(1)); given = torch.manual_seed; "
    "torch.manual_seed = lambda s: given(s - 1337 + seed); sys.argv.pop(0); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def nanogpt_command(nanogpt: Path, steps: int, seed: int) -> list[str]:
    """nanoGPT's README CPU command ("I only have a macbook"), ``steps`` iterations, at
    ``seed`` (its own 1337 as it is; another through :data:`SEEDED`)."""
    launcher = [] if seed == NANOGPT_SEED else ["-c", SEEDED, str(seed)]
    return [
        sys.executable,
        *launcher,
        str(nanogpt / "train.py"),
        str(nanogpt / "config" / "train_shakespeare_char.py"),
        "--device=cpu",
        "--compile=False",
        "--eval_iters=20",
        "--log_interval=1",
        "--block_size=64",
        "--batch_size=12",
        "--n_layer=4",
        "--n_head=4",
        "--n_embd=128",
        f"--max_iters={steps}",
        f"--lr_decay_iters={steps}",
        "--dropout=0.0",
    ]


def torchloom_command(steps: int, workdir: Path, preset: str, seed: int) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "train.py"),
        f"experiment={preset}",
        f"seed={seed}",
        f"trainer.max_steps={steps}",
        "run_name=bench",
        f"paths.runs={workdir / 'runs'}",
        f"paths.checkpoints={workdir / 'checkpoints'}",
        "logger=csv",
    ]


def prepared(folder: Path) -> tuple[np.ndarray, dict]:
    """nanoGPT's data/shakespeare_char/{train,val}.bin and meta.pkl as its prepare.py writes
    them, under ``folder``; returns the val ids and the character table."""
    text = gzip.decompress(CORPUS.read_bytes()).decode("utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    cut = int(len(text) * 0.9)
    data = folder / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    ids[:cut].tofile(data / "train.bin")
    ids[cut:].tofile(data / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))
    return ids[cut:].astype(np.int64), meta


def whole_split_loss(logits_of, val: np.ndarray) -> float:
    """Nats per token over every token of ``val``: consecutive windows of 64, the tail last."""
    tokens = torch.from_numpy(val)
    full = (len(tokens) - 1) // WINDOW
    windows = tokens[: full * WINDOW + 1].unfold(
        0, WINDOW + 1, WINDOW
    )  # [full, 65], overlapping by one
    parts = [windows[lo : lo + 64] for lo in range(0, full, 64)]
    if (len(tokens) - 1) % WINDOW:
        parts.append(tokens[full * WINDOW :][None])
    total, count = 0.0, 0
    with torch.inference_mode():
        for batch in parts:
            logits = logits_of(batch[:, :-1])
            targets = batch[:, 1:].flatten()
            total += float(F.cross_entropy(logits.flatten(0, 1), targets, reduction="sum"))
            count += targets.numel()
    return total / count


# The preset's GPT, in both tools' keyword names.
SIZES = {"block_size": WINDOW, "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0}


def nanogpt_model(nanogpt: Path):
    """nanoGPT's own ``GPT`` and ``GPTConfig``, imported from the checkout."""
    sys.path.insert(0, str(nanogpt))
    from model import GPT, GPTConfig

    sys.path.pop(0)
    return GPT, GPTConfig


def same_initial_weights(nanogpt: Path, seed: int) -> bool:
    """Whether torchloom's GPT (models/gpt.py) built after ``seed`` holds the weights nanoGPT's
    GPT holds when built after its seeding at ``seed``, at the preset's sizes (train.py seeds,
    then builds the data, which draws nothing, then the model)."""
    GPT, GPTConfig = nanogpt_model(nanogpt)
    sys.path.insert(0, str(ROOT))
    from models.gpt import GPT as Ours

    torch.manual_seed(seed)
    theirs = GPT(GPTConfig(vocab_size=VOCABULARY, bias=False, **SIZES))
    torch.manual_seed(seed)
    ours = Ours(vocab_size=VOCABULARY, bias=False, **SIZES)
    pairs = zip(theirs.parameters(), ours.parameters(), strict=False)
    return all(a.shape == b.shape and torch.equal(a, b) for a, b in pairs)


def run_nanogpt(nanogpt: Path, steps: int, workdir: Path, val: np.ndarray, seed: int) -> dict:
    folder = workdir / "nanogpt"
    folder.mkdir()
    prepared(folder)
    shutil.copy(nanogpt / "configurator.py", folder)  # train.py execs it from the working folder
    env = {**os.environ, "PYTHONPATH": str(nanogpt)}
    start = time.perf_counter()
    done = subprocess.run(
        nanogpt_command(nanogpt, steps, seed), cwd=folder, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(
            f"nanoGPT's train.py failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    lines = done.stdout.splitlines()
    busy = set()  # iterations that evaluated (and maybe saved) before they stepped
    for line in lines:
        if match := re.match(r"step (\d+): train loss", line):
            busy.add(int(match.group(1)))
    times = [
        float(m.group(2))
        for line in lines
        if (m := re.match(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", line))
        and int(m.group(1)) not in busy
        and int(m.group(1)) > 0
    ]
    estimates = [
        float(m.group(1)) for line in lines if (m := re.search(r"val loss ([\d.]+)", line))
    ]
    GPT, GPTConfig = nanogpt_model(nanogpt)  # to read its own checkpoint
    stored = torch.load(
        folder / "out-shakespeare-char" / "ckpt.pt", map_location="cpu", weights_only=True
    )
    model = GPT(GPTConfig(**stored["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in stored["model"].items()})
    model.eval()

    def logits_of(x: torch.Tensor) -> torch.Tensor:
        return model(x, x)[0]  # with targets: the logits of every position

    return {
        "tokens_per_second": 12 * WINDOW * len(times) / (sum(times) / 1000),
        "val_loss_whole_split": whole_split_loss(logits_of, val),
        "val_loss_own_estimate": min(estimates) if estimates else math.nan,
        "wall_seconds": wall,
    }


def their_windows(nanogpt: Path, split: Path, seed: int, steps: int) -> torch.Tensor:
    """The start of every training window nanoGPT's train.py reads in ``steps`` steps at
    ``seed``, its draws replayed in their order from torch's global generator."""
    data = split / "data" / "shakespeare_char"
    train, val = ((data / f"{name}.bin").stat().st_size // 2 for name in ("train", "val"))
    GPT, GPTConfig = nanogpt_model(nanogpt)
    torch.manual_seed(seed)
    GPT(GPTConfig(vocab_size=VOCABULARY, bias=False, **SIZES))  # its initialisation draws first
    batches = [torch.randint(train - WINDOW, (BATCH,))]  # its first batch, before the loop
    for step in range(steps - 1):
        if step % EVAL_INTERVAL == 0:  # its loss estimate: train batches, then val batches
            for length in (train, val):
                for _ in range(EVAL_ITERS):
                    torch.randint(length - WINDOW, (BATCH,))
        batches.append(torch.randint(train - WINDOW, (BATCH,)))  # the next step's batch
    return torch.cat(batches)


def train_on(windows_file: str, argv: list[str]) -> None:
    """In a process of its own: torchloom's train.py with ``argv``, its random windows the
    starts in ``windows_file`` in their order (the corpus stream's draw replaced here)."""
    sys.path.insert(0, str(ROOT))
    import data.corpus.stream as stream

    drawn = torch.load(windows_file)

    def replayed(windows: int, starts: int, seed: int, data_pass: int) -> torch.Tensor:
        per_pass = windows // BATCH * BATCH
        given = drawn[data_pass * per_pass : (data_pass + 1) * per_pass]
        return torch.cat([given, torch.zeros(windows - len(given), dtype=given.dtype)])

    stream.random_windows = replayed
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def run_torchloom(
    steps: int, workdir: Path, val: np.ndarray, preset: str, seed: int, windows: Path | None = None
) -> dict:
    folder = workdir / (preset if windows is None else f"{preset}-their-windows")
    folder.mkdir()
    command = torchloom_command(steps, folder, preset, seed)
    if windows is not None:
        command[1:1] = [__file__, "--train-on", str(windows)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"torchloom failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    metrics = json.loads((folder / "runs" / "bench" / "metrics.json").read_text())
    sys.path.insert(0, str(ROOT))
    from utils.checkpoint.rebuild import rebuild

    model = rebuild(folder / "checkpoints" / "bench" / "best.pt", "auto", torch.device("cpu")).model
    return {
        "tokens_per_second": metrics["train/tokens_per_second"],
        "val_loss_whole_split": whole_split_loss(model, val),
        "val_loss_own": metrics.get("test/loss", math.nan),
        "wall_seconds": wall,
    }


def main() -> None:
    if sys.argv[1:2] == ["--train-on"]:  # run_torchloom's process with nanoGPT's windows
        train_on(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="a checkout of nanoGPT")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument(
        "--seed",
        type=int,
        default=NANOGPT_SEED,
        help="both tools' seed (default nanoGPT's own): the same initial weights, checked here",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each, alternating")
    parser.add_argument(
        "--presets",
        nargs="+",
        default=["shakespeare_char_cpu"],
        help="torchloom's conf/experiment/ presets to run (the first is compared for speed)",
    )
    parser.add_argument(
        "--their-windows",
        action="store_true",
        help="also train the first preset on the windows nanoGPT's run draws",
    )
    args = parser.parse_args()
    if not (args.nanogpt / "train.py").is_file():
        raise SystemExit(f"--nanogpt {args.nanogpt}: no train.py there; give a nanoGPT checkout")
    results: dict[str, list[dict]] = {"nanogpt": [], **{p: [] for p in args.presets}}
    replay = f"{args.presets[0]} on nanoGPT's windows"
    if args.their_windows:
        results[replay] = []
    same = same_initial_weights(args.nanogpt, args.seed)
    print(f"seed {args.seed}: the same initial weights in both tools: {same}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        val, _ = prepared(Path(tmp) / "split")
        for round_ in range(args.rounds):
            work = Path(tmp) / f"round{round_}"
            work.mkdir()
            results["nanogpt"].append(
                run_nanogpt(args.nanogpt, args.max_steps, work, val, args.seed)
            )
            for preset in args.presets:
                results[preset].append(run_torchloom(args.max_steps, work, val, preset, args.seed))
            if args.their_windows:
                windows = work / "their-windows.pt"
                torch.save(
                    their_windows(args.nanogpt, Path(tmp) / "split", args.seed, args.max_steps),
                    windows,
                )
                results[replay].append(
                    run_torchloom(args.max_steps, work, val, args.presets[0], args.seed, windows)
                )
            for tool, runs in results.items():
                r = runs[-1]
                print(
                    f"round {round_ + 1} {tool:22s} {r['tokens_per_second']:8,.0f} tokens/s  "
                    f"val loss over the whole split {r['val_loss_whole_split']:.4f}  "
                    f"wall {r['wall_seconds']:.0f} s",
                    flush=True,
                )
    ratio = [
        t["tokens_per_second"] / n["tokens_per_second"]
        for t, n in zip(results[args.presets[0]], results["nanogpt"], strict=True)
    ]
    print(f"torchloom / nanoGPT tokens per second: {', '.join(f'{r:.3f}' for r in ratio)}")
    print(json.dumps({"max_steps": args.max_steps, "seed": args.seed, **results, "ratio": ratio}))


if __name__ == "__main__":
    main()
