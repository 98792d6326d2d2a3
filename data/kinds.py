"""Every kind of input, registered once: what a checkpoint's inputs record is read back as.

A kind is a class in its family's ``inputs.py`` answering data/batching/inputs.py's questions;
a builder hands its ``Data`` one, and a stored record is claimed by the first kind here whose
``claims`` takes it (a corpus's vocabulary: a stream; a tokenizer: tokens; a table or rows of
features: rows; a shape [C, H, W]: pixels; anything else: values). Adding a kind of input adds
one line here.
"""

from __future__ import annotations

from pathlib import Path

from data.arrays.inputs import Values
from data.batching.inputs import Inputs
from data.corpus.inputs import Stream
from data.images.inputs import Pixels
from data.tables.inputs import Rows
from data.text.inputs import Tokens

KINDS = (Stream, Tokens, Rows, Pixels, Values)  # the order a stored record is claimed in


def stored_inputs(record: dict, path: Path) -> Inputs:
    """The kind of input a checkpoint's checked inputs ``record`` (from the file ``path``)
    says its model takes; the kind checks its own part of the record as untrusted data."""
    for kind in KINDS:
        claimed = kind.claims(record, path)
        if claimed is not None:
            return claimed
    raise AssertionError("Values claims every record")  # unreachable: the last claims all
