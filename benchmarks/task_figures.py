"""The "Tasks" figures of docs/tasks.md: what task=multilabel and task=regression reach with the default
job's settings, on data written here.

    python benchmarks/task_figures.py            # about a minute on 2 CPU cores

- multilabel: the bundled digits as 8×8 grey PNGs, each tagged with the set of ``even``,
  ``prime``, ``loop`` (0, 6, 8, 9) and ``big`` (≥ 5) it belongs to, in an image_csv manifest;
  ``model=cnn``.
- regression: a table of four features and two targets with known noise, ``price`` (σ 3) and
  ``rent`` (σ 0.02), whose MAE floors are σ·√(2/π); ``model=mlp``, with MSE, L1, and MSE on
  unstandardised targets.

Each configuration is one ``train.py`` run in a scratch folder; the test figures come from its
metrics.json and, per target, from ``evaluate.py``'s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "data" / "assets" / "digits.csv.gz"
NOISE = {"price": 3.0, "rent": 0.02}


def write_houses(path: Path, rows: int = 300, seed: int = 0) -> Path:
    """Two targets on very different scales (price ~ 300 ± 60, rent ~ 1.2 ± 0.3), learnable
    from four features with the noise of ``NOISE``; a tags column of label sets and two 0/1
    label columns."""
    rng = random.Random(seed)
    lines = ["rooms,area,age,floor,price,rent,tags,sunny,quiet"]
    for _ in range(rows):
        x = [rng.gauss(0, 1) for _ in range(4)]
        price = 300 + 50 * x[0] + 30 * x[1] - 10 * x[2] + rng.gauss(0, NOISE["price"])
        rent = 1.2 + 0.25 * x[1] - 0.1 * x[3] + rng.gauss(0, NOISE["rent"])
        sunny, quiet, big = x[3] > 0, x[2] < 0.3, x[0] > 0.5
        tags = ";".join(t for t, on in (("sunny", sunny), ("quiet", quiet), ("big", big)) if on)
        lines.append(
            ",".join(
                [
                    *(f"{v:.4f}" for v in x),
                    f"{price:.3f}",
                    f"{rent:.4f}",
                    tags,
                    str(int(sunny)),
                    str(int(quiet)),
                ]
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def digit_tags(digit: int) -> str:
    tags = (
        ("even", digit % 2 == 0),
        ("prime", digit in (2, 3, 5, 7)),
        ("loop", digit in (0, 6, 8, 9)),
        ("big", digit >= 5),
    )
    return ";".join(name for name, on in tags if on)


def write_digit_tags(root: Path) -> Path:
    """The bundled digits as PNGs under ``root/img`` and a manifest ``root/tags.csv``."""
    import numpy as np
    from PIL import Image

    (root / "img").mkdir(parents=True, exist_ok=True)
    lines = ["path,label"]
    with gzip.open(DIGITS, "rt") as f:
        rows = f.read().split()
    for index, line in enumerate(rows):
        values = [int(v) for v in line.split(",")]
        pixels = (np.array(values[:64], dtype=np.float32).reshape(8, 8) * 255 / 16).round()
        Image.fromarray(pixels.astype(np.uint8), "L").save(root / "img" / f"{index:04d}.png")
        lines.append(f"img/{index:04d}.png,{digit_tags(values[64])}")
    (root / "tags.csv").write_text("\n".join(lines) + "\n")
    return root / "tags.csv"


def run(cwd: Path, script: str, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - started


def per_target(cwd: Path, run_name: str) -> dict:
    run(cwd, "evaluate.py", f"ckpt=checkpoints/{run_name}", f"runs=eval-{run_name}")
    (found,) = (cwd / f"eval-{run_name}" / "eval").glob("*/metrics.json")
    (result,) = json.loads(found.read_text()).values()
    return result["per_target"]


MULTILABEL = [
    "task=multilabel",
    "data=image_csv",
    "data.root=digits",
    "data.manifest=digits/tags.csv",
    "data.image_size=[8,8]",
    "data.channels=1",
    "data.mean=[0.3053]",
    "data.std=[0.3759]",
    "data.augment.crop_padding=0",
    "data.augment.horizontal_flip=false",
    "model=cnn",
]
REGRESSION = [
    "task=regression",
    "data=csv",
    "data.path=houses.csv",
    "data.target=[price,rent]",
    "data.features=[rooms,area,age,floor]",
]
VARIANTS = {"mse": [], "l1": ["task.loss=l1"], "mse_raw": ["task.standardize_targets=false"]}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        write_digit_tags(cwd / "digits")
        seconds = run(cwd, "train.py", *MULTILABEL, "run_name=tags")
        metrics = json.loads((cwd / "runs" / "tags" / "metrics.json").read_text())
        shown = {
            k: round(metrics[f"test/{k}"], 4) for k in ("map", "f1_micro", "f1_macro", "subset_acc")
        }
        print(json.dumps({"case": "multilabel_digits", **shown, "seconds": round(seconds, 1)}))
        write_houses(cwd / "houses.csv")
        floors = {name: round(sigma * math.sqrt(2 / math.pi), 4) for name, sigma in NOISE.items()}
        for name, overrides in VARIANTS.items():
            seconds = run(cwd, "train.py", *REGRESSION, *overrides, f"run_name={name}")
            scores = per_target(cwd, name)
            print(
                json.dumps(
                    {
                        "case": f"regression_{name}",
                        "targets": scores["names"],
                        "mae": [round(v, 4) for v in scores["mae"]],
                        "r2": [round(v, 4) for v in scores["r2"]],
                        "mae_floor": floors,
                        "seconds": round(seconds, 1),
                    }
                )
            )


if __name__ == "__main__":
    main()
