"""Gaps in a table (data.na): each mode against a hand-worked table, fill values from the train
split alone, the record that lets predict.py fill a row as training did, and the refusals."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from conftest import EVALUATE, PREDICT, error_line, run_python, run_train, write_rows

from data.tables.tabular import load_csv

AUGMENT = {"crop_padding": 0, "horizontal_flip": False}
TRAIN_ROWS = [  # a, b, colour, y: a has gaps in three spellings, b in one
    ["1", "10", "r", "x"],
    ["", "20", "g", "y"],
    ["3", "NA", "", "x"],
    ["?", "40", "r", "y"],
    ["7", "50", "g", "x"],
    ["9", "60", "r", "y"],
]
VAL_ROWS = [["1000", "", "r", "x"], ["", "5000", "g", "y"]]  # far off: a leak would show


def load(tmp_path: Path, val_rows=VAL_ROWS, **na):
    train = write_rows(tmp_path / "train.csv", ["a", "b", "colour", "y"], TRAIN_ROWS)
    val = write_rows(tmp_path / "val.csv", ["a", "b", "colour", "y"], val_rows)
    split = {"val_path": str(val), "test_path": str(val), "val": 0.2, "test": 0.2, "seed": 0}
    return load_csv(
        str(train),
        "y",
        None,
        ["colour"],
        split,
        batch_size=2,
        eval_batch_size=8,
        augment=AUGMENT,
        **na,
    )


@pytest.mark.parametrize(
    ("mode", "a_fill", "b_fill"),
    [
        ("mean", (1 + 3 + 7 + 9) / 4, (10 + 20 + 40 + 50 + 60) / 5),
        ("median", (3 + 7) / 2, 40.0),
        ("constant", -1.0, -1.0),
    ],
)
def test_each_fill_mode_fills_with_the_train_splits_statistic(tmp_path, mode, a_fill, b_fill):
    data = load(tmp_path, na=mode, na_fill=-1.0)
    train = data.splits["train"].inputs  # held unnormalised: batches normalise
    assert train[:, 0].tolist() == pytest.approx([1, a_fill, 3, a_fill, 7, 9])
    assert train[:, 1].tolist() == pytest.approx([10, 20, b_fill, 40, 50, 60])
    val = data.splits["val"].inputs  # val's gaps get train's values; its own never count
    assert val[:, 0].tolist() == pytest.approx([1000, a_fill])
    assert val[:, 1].tolist() == pytest.approx([b_fill, 5000])
    assert data.inputs.table["na"]["fills"] == pytest.approx({"a": a_fill, "b": b_fill})


def test_drop_leaves_out_the_rows_with_gaps_in_every_split(tmp_path):
    data = load(tmp_path, [*VAL_ROWS, ["5", "5", "g", "x"]], na="drop")
    assert data.splits["train"].inputs[:, :2].tolist() == [[1, 10], [7, 50], [9, 60]]
    assert data.splits["val"].inputs[:, :2].tolist() == [[5, 5]]
    from utils.errors import UserError

    with pytest.raises(UserError, match="val split has no rows left: each has a gap"):
        load(tmp_path, na="drop")


def test_per_column_modes_and_indicator_columns(tmp_path):
    data = load(tmp_path, na="mean", na_columns={"b": "median"}, na_indicator=True)
    train = data.splits["train"].inputs
    assert train[:, 1].tolist() == pytest.approx([10, 20, 40, 40, 50, 60])
    names = (
        data.inputs.table
    )  # the encoding: a, b, colour one-hot (empty is its own category), gaps
    assert names["categories"]["colour"] == ["", "g", "r"]
    assert train.shape[1] == 2 + 3 + 2
    assert train[:, -2].tolist() == [0, 1, 0, 1, 0, 0]  # a=missing
    assert train[:, -1].tolist() == [0, 0, 1, 0, 0, 0]  # b=missing
    assert data.splits["val"].inputs[:, -2:].tolist() == [[0, 1], [1, 0]]


@pytest.mark.parametrize(
    ("na", "message"),
    [
        ({}, "train.csv line 3, column 'a': empty is a missing value"),
        ({"na": "guess"}, "data.na='guess': choose one of error, drop, mean, median, constant"),
        ({"na": "mean", "na_columns": {"colour": "mean"}}, "data.na_columns names 'colour'"),
        ({"na": "constant", "na_fill": math.inf}, "data.na_fill=inf: give a finite number"),
        (
            {"na": "constant", "na_fill": 1e39},
            "data.na_fill=1e+39: give a finite number a float32 holds",
        ),
    ],
)
def test_gaps_and_bad_modes_are_refused_naming_the_key(tmp_path, na, message):
    from utils.errors import UserError

    with pytest.raises(UserError) as refused:
        load(tmp_path, **na)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_column_empty_in_every_train_row_is_refused(tmp_path):
    from utils.errors import UserError

    train = write_rows(
        tmp_path / "t.csv", ["a", "e", "y"], [[str(i), "", "xy"[i % 2]] for i in range(20)]
    )
    split = {"val_path": None, "test_path": None, "val": 0.2, "test": 0.2, "seed": 0}
    with pytest.raises(UserError, match="column 'e' is empty in every train row"):
        load_csv(
            str(train),
            "y",
            None,
            [],
            split,
            batch_size=2,
            eval_batch_size=8,
            augment=AUGMENT,
            na="median",
        )


def test_predict_fills_a_rows_gaps_as_training_did(tmp_path):
    """Trained with na=median: predicting rows with gaps gives exactly what it gives on the
    same rows with the stored medians (those of the train split) written in by hand."""
    import random

    rng = random.Random(0)
    rows = []
    for _ in range(200):
        a, b = rng.gauss(0, 1), rng.gauss(50, 10)
        label = "hi" if a + (b - 50) / 10 > 0 else "lo"
        rows.append(
            [
                f"{a:.3f}" if rng.random() > 0.2 else "",
                f"{b:.2f}" if rng.random() > 0.2 else "NA",
                label,
            ]
        )
    write_rows(tmp_path / "gaps.csv", ["a", "b", "y"], rows)
    run_train(
        tmp_path,
        "data=csv",
        "data.path=gaps.csv",
        "data.target=y",
        "data.na=median",
        "data.na_indicator=false",  # filled by hand below: the same rows without flags
        "trainer.max_epochs=2",
        "run_name=gaps",
        "model.hidden_sizes=[8]",
    )
    from utils.checkpoint.load import load_checkpoint

    fills = load_checkpoint(tmp_path / "checkpoints" / "gaps" / "best.pt")["inputs"]["table"]["na"][
        "fills"
    ]
    gappy = [["", "60"], ["0.5", "?"], ["", ""]]
    write_rows(tmp_path / "rows.csv", ["a", "b"], gappy)
    write_rows(
        tmp_path / "filled.csv",
        ["a", "b"],
        [[fills["a"], 60], [0.5, fills["b"]], [fills["a"], fills["b"]]],
    )
    out = {}
    for name in ("rows", "filled"):
        run_python(
            tmp_path,
            str(PREDICT),
            "ckpt=checkpoints/gaps/best.pt",
            f"input={name}.csv",
            f"out={name}-out.csv",
            "runs=predict-runs",
        )
        with open(tmp_path / f"{name}-out.csv", newline="") as f:
            out[name] = list(csv.DictReader(f))
    assert len(out["rows"]) == 3 and out["rows"] == out["filled"]


def test_a_gap_in_a_column_training_dropped_rows_for_is_refused_at_predict(tmp_path):
    rows = [[str(i % 7), "" if i % 9 == 0 else str(i), "xy"[i % 2]] for i in range(120)]
    write_rows(tmp_path / "t.csv", ["a", "b", "y"], rows)
    run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.na=drop",
        "trainer.max_epochs=1",
        "run_name=drop",
        "data.batch_size=8",
    )
    write_rows(tmp_path / "rows.csv", ["a", "b"], [["1", "2"], ["3", ""]])
    result = run_python(
        tmp_path,
        str(PREDICT),
        "ckpt=checkpoints/drop/best.pt",
        "input=rows.csv",
        "runs=predict-runs",
        ok=False,
    )
    assert "rows.csv line 3 has a gap in a column that training left rows out for" in (
        error_line(result)
    )


@pytest.mark.parametrize(
    "edit",
    [
        {"fills": {"a": "1; import os"}},
        {"fills": {"a": math.nan}},
        {"default": "exec"},
        {"indicators": "a"},
        {"columns": {"a": "mean", 3: "drop"}},
        {"fills": {"a": 1e39}},  # finite in float64 only
        {"fills": {}},  # mean fills every column: a column without its fill would predict NaN
        {"indicators": ["zzz"]},
        {"indicators": ["a", "a"]},  # unknown, twice
        {"fills": {"a": 1.0, "extra": 2.0}},
        {"columns": {"extra": "mean"}},
    ],
)
def test_an_edited_gaps_record_is_refused(edit):
    from data.tables.missing import MissingValues
    from utils.errors import UserError

    record = {
        "default": "mean",
        "columns": {},
        "constant": 0.0,
        "fills": {"a": 1.0},
        "indicators": [],
    }
    assert MissingValues.from_record(record, ["a"]).fills == {"a": 1.0}
    with pytest.raises(UserError, match="table record of missing values is not what torchloom"):
        MissingValues.from_record({**record, **edit}, ["a"])


def test_a_cell_finite_only_in_float64_is_refused_naming_its_line(tmp_path):
    rows = [[str(i % 7), str(i), "xy"[i % 2]] for i in range(40)]
    rows[5][1] = "1e39"
    write_rows(tmp_path / "t.csv", ["a", "b", "y"], rows)
    result = run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "trainer.max_epochs=1",
        "data.batch_size=8",
        ok=False,
    )
    assert "t.csv line 7, column 'b': 1e39 is not finite as a float32 feature" in error_line(result)


def test_the_fill_line_lists_only_the_columns_that_had_gaps(tmp_path):
    rows = [[str(i % 7), "" if i % 9 == 0 else str(i), str(i % 4), "xy"[i % 2]] for i in range(120)]
    write_rows(tmp_path / "t.csv", ["a", "b", "c", "y"], rows)
    result = run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.na=median",
        "trainer.max_epochs=1",
        "data.batch_size=8",
        "trainer.refit=false",  # a refit reads the table again and says its line again
    )
    (line,) = [line for line in result.stdout.splitlines() if "gaps filled from the train" in line]
    assert "b=" in line and "a=" not in line and "c=" not in line


def test_evaluate_follows_the_stored_fills_or_says_why_it_cannot(tmp_path):
    rows = [[str(i % 7), "" if i % 9 == 0 else str(i), "xy"[i % 2]] for i in range(120)]
    write_rows(tmp_path / "t.csv", ["a", "b", "y"], rows)
    run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.na=mean",
        "trainer.max_epochs=1",
        "run_name=mean",
        "data.batch_size=8",
    )
    run_python(tmp_path, str(EVALUATE), "ckpt=checkpoints/mean/best.pt", "runs=eval")
    other = [[str(i % 5), "" if i % 4 == 0 else str(3 * i), "xy"[i % 2]] for i in range(120)]
    write_rows(tmp_path / "other.csv", ["a", "b", "y"], other)
    result = run_python(
        tmp_path,
        str(EVALUATE),
        "ckpt=checkpoints/mean/best.pt",
        "data.path=other.csv",
        "runs=eval",
        ok=False,
    )
    assert "filled a table's gaps with statistics of its own train split" in error_line(result)


def test_a_resumed_run_normalises_and_fills_as_it_started(tmp_path):
    """The table is edited between the stop and the resume (its numbers shifted, so its
    statistics change): allowed, the resumed run keeps the mean and std it started with; not
    allowed, a change to what its gaps are filled with is refused in one line, as changed data
    (docs/provenance.md)."""
    from conftest import EXIT_INTERRUPTED, checkpoint

    rows = [[str(i % 7), "" if i % 9 == 0 else str(i), "xy"[i % 2]] for i in range(200)]
    write_rows(tmp_path / "t.csv", ["a", "b", "y"], rows)
    run = [
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.na_columns={b: mean}",
        "data.batch_size=8",
        "trainer.max_epochs=3",
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "run_name=cut",
    ]
    first = run_train(tmp_path, *run, ok=False, env={"SIGNAL_AT_FORWARD": "20"})
    assert first.returncode == EXIT_INTERRUPTED
    started = checkpoint(tmp_path, "cut")["inputs"]
    shifted = [[str(int(a) + 100), b, y] for a, b, y in rows]  # a (no gaps, no fill): its scale
    write_rows(tmp_path / "t.csv", ["a", "b", "y"], shifted)
    # Other data: allowed (docs/provenance.md), and normalised as the run started.
    resumed = run_train(tmp_path, *run, "resume=auto", "resume_allow_changes=true")
    assert "normalising with the statistics the resumed checkpoint recorded" in resumed.stdout
    ended = checkpoint(tmp_path, "cut")["inputs"]
    assert (ended["mean"], ended["std"]) == (started["mean"], started["std"])
    refilled = [[a, "" if i % 9 == 0 else str(5 * i), y] for i, (a, _, y) in enumerate(rows)]
    write_rows(tmp_path / "t.csv", ["a", "b", "y"], refilled)  # b's mean, its fill, changes
    refused = run_train(tmp_path, *run, "trainer.max_epochs=4", "resume=auto", ok=False)
    assert "the data changed since" in error_line(refused)
    assert "resume_allow_changes=true" in error_line(refused)
