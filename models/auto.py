"""``model=auto`` (the default): the built-in model that fits the data's kind, chosen from the
shape of one sample and printed at start-up:

- a table's row ``[F]``: the tabular model (models/tabular/, with its defaults: 8 members
  sharing one hidden layer of 512, fed the inputs as the data standardised them under 1,000
  training rows (``train_rows``), robustly scaled and periodically embedded from there (the
  frequencies from N(0, 3) from 8,000); chosen on 20 real tables and checked on 12 more,
  docs/real-data.md; ``model=tabular`` sets its keys, ``model=mlp`` names the plain MLP);
- a text (token ids ``[L]``, data=text): the fastText-style bag of token and bigram
  embeddings (models/text/ ``text_bag``; ``model=text_transformer`` names the Transformer);
- a sequence ``[C, L]``: the 1-D CNN (models/cnn1d.py: ``channels``, ``kernel_size``,
  ``dropout``);
- an image ``[C, H, W]``: the CNN (models/cnn.py: ``channels``, ``dropout``); an image of
  fewer than 16×16 pixels (the bundled 8×8 digits) is a short row of numbers to an MLP, which
  comes within a point of the CNN there (97.8% against 98.9% test accuracy, 8.2 s against
  13.6 s for the default run on 2 cores).

Each reads the keys it has and leaves the others; any ``model=mlp|cnn|cnn1d|resnet18|...``
names its model instead (and its ``init``).

    python train.py data=imagefolder data.root=photos      # the CNN
    python train.py data=csv data.path=table.csv data.target=label   # the MLP
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from models.cnn import cnn
from models.cnn1d import cnn1d
from models.mlp import mlp
from models.tabular import (
    EMBED_INDICATORS_BEFORE,
    SHARE_BATCHES_BEFORE,
    TABLE_DEFAULTS,
    tabular,
)
from models.text import text_bag
from utils.config.arguments import shown_value
from utils.errors import UserError

log = logging.getLogger("torchloom")
MIN_CONV_PIXELS = 16 * 16  # smaller images train as well and faster on the MLP
# What conf/model/auto.yaml gives the keys the models share (tests/test_tabular.py checks they
# agree), and which of them each model reads: another value of a key the chosen model does not
# read is said at start-up, never dropped without a word.
SHARED_KEYS = {"hidden_sizes": [512], "channels": [32, 64, 128], "kernel_size": 5, "dropout": 0.2}
SHARED_KEYS |= {"table": "tabular", "embed_indicators": "auto", "share_batches": True}
SHARED_KEYS |= {"table_sizes": True, "table_fitted": True}
TABLE_KEYS = ("table", "embed_indicators", "share_batches", "table_sizes", "table_fitted")
READ_BY = {
    "text": (),
    "tabular": TABLE_KEYS,  # and hidden_sizes, dropout with table_sizes
    "table": ("hidden_sizes", "dropout", "table"),  # model.table=mlp: the MLP
    "tiny_image": ("hidden_sizes", "dropout"),
    "sequence": ("channels", "kernel_size", "dropout"),
    "image": ("channels", "dropout"),
}
# What a table's keys are when a stored config does not give them (None here): what the code
# did before the key existed, so a checkpoint of then rebuilds as it trained.
TABLE_KEYS_BEFORE = {"table": "mlp", "embed_indicators": EMBED_INDICATORS_BEFORE}
TABLE_KEYS_BEFORE |= {"share_batches": SHARE_BATCHES_BEFORE, "table_sizes": False}
TABLE_KEYS_BEFORE |= {"table_fitted": False}
# table_fitted=false: the tabular model's inputs at any size, as before the key.
UNFITTED_INPUTS = {"embedding": "periodic", "robust_scaling": True}
KINDS = {
    "text": "texts",
    "table": "table rows",
    "sequence": "sequences",
    "image": "images",
    "tiny_image": "images under 16×16",
}


def auto(
    input_shape: Sequence[int],
    num_classes: int,
    hidden_sizes: Sequence[int],
    channels: Sequence[int],
    kernel_size: int,
    dropout: float,
    table: str | None = None,
    feature_quantiles: torch.Tensor | None = None,
    train_rows: int | None = None,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    embed_indicators: bool | str | None = None,
    indicator_features: int | None = None,
    share_batches: bool | None = None,
    table_sizes: bool | None = None,
    table_fitted: bool | None = None,
) -> nn.Module:
    """The chosen model with the keys it reads (PyTorch's default initialisation). ``table``:
    what a table's rows get, ``tabular`` (conf/model/auto.yaml) or ``mlp``; ``embed_indicators``,
    ``share_batches`` (models/tabular/) and ``table_sizes`` (true: the tabular model takes
    ``hidden_sizes`` and ``dropout``; before the key it trained the defaults whatever they said)
    and ``table_fitted`` (true: its embedding and scaling fitted to the training rows,
    models/tabular/ ``fitted_inputs``; before the key: periodic and robust at any size).
    Not given (None, a config stored before the key): :data:`TABLE_KEYS_BEFORE`, as such a
    checkpoint trained."""
    given = {"table": table, "embed_indicators": embed_indicators, "share_batches": share_batches}
    given |= {"table_sizes": table_sizes, "table_fitted": table_fitted}
    keys = table_keys(given)
    kind = "text" if vocab_size is not None else kind_of(input_shape)
    if kind == "table" and keys["table"] == "tabular":
        sizes = {"hidden_sizes": hidden_sizes, "dropout": dropout} if keys["table_sizes"] else {}
        inputs = {} if keys["table_fitted"] else UNFITTED_INPUTS
        model = tabular(
            input_shape,
            num_classes,
            **{**TABLE_DEFAULTS, **sizes, **inputs},
            embed_indicators=keys["embed_indicators"],
            share_batches=keys["share_batches"],
            feature_quantiles=feature_quantiles,
            train_rows=train_rows,
            indicator_features=indicator_features,
        )
        shown = f"the tabular model ({model.describe()})"
    elif kind == "text":
        model = text_bag(input_shape, num_classes, vocab_size, pad_id)
        shown = "the bag of token and bigram embeddings (text_bag)"
    elif kind in ("table", "tiny_image"):
        model, shown = mlp(input_shape, num_classes, hidden_sizes, dropout, "default"), "the MLP"
    elif kind == "sequence":
        model = cnn1d(input_shape, num_classes, channels, kernel_size, dropout, "default")
        shown = "the 1-D CNN"
    else:
        model, shown = cnn(input_shape, num_classes, channels, dropout, "default"), "the CNN"
    said = "model=auto: %s for %s %s; model=tabular, mlp, cnn, cnn1d or text_transformer names one"
    log.info(said, shown, KINDS[kind], list(input_shape))
    shared = {"hidden_sizes": hidden_sizes, "channels": channels, "kernel_size": kernel_size}
    say_unread({**shared, "dropout": dropout, **given}, read_by(kind, keys), shown)
    return model


def table_keys(given: dict) -> dict:
    """A table's own keys, checked; those not ``given`` (None) are
    :data:`TABLE_KEYS_BEFORE`'s."""
    keys = {key: TABLE_KEYS_BEFORE[key] if value is None else value for key, value in given.items()}
    if keys["table"] not in ("tabular", "mlp"):
        raise UserError(f"model.table={keys['table']!r} must be tabular or mlp")
    for key in ("table_sizes", "table_fitted"):
        if keys[key] not in (True, False):
            raise UserError(f"model.{key}={keys[key]!r} must be true or false")
    return keys


def read_by(kind: str, keys: dict) -> tuple[str, ...]:
    """The shared keys the model chosen for ``kind`` with a table's ``keys`` reads."""
    if kind == "table" and keys["table"] == "tabular":
        return READ_BY["tabular"] + (("hidden_sizes", "dropout") if keys["table_sizes"] else ())
    return READ_BY[kind]


def say_unread(keys: dict, read: Sequence[str], shown: str) -> None:
    """One warning naming the shared ``keys`` given another value than auto.yaml's that the
    chosen model (``shown``) does not ``read`` (a key not given, None, is not said)."""
    unread = [
        f"model.{key}={shown_value(value)}"
        for key, value in keys.items()
        if key not in read
        and value is not None
        and shown_value(value) != shown_value(SHARED_KEYS[key])
    ]
    if unread:
        log.warning(
            "model=auto: %s does nothing here: %s does not read it; name a model that does "
            "(model=mlp, cnn, cnn1d, tabular) or leave it out",
            ", ".join(unread),
            shown.split(" (")[0],
        )


def kind_of(input_shape: Sequence[int]) -> str:
    """What one sample of this shape is: a table's row, a sequence, an image or a tiny one."""
    if len(input_shape) == 1:
        return "table"
    if len(input_shape) == 2:
        return "sequence"
    if len(input_shape) == 3:
        pixels = input_shape[1] * input_shape[2]
        return "image" if pixels >= MIN_CONV_PIXELS else "tiny_image"
    raise UserError(
        f"model=auto chooses for rows [F], sequences [C, L] and images [C, H, W], and the "
        f"data gives samples of shape {list(input_shape)}; name a model (model=...)"
    )
