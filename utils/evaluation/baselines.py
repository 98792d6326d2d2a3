"""How good is the run next to the simple models a practitioner would try first? scikit-learn's
on the same train split, scored on the same val and test rows (``baselines=true``, the
default where scikit-learn is installed: ``pip install -e ".[baselines]"``):

- a table: gradient boosting (``hgb``: ``HistGradientBoostingClassifier``/``Regressor``, missing
  values as they are) and a linear model (``linear``: logistic or ridge regression on
  standardised columns, missing values filled with the column's median);
- texts: TF-IDF of words and word pairs with the same linear model (``tfidf``).

Their figures go into metrics.json as ``baseline/<name>/<split>/<metric>`` in the run's own
units and names (``acc`` and ``loss`` for classes; ``mae``, ``rmse``, ``r2`` for values) with
``baseline/<name>/fit_seconds``. Which data has a simple model is the kind of input's answer
(data/batching/inputs.py ``plain_of``), which kind of model the task's (``simple_models``). A train
split past :data:`MOST_ROWS` rows is fitted on a sample of that many, said so.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from typing import Any

import numpy as np
import torch

from data.batching.inputs import plain_of

log = logging.getLogger("torchloom")
MOST_ROWS = 100_000  # train rows a baseline is fitted on (a sample past it): minutes at most
MISSING = 'scikit-learn is not installed (pip install -e ".[baselines]")'


def fit_baselines(asked: bool, data: Any, task: Any, seed: int) -> dict[str, Any]:
    """``baselines/...`` figures, and ``baselines``: a line saying what was done or why not
    (empty where none apply: images, label sets, a corpus, ``baselines=false``)."""
    if not asked or task.simple_models is None:
        return {}
    splits = {name: data.splits.get(name) for name in ("train", "val", "test")}
    held = {name: s for name, s in splits.items() if s is not None and s.held == "memory"}
    if "train" not in held:
        return {}
    train = plain_of(data.inputs, held["train"].inputs[:1])
    if train is None:
        return {}
    if importlib.util.find_spec("sklearn") is None:
        log.info("baselines skipped: %s", MISSING)
        return {"baselines": f"skipped: {MISSING}"}
    return _fitted(held, data, task, seed)


def _fitted(held: dict, data: Any, task: Any, seed: int) -> dict[str, Any]:
    rows, said = _sample(len(held["train"]), seed)
    inputs = plain_of(data.inputs, held["train"].inputs[rows])
    targets = _targets(held["train"].labels[rows], task)
    texts = isinstance(inputs, list)
    results: dict[str, Any] = {}
    for name, model in models(task.simple_models, texts, seed).items():
        started = time.perf_counter()
        model.fit(inputs, targets)
        results[f"baseline/{name}/fit_seconds"] = time.perf_counter() - started
        for split in ("val", "test"):
            if split in held:
                shown = plain_of(data.inputs, held[split].inputs)
                scored = _scores(model, shown, _targets(held[split].labels, task), task)
                results.update({f"baseline/{name}/{split}/{k}": v for k, v in scored.items()})
    log.info(
        "baselines (scikit-learn, the same splits%s): %s",
        said,
        ", ".join(f"{k} {v:.4f}" for k, v in results.items() if f"/{data.test_split}/" in k),
    )
    results["baselines"] = f"fitted on the train split{said}"
    return results


def _sample(count: int, seed: int) -> tuple[Any, str]:
    if count <= MOST_ROWS:
        return slice(None), ""
    rows = torch.randperm(count, generator=torch.Generator().manual_seed(seed))[:MOST_ROWS]
    return rows.sort().values, f"; a sample of {MOST_ROWS:,} of its {count:,} rows"


def _targets(labels: torch.Tensor, task: Any) -> np.ndarray:
    """Class indices [N], or values [N, K] in their own units (every target a column)."""
    return labels.numpy()


def models(kind: str, texts: bool, seed: int) -> dict[str, Any]:
    """The simple models of ``kind`` (classifier or regressor) for rows or ``texts``."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.multioutput import MultiOutputRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    classifies = kind == "classifier"
    linear = LogisticRegression(max_iter=2000) if classifies else Ridge()
    if texts:
        return {"tfidf": make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=2), linear)}
    boosted = (
        HistGradientBoostingClassifier(random_state=seed)
        if classifies
        else MultiOutputRegressor(HistGradientBoostingRegressor(random_state=seed))
    )
    filled = make_pipeline(SimpleImputer(strategy="median"), StandardScaler(), linear)
    return {"hgb": boosted, "linear": filled}


def _scores(model: Any, inputs: Any, targets: np.ndarray, task: Any) -> dict[str, float]:
    """The run's own metrics of ``model`` on one split: acc and loss (cross-entropy over
    every class the task has) for classes; mae, rmse and r2 averaged over the targets."""
    if task.simple_models == "classifier":
        probabilities = np.zeros((len(targets), task.count))
        probabilities[:, model.classes_] = model.predict_proba(inputs)
        picked = probabilities[np.arange(len(targets)), targets]
        return {
            "acc": float((probabilities.argmax(axis=1) == targets).mean()),
            "loss": float(-np.log(np.clip(picked, 1e-15, 1)).mean()),
        }
    predicted = np.asarray(model.predict(inputs), dtype=np.float64).reshape(len(targets), -1)
    actual = targets.reshape(len(targets), -1).astype(np.float64)
    error = predicted - actual
    spread = ((actual - actual.mean(axis=0)) ** 2).mean(axis=0)
    r2 = np.where(
        spread > 0, 1 - (error**2).mean(axis=0) / np.where(spread > 0, spread, 1), math.nan
    )
    return {
        "mae": float(np.abs(error).mean(axis=0).mean()),
        "rmse": float(np.sqrt((error**2).mean(axis=0)).mean()),
        "r2": float(r2.mean()),
    }
