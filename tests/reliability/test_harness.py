"""The harness's judge of an ending (``held``) fails a defect in resuming that comes back at the
same fault points, and passes one that does not come back only on a second try, saying so."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import run_train
from harness import held

from utils.checkpoint.load import load_checkpoint


@pytest.fixture(scope="module")
def endings(tmp_path_factory):
    """A real last.pt, and a copy with one weight one float32 step away."""
    cwd = tmp_path_factory.mktemp("endings")
    run_train(cwd, "run_name=r", "trainer.max_epochs=1", "model.hidden_sizes=[8]")
    last = cwd / "checkpoints" / "r" / "last.pt"
    checkpoint = load_checkpoint(last)
    weight = next(iter(checkpoint["model"].values()))
    first = weight.view(-1)[:1]
    first.copy_(torch.nextafter(first, torch.full_like(first, math.inf)))
    off = cwd / "off.pt"
    torch.save(checkpoint, off)
    return last, off


def test_an_unequal_ending_that_comes_back_fails(endings):
    last, off = endings
    ending = held(off, lambda: off, last)
    assert not ending
    assert "1 of" in repr(ending) and "(first try: " in repr(ending)


def test_an_unequal_ending_that_does_not_come_back_holds_and_says_it_was_tried_again(endings):
    last, off = endings
    ending = held(off, lambda: last, last)
    assert ending and ending.first is not None and not ending.first


def test_an_equal_ending_is_not_tried_again(endings):
    last, _ = endings

    def again():
        raise AssertionError("tried again")

    ending = held(last, again, last)
    assert ending and ending.first is None
