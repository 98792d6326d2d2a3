"""report.html, through the real entry points: train.py writes one per run (and evaluate.py
beside its metrics.json, a sweep in its folder), report.py writes one again for any finished
folder. What a user relies on: it is there, self-contained, its pictures decode, its figures
are metrics.json's, the run's data cannot inject HTML, a killed and resumed run's curves have
no gap and no repeated step, and the simple baselines stand beside the run's figures."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    EVALUATE,
    ROOT,
    error_line,
    imagefolder_root,  # noqa: F401 - a fixture
    killed_at,
    read_metrics,
    run_python,
    run_train,
    write_rows,
)
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from utils.report.history import read_history, repeated_steps
from utils.report.page import number

REPORT = str(ROOT / "report.py")
QUICK = ["trainer.max_epochs=3"]
ON = ["report=true", "baselines=true"]  # what the suite's other runs leave out (conftest QUIET)


def pictures(page: str) -> list[Image.Image]:
    """Every embedded picture, decoded (a PNG that does not decode fails the test)."""
    found = []
    for encoded in re.findall(r'src="data:image/png;base64,([^"]+)"', page):
        image = Image.open(io.BytesIO(base64.b64decode(encoded)))
        image.load()
        assert image.format == "PNG" and image.width > 50 and image.height > 50
        found.append(image)
    return found


def shown_figures(page: str) -> dict[str, str]:
    """The figures the report prints, by metric name, as text."""
    cells = re.findall(r'<td class="n" data-metric="([^"]+)">([^<]*)</td>', page)
    return {html.unescape(name): html.unescape(value) for name, value in cells}


def self_contained(page: str) -> None:
    assert "<script" not in page.lower()
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched: no network


@pytest.fixture(scope="module")
def default_job(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("report")
    run_train(cwd, *ON, "run_name=first")
    return cwd


def test_the_first_command_writes_a_report_whose_figures_are_metrics_json(default_job):
    run_dir = default_job / "runs" / "first"
    page = (run_dir / "report.html").read_text()
    self_contained(page)
    assert (run_dir / "report.html").stat().st_size < 1_000_000
    assert len(pictures(page)) == 5  # curves, confusion, per class, reliability, samples
    metrics = read_metrics(run_dir)
    shown = shown_figures(page)
    assert {"test/acc", "val/acc", "test/ece", "train/loss"} <= set(shown)
    for name, text in shown.items():
        assert text == number(metrics[name]), name
    for caption in ("confusion: counts", "reliability", "worst-predicted samples"):
        assert caption in page
    # the confusion matrix counts every test sample, as metrics.json's sizes say
    with np.load(run_dir / "test_predictions.npz", allow_pickle=False) as kept:
        assert len(kept["loss"]) == metrics["samples"]["test"]
        assert (kept["predicted"] == kept["target"]).mean() == pytest.approx(metrics["test/acc"])


def test_report_py_writes_it_again_from_the_folder_alone(default_job):
    run_dir = default_job / "runs" / "first"
    first = shown_figures((run_dir / "report.html").read_text())
    (run_dir / "report.html").unlink()
    result = run_python(default_job, REPORT, "runs/first")
    assert "report: runs/first/report.html" in result.stdout
    assert shown_figures((run_dir / "report.html").read_text()) == first


def test_evaluate_writes_its_report_beside_its_metrics(default_job):
    run_python(
        default_job,
        str(EVALUATE),
        "report=true",
        "ckpt=checkpoints/first/best.pt",
        "hydra.run.dir=runs/eval/one",
    )
    folder = default_job / "runs" / "eval" / "one"
    page = (folder / "report.html").read_text()
    self_contained(page)
    assert len(pictures(page)) == 3  # confusion, per class, reliability
    result = json.loads((folder / "metrics.json").read_text())["checkpoints/first/best.pt"]
    for name, text in shown_figures(page).items():
        assert text == number(result[name]), name
    (folder / "report.html").unlink()
    run_python(default_job, REPORT, "runs/eval/one")
    assert shown_figures((folder / "report.html").read_text()) == shown_figures(page)


def test_bad_folders_and_edited_predictions_are_one_line_each(default_job, tmp_path):
    for folder, said in (
        ("nowhere", "nowhere is not a folder"),
        (".", "holds no metrics.json: not a finished run's folder"),
    ):
        result = run_python(default_job, REPORT, folder, ok=False)
        assert result.returncode == 2 and said in error_line(result), result.stderr
    run_dir = default_job / "runs" / "first"
    kept = run_dir / "test_predictions.npz"
    original = kept.read_bytes()
    with np.load(kept, allow_pickle=False) as arrays:
        fields = dict(arrays)
    edits = {
        "a pickled object": {**fields, "loss": np.array([object()] * 3, dtype=object)},
        "a class past the classes": {**fields, "target": fields["target"] + 100},
        "a shorter column": {**fields, "confidence": fields["confidence"][:5]},
        "an unknown array": {**fields, "payload": np.zeros(3)},
    }
    try:
        for what, arrays in edits.items():
            kept.write_bytes(_npz(arrays))
            result = run_python(default_job, REPORT, "runs/first", ok=False)
            assert result.returncode == 2, what
            assert "test_predictions.npz" in error_line(result), (what, result.stderr)
        # a few bytes that declare 200 million numbers: refused from the header, nothing unpacked
        header = {"descr": "<f8", "fortran_order": False, "shape": (200_000_000,)}
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, mode="w") as archive, archive.open("loss.npy", "w") as member:
            np.lib.format.write_array_header_1_0(member, header)
        kept.write_bytes(buffer.getvalue())
        result = run_python(default_job, REPORT, "runs/first", ok=False)
        assert result.returncode == 2 and "declares 200,000,000 values" in error_line(result)
    finally:
        kept.write_bytes(original)


def _npz(arrays: dict) -> bytes:
    """An .npz as NumPy writes one, pickled objects allowed (what an attacker may send)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, mode="w") as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=True)
    return buffer.getvalue()


HOSTILE = "<script>alert(1)</script>"


def test_labels_and_columns_from_the_data_are_shown_as_text(tmp_path):
    rows = [[f"{i % 7}", f"{(i * 3) % 5}", HOSTILE if i % 2 else "a&b"] for i in range(80)]
    write_rows(tmp_path / "t.csv", ["x<img src=x>", "y", "kind"], rows)
    run_train(
        tmp_path, *ON, "data=csv", "data.path=t.csv", "data.target=kind", *QUICK, "run_name=h"
    )
    page = (tmp_path / "runs" / "h" / "report.html").read_text()
    self_contained(page)
    assert "<img src=x>" not in page and HOSTILE not in page
    assert html.escape(HOSTILE) in page  # the class name, shown as the text it is
    # trainer.refit's figures (a small table refits on train ∪ val) join the run's report
    shown, metrics = shown_figures(page), read_metrics(tmp_path / "runs" / "h")
    assert shown["refit/test/acc"] == number(metrics["refit/test/acc"])


def test_a_killed_and_resumed_run_has_one_point_a_step_as_a_straight_run(tmp_path):
    run = [
        *QUICK,
        "trainer.log_every_n_steps=5",
        "model=mlp",
        "model._target_=signalling_model.mlp",
    ]
    run_train(tmp_path, *ON, *run, "run_name=straight")
    first = run_train(tmp_path, *ON, *run, "run_name=killed", ok=False, env=killed_at(45))
    assert first.returncode in (-9, 137), first.stderr[-2000:]
    run_train(tmp_path, *ON, *run, "run_name=killed", "resume=auto")
    straight, _ = read_history(tmp_path / "runs" / "straight")
    resumed, source = read_history(tmp_path / "runs" / "killed")
    assert source == "TensorBoard events"
    assert repeated_steps(resumed) == {}
    events = EventAccumulator(str(tmp_path / "runs" / "killed"), size_guidance={"scalars": 0})
    events.Reload()  # TensorBoard's own reader sees what the report draws
    tags = events.Tags()["scalars"]
    assert {t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags} == resumed
    for tag in ("train/loss", "val/loss", "val/acc", "train/lr"):
        assert [s for s, _ in resumed[tag]] == [s for s, _ in straight[tag]], tag
    page = (tmp_path / "runs" / "killed" / "report.html").read_text()
    assert "repeated or out of order" not in page


def steps_table(path: Path, rows: int = 300) -> Path:
    """A target that is a step of one column: trees find it at once; a small net, 2
    epochs in, does not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 3))
    y = np.where(x[:, 0] > 0.3, 100.0, 0.0) + rng.normal(scale=0.1, size=rows)
    table = [
        [f"{a:.4f}", f"{b:.4f}", f"{c:.4f}", f"{t:.4f}"] for (a, b, c), t in zip(x, y, strict=True)
    ]
    return write_rows(path, ["a", "b", "c", "target"], table)


def test_a_table_is_scored_beside_the_baselines_and_the_report_says_who_wins(tmp_path):
    pytest.importorskip("sklearn")
    steps_table(tmp_path / "steps.csv")
    run = ["data=csv", "data.path=steps.csv", "data.target=target", "task=regression"]
    run += ["trainer.max_epochs=2", "trainer.refit=false"]
    run_train(tmp_path, *ON, *run, "run_name=b")
    metrics = read_metrics(tmp_path / "runs" / "b")
    for name in ("hgb", "linear"):
        assert {f"baseline/{name}/test/{m}" for m in ("mae", "rmse", "r2")} <= set(metrics)
        assert metrics[f"baseline/{name}/fit_seconds"] >= 0
    assert metrics["baseline/hgb/test/mae"] < 1.0 < metrics["test/mae"]  # trees find the step
    page = (tmp_path / "runs" / "b" / "report.html").read_text()
    assert "the hgb baseline beats this run on test/mae" in page
    for name, text in shown_figures(page).items():
        assert text == number(metrics[name]), name
    assert "predicted against actual" in page
    run_train(tmp_path, "report=true", *run, "run_name=off", "baselines=false")
    assert not [k for k in read_metrics(tmp_path / "runs" / "off") if k.startswith("baseline")]


def test_an_image_folder_run_shows_its_worst_images(tmp_path, imagefolder_root):  # noqa: F811
    run_train(
        tmp_path, *ON, "data=imagefolder", f"data.root={imagefolder_root}", *QUICK, "run_name=i"
    )
    page = (tmp_path / "runs" / "i" / "report.html").read_text()
    assert "worst-predicted samples" in page and len(pictures(page)) == 5
    assert not [k for k in read_metrics(tmp_path / "runs" / "i") if k.startswith("baseline")]


def test_a_text_run_shows_its_worst_texts_and_a_tfidf_baseline(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("sklearn")
    from texts import write_reviews

    write_reviews(tmp_path / "reviews.csv")
    run = ["data=text", "data.text=review", "data.target=sentiment", "data.path=reviews.csv"]
    run_train(tmp_path, *ON, *run, *QUICK, "data.batch_size=16", "run_name=t")
    metrics = read_metrics(tmp_path / "runs" / "t")
    assert 0.5 < metrics["baseline/tfidf/test/acc"] <= 1.0
    page = (tmp_path / "runs" / "t" / "report.html").read_text()
    assert "<th>as read</th>" in page and " film" in page.lower()


def test_a_report_that_cannot_be_written_is_a_warning_and_the_run_stands(tmp_path):
    (tmp_path / "runs" / "blocked" / "report.html").mkdir(parents=True)  # a folder in its way
    result = run_train(tmp_path, *ON, *QUICK, "run_name=blocked", "overwrite=true")
    assert "warning: report.html not written" in result.stdout + result.stderr
    assert read_metrics(tmp_path / "runs" / "blocked")["status"] == "completed"


def test_a_sweep_writes_its_report_with_every_job(tmp_path):
    run_train(tmp_path, "-m", *ON, "optim.lr=0.01,0.001", *QUICK, "run_name=sw")
    page = (tmp_path / "runs" / "sw" / "report.html").read_text()
    self_contained(page)
    assert page.count("optim.lr=0.01") >= 1 and "optim.lr=0.001" in page


def test_a_run_with_many_classes_shows_the_most_confused(tmp_path):
    classes = 40
    rows = [[f"{i % classes}.{i % 3}", f"c{i % classes}"] for i in range(classes * 6)]
    write_rows(tmp_path / "many.csv", ["x", "kind"], rows)
    run_train(
        tmp_path,
        "report=true",
        "data=csv",
        "data.path=many.csv",
        "data.target=kind",
        "trainer.max_epochs=1",
        "baselines=false",
        "run_name=m",
    )
    page = (tmp_path / "runs" / "m" / "report.html").read_text()
    assert re.search(r"the \d+ most confused of 40 classes", page)


def test_nan_metrics_are_named_not_drawn(default_job, tmp_path):
    import shutil

    copy = tmp_path / "nan"
    shutil.copytree(default_job / "runs" / "first", copy)
    metrics = json.loads((copy / "metrics.json").read_text())
    metrics["test/loss"] = float("nan")
    # and what no run writes, but a hand may: odd shapes of the other keys
    metrics.update({"overrides": {"a": 1}, "baseline/odd": 1.0, "test_split": ["x"]})
    (copy / "metrics.json").write_text(json.dumps(metrics))
    provenance = json.loads((copy / "provenance.json").read_text())
    provenance.update(command=["not", "an", "object"], data="none")
    (copy / "provenance.json").write_text(json.dumps(provenance))
    run_python(tmp_path, REPORT, str(copy))
    page = (copy / "report.html").read_text()
    assert shown_figures(page)["test/loss"] == "nan" and "not finite: test/loss" in page
    (copy / "metrics.json").write_text("[1, 2]")
    result = run_python(tmp_path, REPORT, str(copy), ok=False)
    assert result.returncode == 2 and "not a JSON object" in error_line(result)


def test_label_sets_get_ranking_curves_per_label(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for x, y in rng.random((160, 2)):
        on = [name for name, yes in (("a", x > 0.5), ("b", y > 0.5), ("c", x + y > 1)) if yes]
        rows.append([f"{x:.3f}", f"{y:.3f}", ";".join(on)])
    write_rows(tmp_path / "tags.csv", ["x", "y", "tags"], rows)
    run = ["data=csv", "data.path=tags.csv", "data.target=tags", "task=multilabel"]
    run_train(tmp_path, *ON, *run, *QUICK, "trainer.refit=false", "run_name=ml")
    page = (tmp_path / "runs" / "ml" / "report.html").read_text()
    assert "ROC and precision-recall" in page and "worst-predicted samples" in page
    assert len(pictures(page)) == 2  # the curves; ROC and PR of each label
