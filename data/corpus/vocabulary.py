"""How a corpus becomes token ids and back (``data.tokenizer``): ``char`` (each distinct
character of the corpus an id, in code-point order, as nanoGPT's character-level data does),
``byte`` (the UTF-8 bytes, 256 ids) or ``bpe`` / a ``tokenizer.json`` path (a Hugging Face
``tokenizers`` tokenizer, fitted on the train split or given; data/text/tokenizer.py, which
checks one read from elsewhere).

The checkpoint stores the vocabulary's record; a resume, evaluate.py and predict.py read it
from there (checked as untrusted data: :func:`from_record`) and never fit one again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from data.text.tokenizer import TextTokenizer, given
from data.text.tokenizer import from_record as text_tokenizer
from data.text.tokenizer_trust import library
from utils.errors import UserError

MAX_CHARS = 65_536  # a character vocabulary larger than this is not a character-level corpus
KINDS = ("char", "byte", "bpe")


@dataclass(frozen=True)
class Vocabulary:
    """Ids of a corpus's tokens. ``kind``: char, byte or bpe (a fitted or given tokenizer);
    ``chars``: a char vocabulary's characters, id by id; ``text``: a BPE's record."""

    kind: str
    chars: str = ""
    text: dict | None = None

    @property
    def size(self) -> int:
        if self.kind == "char":
            return len(self.chars)
        if self.kind == "byte":
            return 256
        return self._bpe.vocab_size

    @property
    def unit(self) -> str | None:
        """What one token is when that makes bits per unit exact: ``character``, ``byte``."""
        return {"char": "character", "byte": "byte"}.get(self.kind)

    @cached_property
    def _bpe(self) -> Any:
        """The BPE tokenizer, checked and built once (its size, each encode and decode)."""
        return text_tokenizer(self.text, "the corpus's tokenizer")

    @cached_property
    def _lookup(self) -> np.ndarray:
        """A char vocabulary's id of each code point up to its largest (-1: none)."""
        lookup = np.full(max(map(ord, self.chars)) + 1, -1, dtype=np.int64)
        lookup[[ord(c) for c in self.chars]] = np.arange(len(self.chars))
        return lookup

    def encode(self, text: str, where: str) -> torch.Tensor:
        """``text``'s ids (int64 [N]); a character the vocabulary lacks is one line naming
        ``where`` it is and the first such character."""
        if self.kind == "byte":
            return torch.from_numpy(
                np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()
            ).long()
        if self.kind == "char":
            missing = sorted(set(text) - set(self.chars))
            if missing:
                shown = ", ".join(repr(c) for c in missing[:5])
                raise UserError(
                    f"{where}: the characters {shown} are not in the model's vocabulary of "
                    f"{len(self.chars)} characters; leave them out (it was trained on others)"
                )
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            return torch.from_numpy(self._lookup[codes])
        lines = text.splitlines(keepends=True)  # each under the tokenizer's cut of 2^16 tokens
        encodings = self._bpe.tokenizer.encode_batch(lines, add_special_tokens=False)
        return torch.tensor([i for e in encodings for i in e.ids], dtype=torch.long)

    def decode(self, ids: Sequence[int]) -> str:
        if self.kind == "char":
            return "".join(self.chars[i] for i in ids)
        if self.kind == "byte":
            return bytes(ids).decode("utf-8", errors="replace")
        return self._bpe.tokenizer.decode(list(ids), skip_special_tokens=False)

    def record(self) -> dict:
        """The checkpoint's part (with a sha256 that a stored record is checked against)."""
        body = {"kind": self.kind, "chars": self.chars, "text": self.text}
        return {**body, "sha256": _digest(body)}


def _digest(body: dict) -> str:
    text = body["text"] or {}
    parts = [body["kind"], body["chars"], str(text.get("sha256", ""))]
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()


def fitted(kind: str, train: str, whole: str, vocab_size: Any, where: str) -> Vocabulary:
    """The vocabulary ``data.tokenizer`` names: ``char`` over the ``whole`` corpus's characters
    (nanoGPT's rule: a val character is never unknown), ``byte``, ``bpe`` fitted on the
    ``train`` text alone (``vocab_size``: a number, or auto), or a given tokenizer.json."""
    if kind == "char":
        chars = "".join(sorted(set(whole)))
        if len(chars) > MAX_CHARS:
            raise UserError(
                f"{where} holds {len(chars):,} distinct characters, more than the {MAX_CHARS:,} "
                "of a character-level corpus; use data.tokenizer=byte or bpe"
            )
        return Vocabulary("char", chars=chars)
    if kind == "byte":
        return Vocabulary("byte")
    if kind == "bpe":
        size = BPE_VOCAB if vocab_size == "auto" else vocab_size
        if not isinstance(size, int) or isinstance(size, bool) or not 257 <= size <= 2**17:
            raise UserError(
                f"data.vocab_size={vocab_size!r} must be auto ({BPE_VOCAB}) or a number "
                "from 257 to 131,072"
            )
        chosen = TextTokenizer(byte_level_bpe(train, size), "trained (byte-level BPE)", 2**16)
    else:
        chosen = given(str(kind), max_length=2**16)
    return Vocabulary("bpe", text=chosen.record())


BPE_VOCAB = 4096  # data.vocab_size=auto for data.tokenizer=bpe


def byte_level_bpe(train: str, size: int) -> str:
    """A byte-level BPE (GPT-2's kind: every byte a token first, so no text is unknown, and
    the text decodes back exactly) of ``size`` tokens fitted on ``train``; its JSON."""
    tk = library()
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=size,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|pad|>"],  # a pad: what records a tokenizer
    )
    lines = train.splitlines(keepends=True)
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tokenizer.to_str()


def from_record(record: Any, where: str) -> Vocabulary:
    """A checkpoint's vocabulary record, checked as untrusted data: its kind, its characters
    (distinct, bounded) and its sha256; a BPE's tokenizer checked as data/text/tokenizer.py
    checks every tokenizer from elsewhere."""
    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        raise UserError(f"{where}: its corpus vocabulary record is damaged (was it edited?)")
    chars, text = record.get("chars"), record.get("text")
    if not isinstance(chars, str) or len(chars) > MAX_CHARS or len(set(chars)) != len(chars):
        raise UserError(f"{where}: its corpus vocabulary's characters are damaged (was it edited?)")
    if record["kind"] == "char" and not chars:
        raise UserError(f"{where}: its character vocabulary is empty (was it edited?)")
    if record["kind"] == "bpe" and not isinstance(text, dict):
        raise UserError(f"{where}: its tokenizer record is missing (was it edited?)")
    body = {
        "kind": record["kind"],
        "chars": chars,
        "text": text if record["kind"] == "bpe" else None,
    }
    if record.get("sha256") != _digest(body):
        raise UserError(
            f"{where}: its corpus vocabulary does not match its sha256 (was it edited?); "
            "use the checkpoint as it was written"
        )
    vocabulary = Vocabulary(body["kind"], chars=chars, text=body["text"])
    if vocabulary.kind == "bpe":
        vocabulary._bpe  # noqa: B018 (checked now, not at the first sample)
    return vocabulary
