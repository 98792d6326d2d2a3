"""k-fold cross-validation (data/batching/folds.py, utils/run/cross_validation.py): the folds a user relies
on (disjoint, covering train ∪ val, stratified, groups whole, the test fixed), a sweep over
folds summarised, and cv=K in one job: fold folders, the same initial weights, oof.csv, the
mean returned, and a kill inside a fold resumed exactly."""

from __future__ import annotations

import csv
import json
import random
import statistics
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import HELPERS, TRAIN, checkpoint, error_line, run_python, run_train, write_rows

from data.arrays.tensors import load_tensors
from data.tables.tabular import load_csv

BATCHING = {
    "batch_size": 16,
    "eval_batch_size": 64,
    "augment": {"crop_padding": 0, "horizontal_flip": False},
}
SPLIT = {
    "val_path": None,
    "test_path": None,
    "val": 0.15,
    "test": 0.2,
    "seed": 3,
    "stratify": "auto",
    "group": None,
}


def skewed_table(path: Path, rows: int = 203, groups: bool = False) -> Path:
    """Three classes in shares 60/30/10 %, a feature that tells them apart, and a patient
    column (7 rows a patient) when ``groups``."""
    rng = random.Random(1)
    labels = ["common"] * 6 + ["rare"] * 1 + ["mid"] * 3
    table = []
    for i in range(rows):
        label = labels[i % 10]
        table.append(
            [repr(rng.gauss({"common": 0, "mid": 2, "rare": 4}[label], 0.5)), label, f"p{i // 7}"]
        )
    header = ["x", "y", "patient"] if groups else ["x", "y"]
    return write_rows(path, header, table if groups else [r[:2] for r in table])


def folds_of(path: Path, k: int, **split) -> list:
    return [
        load_csv(str(path), "y", None, [], {**SPLIT, **split, "folds": k, "fold": f}, **BATCHING)
        for f in range(k)
    ]


def lines(data) -> list[int]:
    return [int(name.split()[1]) for name in data.fold_ids.names]


def test_folds_are_disjoint_cover_train_and_val_and_keep_the_test_fixed(tmp_path):
    path = skewed_table(tmp_path / "t.csv")
    folds = folds_of(path, 5)
    plain = load_csv(str(path), "y", None, [], SPLIT, **BATCHING)
    val_lines = [set(lines(d)) for d in folds]
    assert all(not a & b for i, a in enumerate(val_lines) for b in val_lines[i + 1 :])
    pool = set().union(*val_lines)
    test_size = len(plain.splits["test"])
    assert len(pool) == 203 - test_size  # every train ∪ val row validates exactly once
    for data in folds:  # the test split: the plain run's, in every fold
        assert len(data.splits["train"]) + len(data.splits["val"]) == len(pool)
        assert sorted(data.splits["test"].inputs[:, 0].tolist()) == sorted(
            plain.splits["test"].inputs[:, 0].tolist()
        )
    again = folds_of(path, 5)  # the same data.split.seed: the same folds
    assert [lines(d) for d in again] == [lines(d) for d in folds]
    other = folds_of(path, 5, seed=4)
    assert [lines(d) for d in other] != [lines(d) for d in folds]


def test_stratified_folds_hold_each_class_within_one_of_its_share(tmp_path):
    path = skewed_table(tmp_path / "t.csv")
    folds = folds_of(path, 5)
    counts = [Counter(d.splits["val"].labels.tolist()) for d in folds]
    totals = sum(counts, Counter())
    for label, total in totals.items():
        for count in counts:
            assert abs(count[label] - total / 5) < 1, (label, count[label], total)


def test_a_group_never_spans_two_folds_nor_test_and_train(tmp_path):
    path = skewed_table(tmp_path / "t.csv", groups=True)
    with open(path) as f:
        patient = {i: row["patient"] for i, row in enumerate(csv.DictReader(f), start=2)}
    folds = folds_of(path, 4, group="patient")
    owner: dict[str, int] = {}
    for fold, data in enumerate(folds):
        for line in lines(data):
            assert owner.setdefault(patient[line], fold) == fold, patient[line]
        assert data.input_shape == (1,)  # the group column is no feature
    assert len(set(owner)) < len(set(patient.values()))  # the test's patients are in no fold
    assert len(owner) + len(folds[0].splits["test"]) // 7 <= len(set(patient.values())) + 1


def test_a_group_column_is_no_feature_even_when_listed_as_categorical(tmp_path):
    path = skewed_table(tmp_path / "t.csv", groups=True)
    line = error_line(
        run_train(
            tmp_path,
            "data=csv",
            f"data.path={path}",
            "data.target=y",
            "data.split.group=patient",
            "data.categorical=[patient]",
            ok=False,
        )
    )
    assert "data.categorical lists 'patient', the data.split.group column" in line
    # Listed in data.features too, it is a feature on purpose.
    data = load_csv(
        str(path), "y", ["x", "patient"], ["patient"], {**SPLIT, "group": "patient"}, **BATCHING
    )
    assert data.input_shape[0] > 1


@pytest.mark.parametrize(
    "split", [{"folds": 100_000_000}, {"folds": 100_000_000, "group": "patient"}]
)
def test_a_fold_count_beyond_the_data_is_refused_before_anything_is_allocated(tmp_path, split):
    from utils.errors import UserError

    path = skewed_table(tmp_path / "t.csv", groups=True)
    with pytest.raises(UserError, match=r"too few for 100000000 folds|only .* samples to deal"):
        load_csv(str(path), "y", ["x"], [], {**SPLIT, **split, "fold": 0}, **BATCHING)


def test_regression_folds_are_unstratified_and_stratify_true_is_refused(tmp_path):
    x = torch.randn(60, 3)
    torch.save({"x": x, "y": x[:, :1] * 2}, tmp_path / "a.pt")
    split = {"val": 0.2, "test": 0.2, "seed": 0, "folds": 3, "fold": 1, "stratify": "auto"}
    data = load_tensors(
        str(tmp_path / "a.pt"), None, split, None, None, targets="values", **BATCHING
    )
    assert len(data.splits["val"]) == 16 and len(data.fold_ids.names) == 16
    result = run_train(
        tmp_path,
        "data=tensors",
        f"data.path={tmp_path / 'a.pt'}",
        "task=regression",
        "data.split.folds=3",
        "data.split.stratify=true",
        ok=False,
    )
    assert "data.split.stratify=true needs class labels" in error_line(result)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["cv=1"], "cv=1 must be a whole number of folds, 2 or more"),
        (["cv=3", "data=mnist"], "cv=3 needs data whose val split is held out"),
        (["cv=3", "data.split.folds=4"], "cv=3 and data.split.folds=4 disagree"),
        (["cv=3", "resume=checkpoints/x/last.pt"], "cv=3 continues with resume=auto"),
        (
            ["data.split.folds=3", "data.split.fold=3"],
            "data.split.fold=3 must be a whole number from 0 to 2",
        ),
    ],
)
def test_bad_fold_settings_are_one_line(tmp_path, overrides, message):
    assert message in error_line(run_train(tmp_path, *overrides, ok=False))


def test_what_cv_can_fold_is_what_the_builders_declare():
    # Declared next to each builder (data/batching/dataset.py can), not listed elsewhere: the
    # refusal names exactly the options whose builder declares it.
    from utils.run.cross_validation import folded_data

    assert folded_data() == ["csv", "digits", "image_csv", "imagefolder", "tensors", "text"]


def test_cv_on_arrays_with_their_own_val_split_names_the_file_not_a_key(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "a.npz",
        x=rng.normal(size=(60, 4)).astype("float32"),
        y=np.arange(60) % 3,
        x_val=rng.normal(size=(12, 4)).astype("float32"),
        y_val=np.arange(12) % 3,
    )
    line = error_line(run_train(tmp_path, "cv=3", "data=tensors", "data.path=a.npz", ok=False))
    assert "holds a val split of its own (x_val, y_val)" in line and "val_path" not in line


CV = ("cv=3", "trainer.max_epochs=2", "data.batch_size=128")


def test_cv_runs_every_fold_from_the_same_weights_and_pools_the_predictions(tmp_path):
    result = run_train(
        tmp_path,
        *CV,
        "run_name=cv",
        "optim=sgd",
        "optim.lr=1e-30",
        "optim.momentum=0",
        "optim.nesterov=false",
        "optim.weight_decay=0",
    )
    root = tmp_path / "runs" / "cv"
    for fold in range(3):  # lr 1e-30: each fold's weights are its initial ones (within 1e-20)
        assert (root / f"fold-{fold}" / "metrics.json").exists()
        a, b = checkpoint(tmp_path, "cv/fold-0"), checkpoint(tmp_path, f"cv/fold-{fold}")
        assert all((a["model"][k] - b["model"][k]).abs().max() < 1e-20 for k in a["model"])
        assert b["config"]["data"]["split"]["fold"] == fold  # its own folder, its own fold
        assert b["config"]["run_name"] == f"cv/fold-{fold}"
    with open(root / "oof.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1797 - 360 and len({r["sample"] for r in rows}) == len(rows)
    assert Counter(r["fold"] for r in rows) == {"0": 479, "1": 479, "2": 479}
    metrics = json.loads((root / "metrics.json").read_text())
    values = metrics["cv"]["values"]
    # One definition (best.pt's) for the table, metrics.json and every fold's own metrics.json.
    assert metrics["val/acc"] == pytest.approx(sum(values) / 3)
    assert metrics["val/acc_std"] == pytest.approx(statistics.stdev(values))
    assert f"{metrics['cv']['mean']:.4f} ± {metrics['cv']['std']:.4f}" in result.stdout
    for fold, value in enumerate(values):
        own = json.loads((root / f"fold-{fold}" / "metrics.json").read_text())
        assert own["val/acc"] == own["best_metric"] == value
    hits = sum(r["class1"] == r["target"] for r in rows) / len(rows)  # from oof.csv alone
    assert metrics["oof/acc"] == pytest.approx(hits)
    assert "mean ± std" in result.stdout and "oof/acc" in result.stdout
    # Another split's folds are never kept: cv=5 over this cv=3 run is refused, nothing changed.
    before = (root / "oof.csv").read_bytes()
    again = run_train(
        tmp_path,
        *CV[1:],
        "cv=5",
        "run_name=cv",
        "resume=auto",
        "optim=sgd",
        "optim.lr=1e-30",
        "optim.momentum=0",
        "optim.nesterov=false",
        "optim.weight_decay=0",
        ok=False,
    )
    assert "fold-0 was made by another split or run (data.split.folds: 3 -> 5)" in error_line(again)
    assert (root / "oof.csv").read_bytes() == before and not (root / "fold-3").exists()


def test_a_sweep_over_folds_is_summarised_as_mean_and_std(tmp_path):
    result = run_train(
        tmp_path,
        "-m",
        "run_name=folds",
        "data.split.folds=3",
        "data.split.fold=0,1,2",
        "trainer.max_epochs=1",
    )
    data = json.loads((tmp_path / "runs" / "folds" / "summary.json").read_text())
    (group,) = data["seed_groups"]
    assert group["completed"] == 3 and "over folds: mean ± std" in result.stdout


@pytest.mark.slow
def test_a_kill_inside_a_fold_resumes_that_fold_and_keeps_the_others(tmp_path):
    run_train(tmp_path, *CV, "run_name=straight")
    # 12 steps a fold's epoch (1,077 samples / 128 → 9, so 18 a fold): step 25 is in fold 1
    killed = run_python(
        tmp_path,
        str(HELPERS / "faulty_run.py"),
        str(TRAIN),
        *CV,
        "run_name=killed",
        ok=False,
        env={"KILL_AT": "train_step:25"},
    )
    assert killed.returncode == -9
    assert (tmp_path / "runs" / "killed" / "fold-0" / "metrics.json").exists()
    assert not (tmp_path / "runs" / "killed" / "fold-1" / "metrics.json").exists()
    resumed = run_train(tmp_path, *CV, "run_name=killed", "resume=auto")
    assert "fold 1 of 3 finished earlier" in resumed.stdout
    assert "resumed from checkpoints/killed/fold-1/last.pt" in resumed.stdout
    a = json.loads((tmp_path / "runs" / "straight" / "metrics.json").read_text())
    b = json.loads((tmp_path / "runs" / "killed" / "metrics.json").read_text())
    assert a["cv"]["values"] == b["cv"]["values"] and a["oof/acc"] == b["oof/acc"]
    for fold in range(3):
        x, y = (
            checkpoint(tmp_path, f"straight/fold-{fold}"),
            checkpoint(tmp_path, f"killed/fold-{fold}"),
        )
        assert all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"])


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_cv_on_an_image_folder_decodes_it_once_and_a_moved_folder_keeps_its_cache(
    tmp_path, monkeypatch, cache
):
    """cv=K decoded the folder again for every fold, said "the image folder changed" when
    nothing did and evicted the previous fold's cache; a moved folder rebuilt its cache and
    kept the old one beside it for ever. One cache of the folder's images serves every fold
    (each fold's splits are rows of it), and the cache moves with the folder."""
    import shutil

    from conftest import write_imagefolder

    from data.images import image_cache

    built, build_file = [], image_cache.build_file

    def counted(path, files, workers, name):
        built.append(path.name)
        return build_file(path, files, workers, name)

    monkeypatch.setattr(image_cache, "build_file", counted)  # in-process runs below
    write_imagefolder(tmp_path / "images", per_class=8, test=False)
    run = ["data=imagefolder", "data.image_size=[12,10]", f"data.cache={cache}", "model=mlp"]
    run += ["model.hidden_sizes=[8]", "trainer.max_epochs=1", "data.num_workers=0", "cv=3"]
    first = run_train(tmp_path, *run, "data.root=images", "run_name=a")
    assert len(built) == 1 and built[0].startswith("pool-3x12x10-")  # not once a fold
    assert "changed" not in first.stdout + first.stderr
    assert [p.name for p in (tmp_path / "images" / ".torchloom-cache").glob("*.u8")] == built
    folds = [
        json.loads((tmp_path / "runs" / "a" / f"fold-{k}" / "metrics.json").read_text())
        for k in range(3)
    ]
    assert all(m["epochs"] == 1 for m in folds)

    shutil.move(tmp_path / "images", tmp_path / "moved")
    run_train(tmp_path, *run, "data.root=moved", "run_name=b")
    assert len(built) == 1  # the moved folder's cache was found and used
    assert len(list((tmp_path / "moved" / ".torchloom-cache").glob("*.u8"))) == 1
    oof = [(tmp_path / "runs" / name / "oof.csv").read_text() for name in ("a", "b")]
    assert oof[0] == oof[1]

    (pool,) = (tmp_path / "moved" / ".torchloom-cache").glob("*.u8")
    pool.write_bytes(pool.read_bytes()[:5000])  # truncated in the moved folder
    again = run_train(tmp_path, *run, "data.root=moved", "run_name=c")
    assert "short or overlong" in again.stdout + again.stderr and len(built) == 2
    assert len(list((tmp_path / "moved" / ".torchloom-cache").glob("*.u8"))) == 1
