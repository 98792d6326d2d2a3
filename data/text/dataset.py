"""Texts with a target (``data=text``): reviews, tickets, messages, short documents.

    python train.py data=text data.path=reviews.csv data.text=review data.target=stars
    python train.py data=text data.path=aclImdb/train data.split.test_path=aclImdb/test
    python train.py data=text data.path=t.jsonl data.text=[title,body] data.target=tags task=multilabel
    python train.py data=text data.path=r.csv data.text=review data.target=score task=regression

``path``: a CSV/TSV/JSON-lines file (``text`` names the text column, or a list joined with a
separator token; ``target`` the task's target column as data=csv reads it), or a folder with
one sub-folder of ``.txt`` files per class. The tokenizer (data/text/tokenizer.py) is trained on the
train split alone, or read from ``data.tokenizer=PATH``; a resumed run takes the one its
checkpoint stored. Each split is held in memory as token ids [N, L] (L: its longest text, at
most ``data.max_length`` tokens), padded with the tokenizer's pad id; the training batches are
drawn by length (data/batching/order.py) and cut to their longest text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from data.batching.dataset import Batching, Data, Splits, can
from data.batching.folds import FoldIds, FoldPlan, tensor_splits
from data.batching.splits import TensorSplit
from data.batching.targets import Targets, reads_targets
from data.tables.target_columns import TargetColumns
from data.text import tokenizer as tokenizers
from data.text.files import read_rows, texts_of
from data.text.inputs import Tokens
from utils.config.arguments import POSITIVE_INT, check_values
from utils.errors import UserError

log = logging.getLogger("torchloom")


@can("folds")
@reads_targets("label_sets", "values")
def load_text(
    path: str,
    text: str | Sequence[str],
    target: str | Sequence[str],
    split: Mapping[str, Any],
    tokenizer: str,
    tokenizer_kind: str,
    vocab_size: int | str,
    max_length: int,
    tokenizer_cache: str | None = None,
    stored_text: Mapping | None = None,
    **options,
) -> Data:
    """conf/data/text.yaml. ``stored_text``: the text record of the checkpoint a run resumes
    (its tokenizer is used, never trained again); ``options``: the keys of
    :class:`data.batching.dataset.Batching` but ``mean`` and ``std``, and ``targets``, the kind
    of target the task learns."""
    kind = options.pop("targets", "classes")
    _refuse_mixing(options.get("augment") or {})
    check_values("data", {"max_length": max_length}, {"max_length": POSITIVE_INT})
    source = Path(path)
    header, rows, where = read_rows(source)
    target = target if isinstance(target, str) else list(target)
    targets_read = TargetColumns.fitted(header, rows, target, kind, source)
    texts = texts_of(header, rows, text, source)
    samples = TensorSplit(
        torch.arange(len(rows)).unsqueeze(1), targets_read.read(header, rows, source)
    )
    given, offset = {}, len(texts)
    for name in ("val", "test"):  # data.split.val_path, test_path: read alike
        if split.get(f"{name}_path"):
            other = Path(split[f"{name}_path"])
            other_header, other_rows, _ = read_rows(other)
            more = texts_of(other_header, other_rows, text, other)
            labels = targets_read.read(other_header, other_rows, other)
            given[name] = TensorSplit(torch.arange(offset, offset + len(more)).unsqueeze(1), labels)
            texts, offset = texts + more, offset + len(more)
    plan = FoldPlan.of(split, targets_read.are_classes, split["seed"])
    train, val, test, val_rows = tensor_splits(samples, given, split, plan)
    train_texts = [texts[i] for i in train.inputs[:, 0].tolist()]
    asked = {"tokenizer": tokenizer, "kind": tokenizer_kind, "vocab_size": vocab_size}
    chosen = _tokenizer({**asked, "cache": tokenizer_cache}, max_length, stored_text, train_texts)
    encoded = [
        _encoded(part, texts, chosen, n)
        for part, n in ((train, "train"), (val, "val"), (test, "test"))
    ]
    names = targets_read.names
    targets = Targets(kind, len(names), tuple(names))
    batching = Batching(mean=[0.0], std=[1.0], **options)
    columns = [text] if isinstance(text, str) else list(text)
    inputs = Tokens(text={**chosen.record(), "columns": columns}, pad_id=chosen.pad_id)
    data = Data(
        f"text {source.name}", Splits(*encoded), targets.count, batching, targets, inputs=inputs
    )
    data.input_shape = (max_length,)  # a text's ids: at most this many (each split is cut shorter)
    data.mean, data.std = [0.0] * max_length, [1.0] * max_length  # ids are never normalised
    if plan.folds is not None:  # cv=K's oof.csv names each val row by where it is
        data.fold_ids = FoldIds(plan.fold, [where[i] for i in val_rows.tolist()])
    return data


def _refuse_mixing(augment: Mapping) -> None:
    """MixUp and CutMix blend inputs: blended token ids would be other tokens, not a blend."""
    mixing = {k: v for k, v in augment.items() if k.endswith("_alpha") and v}
    if mixing:
        name = next(iter(mixing))
        raise UserError(
            f"data.augment.{name}={mixing[name]}: MixUp and CutMix blend images or numbers, "
            "not texts; set it to 0"
        )


def _tokenizer(
    asked: Mapping, max_length: int, stored: Mapping | None, train_texts: list[str]
) -> tokenizers.TextTokenizer:
    """The checkpoint's (a resume), a given file's, the cache's or a newly trained one
    (``asked``: data.tokenizer, tokenizer_kind, vocab_size and tokenizer_cache); said on one
    line that begins ``tokenizer: trained`` or ``tokenizer: from``."""
    if stored is not None:  # Hydra hands a dict argument over as a DictConfig
        plain = OmegaConf.to_container(stored) if isinstance(stored, DictConfig) else stored
        chosen = tokenizers.from_record(plain, "the resumed checkpoint")
        if chosen.max_length != max_length:
            raise UserError(
                f"data.max_length={max_length}, and the checkpoint was trained at "
                f"{chosen.max_length}; resume with data.max_length={chosen.max_length}"
            )
    elif asked["tokenizer"] != "auto":
        chosen = tokenizers.given(asked["tokenizer"], max_length)
    else:
        folder = Path(asked["cache"]) if asked["cache"] else tokenizers.default_cache()
        kind, size = asked["kind"], asked["vocab_size"]
        chosen = tokenizers.trained(train_texts, kind, size, max_length, folder)
    tokenizers.library()  # a stored or cached one needs the package too
    verb = "tokenizer: trained" if chosen.source.startswith("trained") else "tokenizer: from"
    source = chosen.source.removeprefix("trained ")
    log.info(
        "%s %s: %s tokens, texts cut at %d tokens (data.max_length)",
        verb,
        source,
        f"{chosen.vocab_size:,}",
        max_length,
    )
    return chosen


def _encoded(
    part: TensorSplit | None, texts: list[str], chosen: Any, name: str
) -> TensorSplit | None:
    """A split's texts as token ids [N, L] (:func:`_ids`)."""
    if part is None:
        return None
    return TensorSplit(
        tokenizers.token_ids([texts[i] for i in part.inputs[:, 0].tolist()], chosen, name),
        part.labels,
    )
