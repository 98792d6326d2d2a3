"""Start-up guards against classic pitfalls: each triggered by a small, deliberately wrong
model or dataset, silent on the shipped ones, and silenced by name."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import run_train
from torch import nn

from models.cnn import cnn
from models.mlp import mlp
from models.resnet import resnet18
from utils.errors import UserError
from utils.model.guards import run_guards

SHAPE = (1, 8, 8)


def clean_batches():
    return [(torch.randn(4, *SHAPE), torch.zeros(4, dtype=torch.long))]


class ListOfLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Flatten(), nn.Linear(64, 10)]  # not registered: the classic mistake

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class DictOfHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Flatten()
        self.heads = {"digits": nn.Linear(64, 10)}

    def forward(self, x):
        return self.heads["digits"](self.body(x))


class SoftmaxAtTheEnd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Softmax(dim=1))

    def forward(self, x):
        return self.net(x)


def test_layers_in_a_plain_list_are_an_error_naming_the_attribute():
    with pytest.raises(UserError, match=r"plain list 'layers' of ListOfLayers.*nn\.ModuleList"):
        run_guards(ListOfLayers(), SHAPE, 4, clean_batches(), [])


def test_layers_in_a_plain_dict_point_to_module_dict():
    wrapped = nn.Sequential(DictOfHeads())
    with pytest.raises(UserError, match=r"plain dict '0\.heads' of DictOfHeads.*nn\.ModuleDict"):
        run_guards(wrapped, SHAPE, 4, clean_batches(), [])


def test_a_final_softmax_warns_to_return_logits(caplog):
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        run_guards(SoftmaxAtTheEnd(), SHAPE, 4, clean_batches(), [])
    assert "remove the final softmax" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        run_guards(SoftmaxAtTheEnd(), SHAPE, 4, clean_batches(), ["probability_outputs"])
    assert caplog.text == ""


def test_batchnorm_with_a_batch_of_one_is_an_error():
    with pytest.raises(UserError, match="BatchNorm cannot normalise a single sample"):
        run_guards(cnn(SHAPE, 10, [4], 0.0, "default"), SHAPE, 1, clean_batches(), [])
    run_guards(
        cnn(SHAPE, 10, [4], 0.0, "default"), SHAPE, 1, clean_batches(), ["batchnorm_batch_of_one"]
    )


def test_non_finite_inputs_name_the_batch():
    batches = [
        *clean_batches(),
        (torch.full((4, *SHAPE), float("nan")), torch.zeros(4, dtype=torch.long)),
    ]
    with pytest.raises(UserError, match="train split has NaN or Inf inputs in batch 1"):
        run_guards(mlp(SHAPE, 10, [8], 0.0, "default"), SHAPE, 4, batches, [])


@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda: mlp(SHAPE, 10, [8], 0.1, "default"), SHAPE),
        (lambda: cnn(SHAPE, 10, [4, 8], 0.1, "default"), SHAPE),
        (lambda: resnet18((3, 32, 32), 10, True, "default"), (3, 32, 32)),
    ],
    ids=["mlp", "cnn", "resnet18"],
)
def test_shipped_models_pass_every_guard(build, shape, caplog):
    model = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        run_guards(
            model, shape, 8, [(torch.randn(2, *shape), torch.zeros(2, dtype=torch.long))], []
        )
    assert caplog.text == ""
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_guards_run_in_train_py_and_unknown_names_are_refused(tmp_path):
    result = run_train(tmp_path, "data.std=[0.0]", ok=False)
    assert "error: the train split has NaN or Inf inputs" in result.stderr
    unknown = run_train(tmp_path, "trainer.silence_guards=[softmax]", ok=False)
    assert "unknown guard(s) ['softmax']" in unknown.stderr


@pytest.mark.parametrize(
    ("task", "kind", "warns"),
    [
        ("Classification", "classes", True),
        ("MultiLabel", "label_sets", False),
        ("Regression", "values", False),
    ],
)
def test_the_softmax_guard_applies_to_classification_only(caplog, task, kind, warns):
    """Multi-label and regression outputs may be anything, rows summing to 1 included."""
    from types import SimpleNamespace

    from data.batching.targets import Targets
    from utils import tasks
    from utils.model.guards import check_start_up

    batches = type(
        "Batches", (), {"epoch": lambda self, e: iter(clean_batches()), "__len__": lambda self: 4}
    )()
    data = SimpleNamespace(
        input_shape=SHAPE,
        batch_size=4,
        targets=Targets(kind, 10),
        name="probe",
        sizes=lambda: {"train": 16},
        test_split="test",
    )
    trainer = SimpleNamespace(
        silence_guards=[],
        accumulate_grad_batches=1,
        max_steps=None,
        max_epochs=1,
        limit_train_batches=None,
        overfit_batches=0,
        profile_steps=0,
        shapes_only=False,
    )
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        check_start_up(
            SoftmaxAtTheEnd(),
            data,
            batches,
            trainer,
            getattr(tasks, task),
            SimpleNamespace(world_size=1),
        )
    assert ("remove the final softmax" in caplog.text) == warns


def test_a_val_split_too_small_to_judge_by_is_named_at_start_up(tmp_path):
    result = run_train(
        tmp_path,
        "data=synthetic",
        "data.num_samples=200",
        "data.val_size=5",
        "data.test_size=60",
        "trainer.max_epochs=1",
    )
    said = [line for line in (result.stdout + result.stderr).splitlines() if "split holds" in line]
    assert (
        len(said) == 1
        and "the val split holds 5 samples: its figures move in steps of 0.2" in (said[0])
        and "data.val_size" in said[0]
    )
    quiet = run_train(
        tmp_path,
        "data=synthetic",
        "data.num_samples=200",
        "data.val_size=5",
        "data.test_size=60",
        "trainer.max_epochs=1",
        "run_name=quiet",
        "trainer.silence_guards=[small_eval_splits]",
    )
    assert "split holds" not in quiet.stdout + quiet.stderr
