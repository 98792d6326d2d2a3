"""Texts for the tests of data=text and model=hf: short reviews whose label a few words
decide, and the check that an export fed strings tokenized outside torchloom gives
predict.py's probabilities."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from conftest import EVALUATE, PREDICT, checkpoint, run_python, write_rows

GOOD = ["great", "wonderful", "superb", "moving", "delightful", "brilliant", "charming"]
BAD = ["awful", "dull", "tedious", "boring", "clumsy", "dreadful", "bland"]
FILLER = [
    "the",
    "film",
    "a",
    "story",
    "with",
    "its",
    "cast",
    "and",
    "plot",
    "of",
    "this",
    "movie",
    "was",
]


def review(rng: random.Random, positive: bool) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randint(3, 14))]
    for _ in range(rng.randint(1, 3)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if positive else BAD))
    return " ".join(words).capitalize() + "."


def write_reviews(path: Path, rows: int = 240, seed: int = 0) -> Path:
    rng = random.Random(seed)
    labels = [rng.random() < 0.5 for _ in range(rows)]
    table = [
        [review(rng, good), "pos" if good else "neg", f"{len(review(rng, good))}"]
        for good in labels
    ]
    return write_rows(path, ["review", "sentiment", "extra"], table)


OUTSIDE = """
import json, sys
import numpy as np
from tokenizers import Tokenizer

kind, path, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if kind == "onnx":
    import onnx, onnxruntime
    record = json.loads({p.key: p.value for p in onnx.load(path).metadata_props}["torchloom"])
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    run = lambda ids, mask: session.run(None, {"ids": ids, "mask": mask})[0]
else:
    import torch
    extra = {"torchloom.json": ""}
    program = torch.export.load(path, extra_files=extra)
    record = json.loads(extra["torchloom.json"])
    module = program.module()
    run = lambda ids, mask: module(torch.from_numpy(ids), torch.from_numpy(mask)).detach().numpy()
tokenizer = Tokenizer.from_str(record["tokenizer"])
tokenizer.no_padding()
tokenizer.enable_truncation(record["max_length"])
encoded = [e.ids for e in tokenizer.encode_batch(texts)]
longest = max(map(len, encoded))
ids = np.full((len(texts), longest), record["pad_id"], dtype=np.int64)
mask = np.zeros((len(texts), longest), dtype=np.int64)
for row, seq in enumerate(encoded):
    ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
logits = run(ids, mask)
probabilities = np.exp(logits - logits.max(1, keepdims=True))
print(json.dumps((probabilities / probabilities.sum(1, keepdims=True)).tolist()))
"""


def export_matches_predict(cwd: Path, run_name: str, suffix: str, column: str) -> None:
    """``run_name``'s best.pt exported as ``.suffix`` and fed test.csv's ``column`` tokenized
    with ``tokenizers`` alone, in a process that imports nothing of torchloom: predict.py's two
    most likely classes' probabilities within 1e-5."""
    ckpt = f"ckpt=checkpoints/{run_name}"
    run_python(cwd, str(EVALUATE), ckpt, f"export={run_name}.{suffix}")
    run_python(cwd, str(PREDICT), ckpt, "input=test.csv", f"out={run_name}.csv")
    with open(cwd / "test.csv", newline="") as f:
        texts = [row[column] for row in csv.DictReader(f)]
    with open(cwd / f"{run_name}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    (cwd / "outside.py").write_text(OUTSIDE)
    result = run_python(cwd, "outside.py", suffix, f"{run_name}.{suffix}", json.dumps(texts))
    outside = json.loads(result.stdout)
    names = checkpoint(cwd, run_name, "best.pt")["inputs"]["classes"]
    for row, probabilities in zip(rows, outside, strict=True):
        for k in (1, 2):
            expected = float(row[f"p{k}"])
            assert probabilities[names.index(row[f"class{k}"])] == pytest.approx(expected, abs=1e-5)
