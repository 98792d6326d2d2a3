"""The first command on a small or unusual data set: epochs and batch size fitted to its size
and said at start-up, the last partial batch trained on, the model chosen by the data's kind,
a table's text columns found (its identifiers left out), and a start that fails on its data
leaving no folder behind."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import checkpoint, error_line, run_train, write_rows

from data.batching.batches import BatchPlan, fitted_batch_size
from utils.schedulers import epochs_for


def series(path, count: int = 31, length: int = 40, seed: int = 0):
    """Three classes of noisy sine waves, [N, 1, L]: a small UCR-like set."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 3
    steps = np.linspace(0, 6.28, length)
    x = np.sin(steps[None] * (labels[:, None] + 1)) + 0.3 * rng.standard_normal((count, length))
    np.savez(path, x=x[:, None].astype(np.float32), y=labels)
    return path


@pytest.mark.parametrize(
    ("samples", "batch", "world", "batches"),
    [(31, 16, 1, 2), (33, 16, 1, 2), (34, 16, 1, 3), (31, 31, 1, 1), (40, 8, 2, 2)],
)
def test_the_last_partial_batch_is_kept_unless_one_sample_or_several_processes(
    samples, batch, world, batches
):
    assert (
        BatchPlan(batch_size=batch, train=True, seed=0, world_size=world).batch_count(samples)
        == batches
    )


def test_auto_sizes_follow_the_training_set():
    assert [fitted_batch_size("auto", n, "t") for n in (5, 31, 170, 398, 900, 60000)] == [
        5,
        16,
        16,
        32,
        64,
        64,
    ]
    assert fitted_batch_size(512, 100, "t") == 100  # fitted, not refused
    assert epochs_for("auto", 20) == 20  # the bundled digits: 20 steps an epoch
    assert epochs_for("auto", 2) == 200 and epochs_for("auto", 1) == 400
    assert epochs_for(7, 1) == 7  # an explicit count wins


def test_a_small_set_of_series_gets_enough_steps_the_1d_cnn_and_says_so(tmp_path):
    series(tmp_path / "s.npz")
    result = run_train(
        tmp_path, "data=tensors", "data.path=s.npz", "model.channels=[8]", "run_name=s"
    )
    said = " ".join(result.stdout.split() + result.stderr.split())
    # 31 series hold 5 out for val and 5 for test: 21 train, in batches of 16 and 5.
    assert (
        "21 samples, batch 16, 200 epochs (trainer.max_epochs=auto, fitted to the training "
        "set's size) = 400 optimizer steps" in said
    )
    assert "model=auto: the 1-D CNN for sequences [1, 40]" in said
    assert "too few" not in said
    saved = checkpoint(tmp_path, "s")
    assert saved["global_step"] == 400 and saved["epoch"] == 200

    short = run_train(
        tmp_path,
        "data=tensors",
        "data.path=s.npz",
        "model.channels=[8]",
        "trainer.max_epochs=3",
        "run_name=t",
    )
    said = " ".join(short.stdout.split() + short.stderr.split())
    assert "21 samples, batch 16, 3 epochs = 6 optimizer steps" in said
    assert "warning: this run takes only 6 optimizer steps" in said
    assert "trainer.max_epochs" in said.split("only 6 optimizer steps")[1]


def test_a_tables_text_columns_are_found_and_its_identifiers_left_out(tmp_path):
    rows = [
        [
            str(i + 1),
            f"person {i}",
            ["red", "green", "blue"][i % 3],
            f"{i % 11}",
            "a" if i % 3 else "b",
        ]
        for i in range(90)
    ]
    rows[4][3] = ""  # a gap: filled with the median, said in the start-up line
    write_rows(tmp_path / "t.csv", ["row", "name", "colour", "size", "y"], rows)
    run = ("data=csv", "data.path=t.csv", "data.target=y", "trainer.max_epochs=2")  # columns
    result = run_train(tmp_path, *run, "run_name=t")
    said = " ".join(result.stdout.split() + result.stderr.split())
    assert (
        "t.csv: data.categorical=auto: categorical (not all numbers): colour; left out as "
        "identifiers: row (numbers the rows); name (90 distinct values in 90 rows)" in said
    )
    assert "gaps in size (1)" in said
    assert "model=auto: the tabular model (" in said
    table = checkpoint(tmp_path, "t")["inputs"]["table"]
    assert table["numeric"] == ["size"] and table["categories"] == {
        "colour": ["blue", "green", "red"]
    }

    listed = run_train(
        tmp_path, *run, "data.features=[row,size]", "run_name=u"
    )  # a column named in data.features is kept, even one that counts the rows
    assert checkpoint(tmp_path, "u")["inputs"]["table"]["numeric"] == ["row", "size"]
    assert "left out" not in listed.stdout + listed.stderr


def test_a_start_that_fails_on_its_data_leaves_no_folder_and_no_config_tree(tmp_path):
    write_rows(
        tmp_path / "t.csv", ["size", "colour", "y"], [["1", "red", "a"], ["2", "blue", "b"]] * 20
    )
    result = run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.categorical=[]",
        "run_name=bad",
        ok=False,
    )
    assert "column 'colour': 'red' is not a number" in error_line(result)
    assert "_target_" not in result.stdout  # the config tree is printed once data is built
    assert not (tmp_path / "runs" / "bad").exists()
    assert not (tmp_path / "checkpoints" / "bad").exists()

    (tmp_path / "runs" / "kept").mkdir(parents=True)  # a folder the run did not make stays
    (tmp_path / "runs" / "kept" / "notes.txt").write_text("mine")
    again = run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.categorical=[]",
        "run_name=kept",
        "overwrite=true",
        ok=False,
    )
    assert again.returncode == 2
    assert (tmp_path / "runs" / "kept" / "notes.txt").read_text() == "mine"


def test_a_column_name_sends_no_control_sequence_to_the_terminal_or_the_log(tmp_path):
    rows = [[str(i % 5), ["x", "y", "z"][i % 3], str(i % 2)] for i in range(40)]
    write_rows(tmp_path / "t.csv", ["a", "\x1b[31mred\x07", "y"], rows)
    result = run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "trainer.max_epochs=1",
        "run_name=c",
    )
    log = (tmp_path / "runs" / "c" / "train.log").read_text()
    for text in (result.stdout, log):
        assert "categorical (not all numbers): \\x1b[31mred\\x07" in text
        assert "\x1b" not in text and "\x07" not in text


@pytest.mark.parametrize("skipped", [[], [17], [5, 60, 61]])
def test_an_id_column_is_left_out_even_when_its_count_skips_numbers(tmp_path, skipped):
    """On a class-sorted file an ID column is the class: one with a number missing (or a few,
    or counting down) was kept and reached 0.98 on pure-noise features. It is left out."""
    ids = [i for i in range(1, 130) if i not in skipped][:120]
    rng = np.random.default_rng(0)
    rows = [[ids[i], *rng.normal(size=3).round(4), "ab"[i >= 60]] for i in range(120)]
    if skipped == [5, 60, 61]:
        rows = [[1000 - row[0], *row[1:]] for row in rows]  # falling IDs
    write_rows(tmp_path / "t.csv", ["id", "a", "b", "c", "y"], rows)
    run = ("data=csv", "data.path=t.csv", "data.target=y", "trainer.max_epochs=2")
    result = run_train(tmp_path, *run, "run_name=t")
    assert "left out as identifiers: id (numbers the rows)" in " ".join(result.stdout.split())
    assert checkpoint(tmp_path, "t")["inputs"]["table"]["numeric"] == ["a", "b", "c"]


@pytest.mark.parametrize("marker", ["", "NA", "?"])
def test_a_missing_class_label_is_refused_not_learnt_as_a_class(tmp_path, marker):
    rows = [[i % 7, ["n", "y"][i % 2]] for i in range(60)]
    rows[23][1] = marker
    rows[40][1] = marker
    write_rows(tmp_path / "t.csv", ["x", "vote"], rows)
    line = error_line(
        run_train(tmp_path, "data=csv", "data.path=t.csv", "data.target=vote", ok=False)
    )
    shown = repr(marker) if marker else "empty"
    assert f"t.csv line 25: target column 'vote' is {shown}, a missing label (2 of 60" in line
    assert "give those rows their class or remove them" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # no runs/, checkpoints/


@pytest.mark.parametrize(("stray", "line"), [("oops", 30), ("12 kg", 3)])
def test_a_stray_text_cell_in_a_number_column_is_named_not_left_out(tmp_path, stray, line):
    rows = [[f"{i * 0.5 % 7}", i % 5, "ab"[i % 2]] for i in range(52)]
    rows[line - 2][0] = stray
    write_rows(tmp_path / "t.csv", ["weight", "x", "y"], rows)
    said = error_line(run_train(tmp_path, "data=csv", "data.path=t.csv", "data.target=y", ok=False))
    assert f"t.csv line {line}, column 'weight': {stray!r} is not a number, where 51 of" in said
    assert "make it a gap (empty or NA), or list weight in data.categorical=[...]" in said
    listed = run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.categorical=[weight]",
        "trainer.max_epochs=2",
    )
    assert listed.returncode == 0
