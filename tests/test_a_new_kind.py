"""A new kind of input is a module of its own and one registration: the counts of
tests/helpers/count_kind.py (int64 word counts, taken as normalised log(1 + count)), registered
as data/kinds.py's one line would, train through train.py, are recorded in the checkpoint and
read back as that kind, read from a file as predict.py reads one, and exported through their
own front. Nothing in utils/, the entry points or data/batching/ knows them."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import HELPERS, ROOT, checkpoint, read_metrics, run_train
from omegaconf import OmegaConf

import data.kinds
from utils.checkpoint.rebuild import rebuild_model
from utils.checkpoint.record import InputRecord
from utils.checkpoint.stored import task_config
from utils.config.build import build

sys.path.insert(0, str(HELPERS))  # the kind's own module, as a user's folder would hold it
from count_kind import Counts, LogCounts

WORDS = 24


@pytest.fixture
def registered(monkeypatch):
    """data/kinds.py with the counts' line added."""
    monkeypatch.setattr(data.kinds, "KINDS", (Counts, *data.kinds.KINDS))


def test_a_new_kind_trains_records_reads_and_exports_as_its_own(tmp_path, registered):
    run_train(
        tmp_path,
        "data=synthetic",
        "data._target_=count_kind.load_counts",
        f"data.shape=[1,1,{WORDS}]",
        "data.num_classes=4",
        "model=mlp",
        "model.hidden_sizes=[32]",
        "trainer.max_epochs=4",
        "run_name=counts",
    )
    assert read_metrics(next((tmp_path / "runs").glob("counts*")))["test/acc"] > 0.6  # of 4
    stored = checkpoint(tmp_path, "counts")
    assert stored["inputs"]["vocabulary"] == [f"word{i}" for i in range(WORDS)]

    record = InputRecord.read(stored["inputs"], tmp_path / "last.pt")
    assert isinstance(record.inputs, Counts) and record.to_dict() == stored["inputs"]
    assert isinstance(record.transform(torch.device("cpu")), LogCounts)

    given = tmp_path / "documents.txt"
    given.write_text("0 3 1 " * 8 + "\n" + "2 0 0 " * 8 + "\n")
    names, counts, _ = record.read_inputs(given)
    assert names == ["1", "2"] and counts.dtype == torch.long and counts.shape == (2, WORDS)

    task = build(task_config(stored["config"])).fitted(record, torch.device("cpu"), record)
    config = stored["config"]
    modules = rebuild_model(config, stored["model"], record, torch.device("cpu"), task)
    model = modules.model.eval()
    front = record.inputs.front(model, record.mean, record.std, record.input_shape)
    with torch.no_grad():
        expected = model(record.transform(torch.device("cpu")).normalize(counts))
        assert torch.allclose(front(counts), expected, atol=1e-6)
    assert OmegaConf.create(config).data._target_ == "count_kind.load_counts"


def test_a_stored_record_is_claimed_by_the_kind_registered_for_it(tmp_path, registered):
    record = {
        "shape": [3],
        "mean": [0.0] * 3,
        "std": [1.0] * 3,
        "num_classes": 2,
        "classes": None,
        "table": None,
        "targets": {"kind": "classes", "count": 2, "names": None},
        "vocabulary": ["a", "b", "c"],
    }
    assert InputRecord.read(record, tmp_path / "x.pt").inputs == Counts(vocabulary=("a", "b", "c"))
    del record["vocabulary"]  # without it, the built-in kinds claim it: rows of 3 features
    assert type(InputRecord.read(record, tmp_path / "x.pt").inputs).__name__ == "Rows"


def test_each_built_in_kind_shows_a_sample_as_a_person_reads_it(tmp_path):
    # What the reports show of a sample (#72): a text as its words, an image as its size, a
    # row as its numbers; read from the checkpoints the fixtures hold.
    from data.text.tokenizer import from_record

    fixtures = ROOT / "tests" / "fixtures" / "checkpoints"
    read = {
        name: InputRecord.read(torch.load(fixtures / name / "last.pt")["inputs"], tmp_path)
        for name in ("text_auto", "digits_default", "table_auto")
    }
    tokens = read["text_auto"].inputs
    ids, _ = from_record(tokens.text, "the fixture").encode(["the film was superb and happy"])
    padded = torch.tensor([*ids[0], tokens.pad_id, tokens.pad_id])
    assert tokens.shown(padded).split() == ["the", "film", "was", "superb", "and", "happy"]
    assert read["digits_default"].inputs.shown(torch.zeros(1, 8, 8)).startswith("image 1×8×8: 0")
    assert read["table_auto"].inputs.shown(torch.tensor([1.5, -2.0])) == "1.5 -2"
