"""The figures of docs/fine-tuning.md: what distillation, SWA and layer-wise LR decay do on real
data, each against the same run without it, over seeds (mean ± std from the sweep summary).

    python benchmarks/fine_tuning_figures.py                 # about 5 minutes on 2 CPU cores
    python benchmarks/fine_tuning_figures.py --cases swa --seeds 0 1

- distill: the bundled digits; a ``model=cnn`` teacher (20 epochs, seed 0), then ``model=mlp``
  students with ``distill.teacher`` against the mlp alone, 20 epochs each.
- swa: the bundled digits, ``model=cnn``, 20 epochs, with and without
  ``trainer.swa.start=0.75 trainer.swa.lr=0.0005``.
- layer_decay: a transfer on the bundled digits' images. ``model=cnn`` trained on the digits
  0–4, then fine-tuned with ``init_from`` on the digits 5–9 from 20 images a class (20 more
  validate, the other 696 test), 30 epochs: from scratch, at one LR, and at
  ``optim.layer_decay`` 0.9, 0.7 and 0.5.

Each comparison is one ``train.py -m`` sweep over ``seed`` in a scratch folder; each printed
line is JSON: the case, the run, and test/acc, val/acc and test/loss as [mean, std].
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "data" / "assets" / "digits.csv.gz"
SHOWN = ("test/acc", "val/acc", "test/loss")
TEACHER = "checkpoints/teacher/best.pt"
TRANSFER = ["data=tensors", "data.path=target.pt", "model=cnn", "trainer.max_epochs=30"]
CASES = {
    "distill": {
        "mlp alone": ["model=mlp"],
        "mlp, cnn teacher (T=4, α=0.5)": ["model=mlp", f"distill.teacher={TEACHER}"],
    },
    "swa": {
        "cnn": ["model=cnn"],
        "cnn, swa.start=0.75 swa.lr=0.0005": [
            "model=cnn",
            "trainer.swa.start=0.75",
            "trainer.swa.lr=0.0005",
        ],
    },
    "layer_decay": {
        "from scratch": TRANSFER,
        **{
            f"init_from, layer_decay={decay}": [
                *TRANSFER,
                "init_from=checkpoints/source/best.pt",
                f"optim.layer_decay={decay}",
            ]
            for decay in ("null", "0.9", "0.7", "0.5")
        },
    },
}


def train(cwd: Path, *overrides: str) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *overrides],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )


def write_transfer(cwd: Path) -> None:
    """source.pt: the digits 0–4; target.pt: the digits 5–9 (as 0–4), 20 a class to train on,
    20 to validate, the rest to test. uint8 8×8 images, as data=tensors reads them."""
    import torch

    with gzip.open(DIGITS, "rt") as f:
        rows = [[int(v) for v in line.split(",")] for line in f.read().split()]
    values = torch.tensor(rows)
    images = (values[:, :64].float() * 255 / 16).round().to(torch.uint8).view(-1, 1, 8, 8)
    labels = values[:, 64]
    source = labels < 5
    torch.save({"x": images[source], "y": labels[source]}, cwd / "source.pt")
    order = torch.randperm(int((~source).sum()), generator=torch.Generator().manual_seed(0))
    x, y = images[~source][order], labels[~source][order] - 5
    train = torch.cat([torch.nonzero(y == c)[:20, 0] for c in range(5)])
    val = torch.cat([torch.nonzero(y == c)[20:40, 0] for c in range(5)])
    rest = torch.ones(len(y), dtype=torch.bool)
    rest[train], rest[val] = False, False
    torch.save(
        {
            "x": x[train],
            "y": y[train],
            "x_val": x[val],
            "y_val": y[val],
            "x_test": x[rest],
            "y_test": y[rest],
        },
        cwd / "target.pt",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--epochs", type=int, help="epochs of every run (default: as above)")
    options = parser.parse_args()
    epochs = [] if options.epochs is None else [f"trainer.max_epochs={options.epochs}"]
    seeds = "seed=" + ",".join(str(s) for s in options.seeds)
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        if "distill" in options.cases:
            train(cwd, "model=cnn", "run_name=teacher", *epochs)
        if "layer_decay" in options.cases:
            write_transfer(cwd)
            train(
                cwd, "data=tensors", "data.path=source.pt", "model=cnn", "run_name=source", *epochs
            )
        for case in options.cases:
            for number, (name, overrides) in enumerate(CASES[case].items()):
                sweep = f"{case}-{number}"
                train(cwd, "-m", *overrides, seeds, f"run_name={sweep}", *epochs)
                (group,) = json.loads((cwd / "runs" / sweep / "summary.json").read_text())[
                    "seed_groups"
                ]
                figures = {
                    key: [round(group[key]["mean"], 4), round(group[key]["std"], 4)]
                    for key in SHOWN
                }
                print(
                    json.dumps(
                        {"case": case, "run": name, "seeds": len(options.seeds), **figures},
                        ensure_ascii=False,
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
