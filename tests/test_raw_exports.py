"""The exports take what a user has: an image model's .pt2 and .onnx take the uint8 pixels of
PNG files, a table model's take a CSV's raw columns (NaN at the gaps, each categorical value as
its code in the recorded vocabulary). Fed by a process that imports nothing of torchloom, with
torch.export.load or onnxruntime and the file's own metadata, they give predict.py's answers."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import (
    PREDICT,
    run_evaluate,
    run_python,
    run_train,
    slow,
    write_imagefolder,
    write_rows,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# Reads the metadata each file carries and feeds it raw inputs; prints the modules it imported
# of torchloom (none) and writes the probabilities of both programs.
CONSUMER = """
import csv, json, math, sys
import numpy, onnxruntime, torch
from PIL import Image

extra = {"torchloom.json": ""}
program = torch.export.load("model.pt2", extra_files=extra).module()
session = onnxruntime.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
record = json.loads(session.get_modelmeta().custom_metadata_map["torchloom"])
assert json.loads(extra["torchloom.json"]) == record
given = record["input"]
if given["kind"] == "pixels":
    mode = "L" if "grey" in given["layout"] else "RGB"
    names = [line for line in open("inputs.txt").read().split()]
    arrays = [numpy.asarray(Image.open(name).convert(mode)) for name in names]
    batch = numpy.stack([a[None] if a.ndim == 2 else a.transpose(2, 0, 1) for a in arrays])
    batch = numpy.ascontiguousarray(batch, dtype=numpy.uint8)
else:
    rows = list(csv.DictReader(open("new.csv", newline="")))
    codes = given["categorical_codes"]
    def number(text):
        return float(text) if text.strip() else math.nan
    def code(column, text):
        return float(codes[column].index(text)) if text in codes[column] else -1.0
    batch = numpy.array(
        [[number(row[c]) for c in given["numeric"]] + [code(c, row[c]) for c in codes]
         for row in rows], dtype=numpy.float32)
assert batch.dtype.name == given["dtype"], (batch.dtype, given)
outputs = {
    "pt2": program(torch.from_numpy(batch)).softmax(1),
    "onnx": torch.from_numpy(session.run(None, {"input": batch})[0]).softmax(1),
}
torch.save({"outputs": outputs, "classes": record["targets"]["names"]}, "outputs.pt")
print(sorted({m.split(".")[0] for m in sys.modules} & {"utils", "models", "data"}))
"""


def exported_answers(cwd) -> tuple[dict, list[str]]:
    for name in ("model.pt2", "model.onnx"):
        run_evaluate(cwd, "ckpt=checkpoints/r", f"export={name}", f"runs=e-{name}")
    (cwd / "consumer.py").write_text(CONSUMER)
    consumer = run_python(cwd, "consumer.py", process=True)
    assert consumer.stdout.strip() == "[]"  # nothing of torchloom was imported to run them
    import torch

    saved = torch.load(cwd / "outputs.pt")
    return saved["outputs"], saved["classes"]


def assert_same_as_predict(cwd, outputs: dict, classes: list[str], rows: list[dict]) -> None:
    assert len(rows) == len(outputs["pt2"])
    for name, probabilities in outputs.items():
        for row, p in zip(rows, probabilities.tolist(), strict=True):
            best = max(range(len(p)), key=p.__getitem__)
            assert classes[best] == row["class1"], (name, row)
            assert p[best] == pytest.approx(float(row["p1"]), abs=1e-5), (name, row)


def predicted(cwd, *args: str) -> list[dict]:
    run_python(cwd, str(PREDICT), "ckpt=checkpoints/r", *args, "out=p.csv", "runs=pr")
    with open(cwd / "p.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_an_image_models_exports_take_png_pixels_and_match_predict(tmp_path):
    write_imagefolder(tmp_path / "images", per_class=8)  # 12×10 RGB PNG files
    run_train(
        tmp_path,
        "data=imagefolder",
        "data.root=images",
        "data.image_size=[12,10]",  # the files' size: the export takes pixels at this size
        "data.num_workers=0",
        "trainer.max_epochs=2",
        "model.channels=[8]",
        "run_name=r",
    )
    files = sorted((tmp_path / "images" / "val").rglob("*.png"))
    (tmp_path / "inputs.txt").write_text("\n".join(map(str, files)))
    outputs, classes = exported_answers(tmp_path)
    rows = predicted(tmp_path, "input=images/val")
    by_file = {row["input"]: row for row in rows}
    ordered = [by_file[str(f.relative_to(tmp_path / "images" / "val"))] for f in files]
    assert_same_as_predict(tmp_path, outputs, classes, ordered)


# the default (under 8,000 rows: inputs clamped to the training range, no embedding), and the
# periodic embedding with the 0/1 columns as they are
@pytest.mark.parametrize("embed", ["auto", *slow("false")])
def test_a_table_models_exports_take_raw_columns_with_gaps_and_categories(tmp_path, embed):
    colours = ["red", "green", "blue"]
    rows = []
    for i in range(160):
        size = "" if i % 7 == 0 else f"{(i * 37 % 100) / 10:.1f}"  # gaps: NaN to the export
        label = "big" if i * 37 % 100 > 50 else "small"
        rows.append([size, f"{(i * 53 % 41) - 20}", colours[i % 3], label])
    write_rows(tmp_path / "t.csv", ["size", "offset", "colour", "y"], rows)
    new = [["", "3", "green"], ["7.5", "-4", "purple"], ["1.0", "", "red"], ["9.9", "12", "blue"]]
    new += [["1e6", "-1e6", "red"]]  # far outside the training range: clamped inside
    write_rows(tmp_path / "new.csv", ["size", "offset", "colour"], new)
    run = ("data=csv", "data.path=t.csv", "data.target=y", f"model.embed_indicators={embed}")
    run += ("model.table_fitted=false",) if embed == "false" else ()
    result = run_train(tmp_path, *run, "trainer.max_epochs=3", "run_name=r")  # not how well
    said = result.stdout + result.stderr
    assert ("4 0/1 columns as they are" in said) == (embed == "false")  # colour: 3, size: a gap
    outputs, classes = exported_answers(tmp_path)
    assert_same_as_predict(tmp_path, outputs, classes, predicted(tmp_path, "input=new.csv"))
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    given = json.loads(session.get_modelmeta().custom_metadata_map["torchloom"])["input"]
    assert given["columns"] == ["size", "offset", "colour"]  # the documented order
    assert given["categorical_codes"] == {"colour": ["blue", "green", "red"]}


@pytest.mark.parametrize("na", ["error", "drop"])
def test_a_gap_where_training_filled_none_gets_nan_from_the_exports_not_a_class(tmp_path, na):
    """The export of a data.na=error (or drop) table took a NaN and answered class 0, and its
    record said gaps were accepted, where predict.py refuses the row."""
    rows = [
        [f"{(i * 37 % 100) / 10:.1f}", f"{i % 9}", "big" if i * 37 % 100 > 50 else "small"]
        for i in range(120)
    ]
    write_rows(tmp_path / "t.csv", ["size", "offset", "y"], rows)
    new = [["", "3"], ["7.5", "4"], ["1.0", "2"]]
    write_rows(tmp_path / "new.csv", ["size", "offset"], new)
    run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        f"data.na={na}",
        "trainer.max_epochs=3",  # what a gap becomes, not how well the model fits
        "run_name=r",
    )
    outputs, _ = exported_answers(tmp_path)
    for probabilities in outputs.values():
        assert probabilities[0].isnan().all() and not probabilities[1:].isnan().any()
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    given = json.loads(session.get_modelmeta().custom_metadata_map["torchloom"])["input"]
    assert "no gap accepted in ['size', 'offset']" in given["gaps"]
    refused = run_python(
        tmp_path, str(PREDICT), "ckpt=checkpoints/r", "input=new.csv", "out=p.csv", ok=False
    )
    assert refused.returncode == 2
