"""Bad input through ``train.py``: one clear line naming the problem, a non-zero exit, no
traceback, and nothing already saved is lost."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import run_train

from utils.errors import UserError, print_error
from utils.evaluation.metrics import ClassScores, evaluate
from utils.model.checks import check_forward
from utils.precision import Precision


def error_line(result) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return "\n".join(lines)


def test_missing_imagefolder_split_names_the_path(tmp_path):
    (tmp_path / "images" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "train" / "cat" / "0.png").write_bytes(b"")
    result = run_train(tmp_path, "data=imagefolder", "data.root=images", ok=False)
    assert "image folder split not found: images/val" in error_line(result)


def test_a_failed_run_leaves_earlier_checkpoints_untouched(tmp_path):
    run_train(tmp_path, "run_name=keep", "trainer.max_epochs=1")
    saved = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / "keep").iterdir()}
    result = run_train(tmp_path, "run_name=keep", "data.path=missing.csv.gz", ok=False)
    assert "already holds a run" in error_line(result)  # a new run never replaces it silently
    result = run_train(
        tmp_path, "run_name=keep", "data.path=missing.csv.gz", "overwrite=true", ok=False
    )
    assert "cannot read digits file missing.csv.gz" in error_line(result)
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / "keep").iterdir()} == saved


def test_a_shape_the_model_cannot_take_names_the_layer():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(10, 4))
    with pytest.raises(
        UserError, match=r"inputs of shape \[1, 8, 8\]: layer '1' \(Linear\) failed"
    ):
        check_forward(model, torch.zeros(2, 1, 8, 8), 4)


def test_evaluation_and_the_start_up_check_leave_batchnorm_untouched():
    from models.cnn import cnn

    model = cnn((1, 8, 8), 10, [4, 8], 0.0, "default")
    model.train()
    model(torch.randn(16, 1, 8, 8))  # some running statistics to protect
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check_forward(model, torch.zeros(2, 1, 8, 8), 10)
    batches = [(torch.randn(8, 1, 8, 8) * 5 + 3, torch.randint(0, 10, (8,))) for _ in range(3)]
    metrics = evaluate(model, batches, Precision("float32", torch.device("cpu")), ClassScores(10))
    assert set(metrics) == {"loss", "acc", "acc_top5"}
    assert model.training  # mode restored
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_evaluation_counts_every_sample_once():
    class Constant(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.long), 10).float()

    labels = torch.tensor([0, 0, 1, 0, 2, 0, 0])  # 5 of 7 are class 0
    batches = [(torch.zeros(4, 1), labels[:4]), (torch.zeros(3, 1), labels[4:])]
    metrics = evaluate(
        Constant(), batches, Precision("float32", torch.device("cpu")), ClassScores(10)
    )
    assert metrics["acc"] == pytest.approx(5 / 7)


def test_an_error_line_is_written_whole_so_torchrun_ranks_never_interleave(monkeypatch):
    # Two ranks share one stderr; print() writes the newline apart, and an unbuffered stderr
    # (PYTHONUNBUFFERED) sends each write alone, so two ranks' lines could run together.
    class Stream:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    stream = Stream()
    monkeypatch.setattr(sys, "stderr", stream)
    print_error("cannot decode image a.png; remove or replace it")
    assert stream.writes == ["error: cannot decode image a.png; remove or replace it\n"]


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "+trainer.max_epoch=3",
            "nothing reads trainer.max_epoch; did you mean trainer.max_epochs?",
        ),
        (
            "++trainer.ema.decai=0.9",
            "nothing reads trainer.ema.decai; did you mean trainer.ema.decay?",
        ),
        (
            "+data.augment.crop_pad=2",
            "nothing reads data.augment.crop_pad; did you mean data.augment.crop_padding?",
        ),
        ("+data.split.fols=3", "nothing reads data.split.fols; did you mean data.split.folds?"),
        ("+sead=3", "nothing reads sead; did you mean seed?"),
        # a new top-level section nothing reads was accepted silently
        ("+foo.bar=1", "nothing reads foo.bar; correct or remove it"),
        ("+traner.limit=3", "nothing reads traner.limit; did you mean trainer.limit?"),
        (
            "+trainr.max_epochs=3",
            "nothing reads trainr.max_epochs; torchloom's is trainer.max_epochs",
        ),
    ],
)
def test_an_added_key_nothing_reads_is_refused(tmp_path, override, message):
    # Hydra's own message for a typo says to add `+`; the typo must not then be ignored.
    result = run_train(tmp_path, "trainer.max_epochs=1", override, ok=False)
    assert result.returncode == 2 and message in error_line(result)
    assert not (tmp_path / "checkpoints").exists() or not any(
        (tmp_path / "checkpoints").rglob("*.pt")
    )


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "trainer.fast_dev_run=true",
            "unknown key trainer.fast_dev_run; torchloom's is debug=fast_dev_run",
        ),
        (
            "+trainer.fast_dev_run=1",
            "nothing reads trainer.fast_dev_run; torchloom's is debug=fast_dev_run",
        ),
        ("seed_everything=1", "unknown key seed_everything; torchloom's is seed"),
        ("max_epochs=3", "unknown key max_epochs; torchloom's is trainer.max_epochs"),
        (
            "--lr=0.1",
            "--lr=0.1: torchloom takes key=value overrides, not --flags; torchloom's is optim.lr=0.1",
        ),
        (
            "--batch-size",
            "--batch-size: torchloom takes key=value overrides, not --flags; torchloom's is data.batch_size=64",
        ),
        (
            "trainer.max_epoch=3",
            "unknown key trainer.max_epoch; did you mean trainer.max_epochs? conf/",
        ),
    ],
)
def test_lightning_and_timm_names_are_answered_with_ours(tmp_path, override, message):
    """A name from Lightning or timm got a misleading hint (fast_dev_run → trainer.swa.start)
    or none, and each offered +key, a key nothing reads."""
    extra = ["64"] if override == "--batch-size" else []
    line = error_line(run_train(tmp_path, override, *extra, ok=False))
    assert message in line and "+" not in line.replace(override, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no empty runs/ left either


@pytest.mark.parametrize("override", ["model=[8]", "logger=[1]", "data=[1.5,2]"])
def test_a_group_given_numbers_is_one_line(tmp_path, override):
    result = run_train(tmp_path, override, ok=False)
    assert result.returncode == 1
    assert (
        f"option is a name or a list of names (model=mlp, logger=[tensorboard,csv]), not a number ({override})"
        in error_line(result)
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.swa.start=5", "trainer.swa.start=5 must be a whole number of epochs from 0 to 1"),
        ("distill.alpha=1.5", "distill.alpha=1.5 must be from 0 to 1"),
        ("distill.temperature=0", "distill.temperature=0.0 must be greater than 0"),
    ],
)
def test_a_value_the_config_alone_can_judge_is_refused_before_any_data_is_read(
    tmp_path, override, message
):
    # The data file does not exist: the refusal names the value, so nothing was read first.
    result = run_train(
        tmp_path,
        "data=csv",
        "data.path=missing.csv",
        "data.target=y",
        "trainer.max_epochs=2",
        override,
        ok=False,
    )
    assert result.returncode == 2 and message in error_line(result)
