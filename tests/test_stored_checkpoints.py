"""Checkpoints written by an earlier version of torchloom keep working: they resume, evaluate,
predict and teach. The files under tests/fixtures/checkpoints/ were written by the code as it
stood before its modules moved into packages, and are never rewritten:

- ``digits_default/last.pt``: ``python train.py trainer.max_epochs=1 run_name=digits_default``
- ``digits_csv_ema_calibrated/last.pt``: ``python train.py trainer.max_epochs=2
  run_name=digits_csv_ema_calibrated logger=csv trainer.ema.decay=0.9 model.hidden_sizes=[32]``,
  then ``python evaluate.py ckpt=checkpoints/digits_csv_ema_calibrated/last.pt
  calibrate=temperature``

Their stored configs name the builders where they lived then (``utils.trackers.CsvLog``, ...).

One per family of inputs, written before the data builders moved into their families' folders
(``data.tabular.load_csv``, ``data.parquet.load_parquet``), in a folder holding
tests/fixtures/data/'s files, with ``TOKENIZERS_PARALLELISM=false``:

- ``table_auto/last.pt``: ``python train.py data=csv data.path=table.csv data.target=grade
  trainer.max_epochs=2 run_name=table_auto`` (model=auto: the tabular ensemble);
- ``text_auto/last.pt``: ``python train.py data=text data.path=texts.csv trainer.max_epochs=2
  run_name=text_auto``;
- ``shards_mlp/last.pt``: ``python shard.py data=digits out=digits_shards``, then ``python
  train.py data=parquet data.path=digits_shards trainer.max_epochs=1 run_name=shards_mlp
  model=mlp model.hidden_sizes=[32]``.

tests/fixtures/expected/ holds what predict.py wrote then from each (``input=predict.csv``,
``input=predict_texts.csv``, ``input=one.png``)."""

from __future__ import annotations

import csv
import pickle
import re
import shutil

import numpy as np
import pytest
import torch
from conftest import ROOT, checkpoint, error_line, run_evaluate, run_python, run_train
from PIL import Image

from utils.checkpoint.format import KEYS
from utils.config.trust import MOVED_TARGETS

FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"
DEFAULT, CALIBRATED = "digits_default", "digits_csv_ema_calibrated"
# The test accuracy each fixture scored when it was written (evaluate.py, the weights auto picks).
TEST_ACC = {DEFAULT: 0.8917, CALIBRATED: 0.7361}
DATA, EXPECTED = ROOT / "tests" / "fixtures" / "data", ROOT / "tests" / "fixtures" / "expected"
# Each family's fixture: its test accuracy then, the input predict.py read, what it wrote.
FAMILIES = {
    "table_auto": (0.7778, "predict.csv", "pred_table.csv"),
    "text_auto": (0.8889, "predict_texts.csv", "pred_text.csv"),
    "shards_mlp": (0.5, "one.png", "pred_shards.csv"),
}


def copied(cwd, name):
    """The fixture's run folder, copied to cwd/checkpoints/<name>/ as a user's would be."""
    folder = cwd / "checkpoints" / name
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / name / "last.pt", folder / "last.pt")
    return folder


def test_the_fixtures_name_builders_where_they_lived_before_the_move():
    # The point of the fixtures: a stored logger _target_ that has since moved.
    stored = torch.load(FIXTURES / CALIBRATED / "last.pt", weights_only=True)
    assert stored["config"]["logger"] == {"csv": {"_target_": "utils.trackers.CsvLog"}}
    assert "calibration" in stored["inputs"]


def test_an_earlier_checkpoint_resumes(tmp_path):
    for name, epochs in ((DEFAULT, 1), (CALIBRATED, 2)):
        copied(tmp_path, name)
        logger = ["logger=csv"] if name == CALIBRATED else []
        run_train(
            tmp_path,
            f"run_name={name}",
            "resume=auto",
            "model=mlp",  # the default model when these were written (model=auto since)
            f"trainer.max_epochs={epochs + 1}",
            *logger,
            *(["trainer.ema.decay=0.9", "model.hidden_sizes=[32]"] if name == CALIBRATED else []),
        )
        resumed = checkpoint(tmp_path, name)
        before = torch.load(FIXTURES / name / "last.pt", weights_only=True)
        assert resumed["epoch"] == epochs + 1, name
        assert resumed["global_step"] > before["global_step"], name


def test_an_earlier_checkpoint_evaluates_to_the_figure_it_had(tmp_path):
    for name, acc in TEST_ACC.items():
        folder = copied(tmp_path, name)
        result = run_evaluate(tmp_path, f"ckpt={folder / 'last.pt'}")
        found = re.search(r"test/acc\s*│\s*([0-9.]+)", result.stdout)
        assert found and float(found.group(1)) == acc, result.stdout[-2000:]
    assert "applying its stored calibration" in result.stdout


def test_an_earlier_checkpoint_predicts_and_teaches(tmp_path):
    folder = copied(tmp_path, CALIBRATED)
    pixels = np.zeros((8, 8), dtype=np.uint8)
    pixels[1:7, 3:5] = 255  # a one
    Image.fromarray(pixels).save(tmp_path / "one.png")
    run_python(
        tmp_path,
        str(ROOT / "predict.py"),
        f"ckpt={folder / 'last.pt'}",
        "input=one.png",
        "out=one.csv",
        "topk=1",
        "runs=predict-runs",
    )
    assert (tmp_path / "one.csv").read_text().splitlines()[0].startswith("input,class1,p1")
    teacher = copied(tmp_path, DEFAULT) / "last.pt"
    run_train(
        tmp_path,
        f"distill.teacher={teacher}",
        "run_name=student",
        "trainer.max_epochs=1",
        "model.hidden_sizes=[16]",
    )
    assert checkpoint(tmp_path, "student")["distill"]


def test_an_earlier_checkpoint_with_a_target_nobody_wrote_is_still_refused(tmp_path):
    folder = copied(tmp_path, DEFAULT)
    stored = torch.load(folder / "last.pt", weights_only=True)
    stored["config"]["logger"] = {"csv": {"_target_": "utils.trackers.Shell"}}
    torch.save(stored, folder / "last.pt")
    result = run_evaluate(tmp_path, f"ckpt={folder / 'last.pt'}", ok=False)
    assert result.returncode == 2
    assert "utils.trackers.Shell" in error_line(result)


def test_the_readme_lists_every_key_a_checkpoint_holds_and_no_other():
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("- **Checkpoints**") : readme.index("## Resume, evaluate")]
    named = set(re.findall(r"`([a-z_]+)`", paragraph)) - {"state_dict"}
    assert named == set(KEYS)


# Keys written since the fixtures were: optional, so the fixtures resume without them.
ADDED_SINCE_THE_FIXTURES = {"stopped_by", "callbacks", "provenance", "global_batch", "numerics"}


def test_a_checkpoint_holds_exactly_the_declared_keys_and_older_ones_still_fit():
    # The fixtures were written before the key set had one home: the same keys.
    for name in (DEFAULT, CALIBRATED):
        stored = set(torch.load(FIXTURES / name / "last.pt", weights_only=True))
        assert stored == set(KEYS) - ADDED_SINCE_THE_FIXTURES
    assert all(KEYS[key][1] != "required" for key in ADDED_SINCE_THE_FIXTURES)


def test_an_output_the_system_cannot_write_is_one_line_naming_it_and_the_fix(tmp_path):
    folder = copied(tmp_path, CALIBRATED)
    (tmp_path / "a_file").write_text("not a folder")
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(tmp_path / "zero.png")
    result = run_python(
        tmp_path,
        str(ROOT / "predict.py"),
        f"ckpt={folder / 'last.pt'}",
        "input=zero.png",
        "out=a_file/p.csv",
        "runs=predict-runs",
        ok=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot write a_file/p.csv" in error_line(result)
    assert "choose another out=" in error_line(result)
    result = run_evaluate(
        tmp_path, f"ckpt={folder / 'last.pt'}", "export=a_file/model.pt2", ok=False
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot write a_file/model.pt2" in error_line(result)
    assert "choose another export=" in error_line(result)


def family_folder(cwd, name):
    """The family fixture's run folder and its data, as the user's folder held them."""
    shutil.copytree(DATA, cwd, dirs_exist_ok=True)
    return copied(cwd, name)


def rows_of(path):
    return list(csv.reader(path.read_text().splitlines()))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_checkpoint_of_each_family_from_before_the_move_evaluates_and_predicts_the_same(
    tmp_path, name
):
    acc, given, expected = FAMILIES[name]
    folder = family_folder(tmp_path, name)
    stored = torch.load(folder / "last.pt", weights_only=True)
    target = stored["config"]["data"]["_target_"]
    assert target in MOVED_TARGETS or target == "data.text.dataset.load_text"  # where it was
    result = run_evaluate(tmp_path, f"ckpt={folder / 'last.pt'}")
    found = re.search(r"test/acc\s*│\s*([0-9.]+)", result.stdout)
    assert found and float(found.group(1)) == acc, result.stdout[-2000:]
    out = tmp_path / "predicted.csv"
    predict = str(ROOT / "predict.py")
    args = (f"ckpt={folder / 'last.pt'}", f"input={given}", f"out={out}", "runs=predict-runs")
    run_python(tmp_path, predict, *args)
    then, now = rows_of(EXPECTED / expected), rows_of(out)
    assert [row[0] for row in now] == [row[0] for row in then]
    for old, new in zip(then[1:], now[1:], strict=True):
        assert [cell for cell in new if not _number(cell)] == [c for c in old if not _number(c)]
        numbers = [float(c) for c in new if _number(c)], [float(c) for c in old if _number(c)]
        assert numbers[0] == pytest.approx(numbers[1], abs=1e-5)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_checkpoint_of_each_family_from_before_the_move_resumes_and_records_its_inputs_alike(
    tmp_path, name
):
    folder = family_folder(tmp_path, name)
    before = torch.load(folder / "last.pt", weights_only=True)
    epochs = before["epoch"]
    run_train(
        tmp_path,
        *[f"{key}={value}" for key, value in _overrides(before["config"]).items()],
        f"run_name={name}",
        "resume=auto",
        f"trainer.max_epochs={epochs + 1}",
        # Shards are recorded by their objects' full names: these were copied here from where
        # they were written, which a resume names as a change unless allowed.
        *(["resume_allow_changes=true"] if name == "shards_mlp" else []),
    )
    resumed = checkpoint(tmp_path, name)
    assert resumed["epoch"] == epochs + 1 and resumed["global_step"] > before["global_step"]
    # The inputs record a run of the code now writes is the one the code before wrote.
    assert pickle.dumps(resumed["inputs"]) == pickle.dumps(before["inputs"])


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return "." in cell


def _overrides(config: dict) -> dict:
    """The command line that made the fixture, read back from its stored config."""
    data = config["data"]
    group = {"csv": "csv", "text": "text", "parquet": "parquet"}
    name = next(g for g in group if g in data["_target_"].replace("tabular", "csv"))
    wanted = {"data": group[name], "data.path": data["path"]}
    if name == "csv":
        wanted["data.target"] = data["target"]
    if config["model"]["_target_"] == "models.mlp.mlp":
        wanted |= {"model": "mlp", "model.hidden_sizes": "[32]"}
    return wanted


@pytest.mark.parametrize("edit", ["a table grafted on images", "a table's shape edited"])
def test_a_record_whose_table_does_not_encode_its_shape_is_one_line(tmp_path, edit):
    # A pixel model's record holding a table's columns read a CSV into 6 features and fed
    # them to a model of [1, 8, 8] inputs: a traceback from the first layer, exit 1.
    shutil.copytree(DATA, tmp_path, dirs_exist_ok=True)
    if edit == "a table grafted on images":
        stored = torch.load(FIXTURES / DEFAULT / "last.pt", weights_only=True)
        table = torch.load(FIXTURES / "table_auto" / "last.pt", weights_only=True)["inputs"]
        stored["inputs"]["table"] = table["table"]
    else:
        stored = torch.load(FIXTURES / "table_auto" / "last.pt", weights_only=True)
        stored["inputs"]["shape"] = [6, 1, 1]  # six channels: its mean and std still fit
    torch.save(stored, tmp_path / "edited.pt")
    predict = str(ROOT / "predict.py")
    args = ("ckpt=edited.pt", "input=predict.csv", "out=p.csv", "runs=predict-runs")
    for result in (
        run_python(tmp_path, predict, *args, ok=False),
        run_evaluate(tmp_path, "ckpt=edited.pt", ok=False),
    ):
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "its inputs record's table encodes 6 features" in error_line(result)
