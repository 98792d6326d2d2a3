"""Checkpoints written by an earlier version of torchloom keep working: they resume, evaluate,
predict and teach. The files under tests/fixtures/checkpoints/ were written by the code as it
stood before its modules moved into packages, and are never rewritten:

- ``digits_default/last.pt``: ``python train.py trainer.max_epochs=1 run_name=digits_default``
- ``digits_csv_ema_calibrated/last.pt``: ``python train.py trainer.max_epochs=2
  run_name=digits_csv_ema_calibrated logger=csv trainer.ema.decay=0.9 model.hidden_sizes=[32]``,
  then ``python evaluate.py ckpt=checkpoints/digits_csv_ema_calibrated/last.pt
  calibrate=temperature``

Their stored configs name the builders where they lived then (``utils.trackers.CsvLog``, ...)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import torch
from conftest import ROOT, checkpoint, error_line, run_evaluate, run_python, run_train
from PIL import Image

from utils.checkpoint.format import KEYS

FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"
DEFAULT, CALIBRATED = "digits_default", "digits_csv_ema_calibrated"
# The test accuracy each fixture scored when it was written (evaluate.py, the weights auto picks).
TEST_ACC = {DEFAULT: 0.8917, CALIBRATED: 0.7361}


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
