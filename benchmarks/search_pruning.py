"""What pruning saves in a search: the digits MLP search (conf/hparams_search/digits_optuna.yaml)
run to the same number of trials with pruner none, median and hyperband, for several study
seeds, each search one ``python train.py -m`` command in a folder of this run.

    python benchmarks/search_pruning.py                                   # 40 trials × 20 epochs, seeds 0 1 2
    python benchmarks/search_pruning.py --trials 10 --epochs 8 --seeds 0 --pruners none median
    python benchmarks/search_pruning.py --cv 10 --trials 20 --epochs 10 --pruners none wilcoxon
    python benchmarks/search_pruning.py --set hydra.sweeper.n_warmup_epochs=5   # any override

Reported per search: the trials pruned, the epochs trained in all, the wall time of the
command, the best val/acc and the test/acc of the trial that reached it (with ``--cv K``, each
trial a K-fold cross-validation: the folds' means, the best among the trials that ran every
fold; the epochs are all folds'); then, per pruner,
the epochs trained against the unpruned searches' and whether the best val/acc stays within
one standard deviation (over the seeds) of the unpruned searches' mean. The vector width of
torch's CPU kernels is printed first: another width trains the same trial apart. The last line
is machine-readable JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def search(
    folder: Path, pruner: str, seed: int, trials: int, epochs: int, cv: int | None, extra: list
) -> dict:
    """One search's figures, from its summary.json; ``extra``: overrides for every search."""
    name = f"{pruner}-{seed}"
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "hparams_search=digits_optuna",
        f"run_name={name}",
        f"seed={seed}",
        f"trainer.max_epochs={epochs}",
        f"hydra.sweeper.n_trials={trials}",
        f"hydra.sweeper.pruner={pruner}",
        *([f"cv={cv}"] if cv else []),
        "report=false",  # each job's pictures and simple models: not what is measured here
        "baselines=false",
        *extra,
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[2:])} failed:\n{done.stderr[-3000:]}")
    jobs = json.loads((folder / "runs" / name / "summary.json").read_text())["jobs"]
    # a pruned trial's val/acc is a checkpoint's; under cv=K the mean of the folds it ran
    complete = [j for j in jobs if j["state"] in (("complete",) if cv else ("complete", "pruned"))]
    best = max(complete, key=lambda j: j["val/acc"])
    return {
        "pruner": pruner,
        "seed": seed,
        "trials": len(jobs),
        "pruned": sum(j["state"] == "pruned" for j in jobs),
        "epochs": sum(j.get("epochs") or 0 for j in jobs),
        "wall_seconds": round(wall, 1),
        "best_val_acc": best["val/acc"],
        "best_trial_test_acc": best.get("test/acc"),
    }


def compared(rows: list[dict]) -> dict:
    """Per pruner: epochs against the unpruned searches', and the best val/acc against theirs."""
    plain = [r for r in rows if r["pruner"] == "none"]
    if not plain:
        return {}
    epochs = sum(r["epochs"] for r in plain)
    values = [r["best_val_acc"] for r in plain]
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    result = {}
    for pruner in dict.fromkeys(r["pruner"] for r in rows if r["pruner"] != "none"):
        mine = [r for r in rows if r["pruner"] == pruner]
        best = statistics.fmean(r["best_val_acc"] for r in mine)
        result[pruner] = {
            "epochs_saved": round(1 - sum(r["epochs"] for r in mine) / epochs, 3),
            "wall_saved": round(
                1 - sum(r["wall_seconds"] for r in mine) / sum(r["wall_seconds"] for r in plain), 3
            ),
            "best_val_acc_mean": round(best, 4),
            "unpruned_best_val_acc_mean": round(mean, 4),
            "unpruned_std": round(spread, 4),
            "within_one_std": abs(best - mean) <= spread if len(values) > 1 else None,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--pruners", nargs="+", default=["none", "median", "hyperband"])
    parser.add_argument("--cv", type=int, default=None, help="each trial a cv=K run")
    parser.add_argument("--set", nargs="*", default=[], help="overrides for every search")
    args = parser.parse_args()
    # torch's CPU kernels of another vector width train the same trial to other val images
    # (docs/reliability.md), so the figures belong to this width
    width = torch.backends.cpu.get_cpu_capability()
    print(f"torch's CPU kernels: {width}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="search-pruning-") as folder:
        for seed in args.seeds:
            for pruner in args.pruners:
                row = search(
                    Path(folder), pruner, seed, args.trials, args.epochs, args.cv, args.set
                )
                rows.append(row)
                print(
                    f"{pruner:9} seed {seed}: {row['pruned']:3}/{row['trials']} pruned, "
                    f"{row['epochs']:5} epochs, {row['wall_seconds']:7.1f} s, best val/acc "
                    f"{row['best_val_acc']:.4f} (its test/acc {row['best_trial_test_acc']:.4f})",
                    flush=True,
                )
    summary = compared(rows)
    for pruner, figures in summary.items():
        print(
            f"{pruner}: {figures['epochs_saved']:.0%} fewer epochs, {figures['wall_saved']:.0%} less "
            f"wall time; best val/acc {figures['best_val_acc_mean']:.4f} against "
            f"{figures['unpruned_best_val_acc_mean']:.4f} ± {figures['unpruned_std']:.4f} unpruned"
        )
    print(
        json.dumps(
            {"set": args.set, "cpu_capability": width, "searches": rows, "compared": summary}
        )
    )


if __name__ == "__main__":
    main()
