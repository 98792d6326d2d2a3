"""How text becomes token ids (``data=text``): a Hugging Face ``tokenizers`` tokenizer, either
trained on the train split alone (BPE, WordPiece or Unigram; ``data.tokenizer=auto``) or read
from a given ``tokenizer.json`` (``data.tokenizer=PATH``, such as one saved with a pretrained
model).

A trained tokenizer is cached by the fingerprint of the train split and its settings, and the
checkpoint stores its JSON (with its sha256): a resume reads it from there and never trains
again — a WordPiece vocabulary is not the same from run to run, so a retrained one would
continue on other token ids. Every tokenizer read from elsewhere (a checkpoint, the cache, a
given file) is untrusted input, checked first (data/text/tokenizer_trust.py): bounded in size,
vocabulary and what its normalizers make of a text, with no backtracking pattern and no BPE
dropout, so it cannot hang the run, fill the memory, or tokenize a text two ways.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from data.text.tokenizer_trust import (
    MAX_VOCAB,
    check_size,
    checked,
    library,
    pad_id_of,
    without_dropout,
)
from utils.errors import UserError
from utils.files import write_file

log = logging.getLogger("torchloom")

KINDS = ("bpe", "wordpiece", "unigram")  # data.tokenizer_kind
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")  # [PAD] is id 0 in every tokenizer trained here
AUTO_VOCAB = (1_000, 32_000)  # data.vocab_size=auto: within these bounds
MIN_FREQUENCY = 1  # a merge seen once is kept: small sets then reach the vocabulary asked for


@dataclass(frozen=True)
class TextTokenizer:
    """A tokenizer and what the run records of it: its JSON text, where it came from, the id
    that pads, and ``max_length`` (tokens a text is cut to, special tokens included)."""

    json_text: str
    source: str  # trained | the checkpoint | a given file | the cache
    max_length: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json_text.encode()).hexdigest()

    @cached_property
    def tokenizer(self) -> Any:
        """Built once from the JSON (every split, the size and the record use this one)."""
        tokenizer = library().Tokenizer.from_str(self.json_text)
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.max_length)
        return tokenizer

    @cached_property
    def pad_id(self) -> int:
        return pad_id_of(json.loads(self.json_text), self.source)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def record(self) -> dict:
        """What a checkpoint stores (utils/checkpoint/record.py), so predict.py, the exports and
        a resume tokenize exactly as training did."""
        return {
            "tokenizer": self.json_text,
            "sha256": self.sha256,
            "max_length": self.max_length,
            "pad_id": self.pad_id,
        }

    def encode(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Each text's token ids (special tokens as the tokenizer's post-processor adds them),
        cut to ``max_length``; and how many texts were cut."""
        encodings = self.tokenizer.encode_batch(list(texts))
        return [e.ids for e in encodings], sum(bool(e.overflowing) for e in encodings)


def from_record(record: Any, where: str) -> TextTokenizer:
    """The tokenizer a checkpoint stored (untrusted: checked as a given file is, and against
    its sha256)."""
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("tokenizer"), str)
        and isinstance(record.get("max_length"), int)
        and 1 <= record["max_length"] <= 2**16
        and isinstance(record.get("sha256"), str)
        and (
            record.get("columns") is None
            or (
                isinstance(record["columns"], list)
                and all(isinstance(c, str) for c in record["columns"])
            )
        )
    )
    if not ok:
        raise UserError(f"{where}: its text record is not what torchloom writes (was it edited?)")
    checked(record["tokenizer"], where)
    stored = TextTokenizer(record["tokenizer"], "the checkpoint", record["max_length"])
    if stored.sha256 != record["sha256"]:
        raise UserError(f"{where}: its tokenizer does not match its sha256 (was it edited?)")
    if record.get("pad_id", stored.pad_id) != stored.pad_id:  # derived: never taken on trust
        raise UserError(
            f"{where}: its text record's pad_id={record['pad_id']!r} is not its tokenizer's "
            f"({stored.pad_id}); was it edited?"
        )
    return stored


def given(path: str, max_length: int) -> TextTokenizer:
    """``data.tokenizer=PATH``: a local tokenizer.json (or a folder holding one); its BPE
    dropout, if any, switched off (said once)."""
    file = Path(path)
    file = file / "tokenizer.json" if file.is_dir() else file
    try:
        check_size(file.stat().st_size, str(file))  # before reading it
        json_text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        why = getattr(error, "strerror", None) or "not UTF-8 text"
        hint = ""
        if Path(path).is_dir() and not file.exists():  # a model folder of vocab.txt and the like
            hint = (
                "; write one with transformers (AutoTokenizer.from_pretrained(folder)"
                ".save_pretrained(folder)) where it can be read"
            )
        raise UserError(f"data.tokenizer={path}: cannot read {file}: {why}{hint}") from None
    json_text = without_dropout(json_text, str(file))
    checked(json_text, str(file))
    return TextTokenizer(json_text, f"a given file ({file})", max_length)


def auto_vocab_size(texts: Sequence[str]) -> int:
    """``data.vocab_size=auto``: about the number of distinct words the train split holds, within
    :data:`AUTO_VOCAB`, rounded to a thousand: subwords then keep most words whole, which a
    bag of embeddings needs on small sets (the 2016 debates' statements: 0.6973 test accuracy
    at 5,000 tokens against 0.6884 at the 3,164 that merges seen twice allowed;
    benchmarks/text_figures.py)."""
    words = {word for text in texts for word in text.lower().split()}
    low, high = AUTO_VOCAB
    return int(min(high, max(low, round(len(words) / 1000) * 1000)))


def trained(
    texts: Sequence[str], kind: str, vocab_size: int | str, max_length: int, cache: Path | None
) -> TextTokenizer:
    """A tokenizer fitted to ``texts`` (the train split alone), or the one the cache holds for
    the same texts and settings."""
    if kind not in KINDS:
        raise UserError(f"data.tokenizer_kind={kind!r} must be one of {', '.join(KINDS)}")
    size = auto_vocab_size(texts) if vocab_size == "auto" else vocab_size
    if not isinstance(size, int) or isinstance(size, bool) or not 100 <= size <= MAX_VOCAB:
        raise UserError(
            f"data.vocab_size={vocab_size!r} must be auto or a number from 100 to {MAX_VOCAB:,}"
        )
    key = _fingerprint(texts, kind, size)
    file = cache / f"{key}.json" if cache is not None else None
    if file is not None and file.is_file():
        try:
            json_text = file.read_text(encoding="utf-8")
            checked(json_text, str(file))
            return TextTokenizer(json_text, f"the cache ({file})", max_length)
        except (OSError, UnicodeDecodeError, UserError) as error:
            log.warning(
                "warning: the cached tokenizer %s is unreadable (%s); training again", file, error
            )
    tokenizer = _train(library(), texts, kind, size)
    json_text = tokenizer.to_str()
    if file is not None:
        try:
            write_file(file, json_text.encode(), "the run goes on; the next trains it again")
        except UserError as error:
            log.warning("warning: the tokenizer is not cached: %s", error)
    return TextTokenizer(json_text, f"trained ({kind})", max_length)


def _train(tk: Any, texts: Sequence[str], kind: str, size: int) -> Any:
    """Lower-cased, accents kept, words split at spaces and punctuation; [CLS] text [SEP]."""
    unk = "[UNK]"
    if kind == "bpe":
        model = tk.models.BPE(unk_token=unk)
        trainer = tk.trainers.BpeTrainer(
            vocab_size=size, min_frequency=MIN_FREQUENCY, special_tokens=list(SPECIAL)
        )
    elif kind == "wordpiece":
        model = tk.models.WordPiece(unk_token=unk)
        trainer = tk.trainers.WordPieceTrainer(
            vocab_size=size, min_frequency=MIN_FREQUENCY, special_tokens=list(SPECIAL)
        )
    else:
        model = tk.models.Unigram()
        trainer = tk.trainers.UnigramTrainer(
            vocab_size=size, special_tokens=list(SPECIAL), unk_token=unk
        )
    tokenizer = tk.Tokenizer(model)
    tokenizer.normalizer = tk.normalizers.Sequence(
        [tk.normalizers.NFKC(), tk.normalizers.Lowercase()]
    )
    tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = tk.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    return tokenizer


def _fingerprint(texts: Sequence[str], kind: str, size: int) -> str:
    settings = f"{kind}:{size}:{MIN_FREQUENCY}:{SPECIAL}:{library().__version__}"
    digest = hashlib.sha256(settings.encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def default_cache() -> Path:
    """Where trained tokenizers are kept: ``$XDG_CACHE_HOME/torchloom/tokenizers``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchloom" / "tokenizers"


def token_ids(texts: list[str], chosen: Any, name: str) -> torch.Tensor:
    """``texts`` as token ids [N, L], padded on the right to the longest; how many were cut
    at data.max_length is said."""
    ids, cut = chosen.encode(texts)
    if cut:
        log.info(
            "text %s split: %d of %d texts are longer than data.max_length=%d tokens and were cut",
            name,
            cut,
            len(ids),
            chosen.max_length,
        )
    rows = [torch.tensor(seq or [chosen.pad_id], dtype=torch.long) for seq in ids]
    return pad_sequence(rows, batch_first=True, padding_value=chosen.pad_id)
