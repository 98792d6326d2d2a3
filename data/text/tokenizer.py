"""How text becomes token ids (``data=text``): a Hugging Face ``tokenizers`` tokenizer, either
trained on the train split alone (BPE, WordPiece or Unigram; ``data.tokenizer=auto``) or read
from a given ``tokenizer.json`` (``data.tokenizer=PATH``, such as one saved with a pretrained
model).

A trained tokenizer is cached by the fingerprint of the train split and its settings, and the
checkpoint stores its JSON (with its sha256): a resume reads it from there and never trains
again — a WordPiece vocabulary is not the same from run to run, so a retrained one would
continue on other token ids. Every tokenizer read from elsewhere (a checkpoint, the cache, a
given file) is untrusted input: its size and vocabulary are bounded, it is parsed as JSON
first, a pattern the Rust regex engine would run (``Regex``: a backtracking engine) is refused,
and so is a chain of normalizers that could make of one character more than
:data:`MAX_EXPANSION` (a 3 kB file of chained replacements, each doubling its input, exhausted
the memory in seconds), so a crafted file cannot hang the run or fill the memory. What the
library cannot build, and a padding id outside the vocabulary, are one line. Tokenizing is a
function of the text: a given tokenizer's BPE dropout (random merges, which made two
predictions of the same texts differ) is switched off, with a warning, and a stored or cached
one holding it is refused.
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

from utils.errors import UserError
from utils.files import write_file

log = logging.getLogger("torchloom")

KINDS = ("bpe", "wordpiece", "unigram")  # data.tokenizer_kind
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")  # [PAD] is id 0 in every tokenizer trained here
PAD_NAMES = ("[PAD]", "<pad>", "<|pad|>", "<PAD>")  # a given tokenizer's padding token
MAX_JSON_BYTES = 64 * 2**20  # a tokenizer.json read from elsewhere: at most this much
MAX_VOCAB = 1_000_000  # ... and at most this many tokens (pretrained ones hold 30k–260k)
AUTO_VOCAB = (1_000, 32_000)  # data.vocab_size=auto: within these bounds
MIN_FREQUENCY = 1  # a merge seen once is kept: small sets then reach the vocabulary asked for
# The most characters a tokenizer's normalizers may make of one, all together: NFKC and
# lower-casing (this module's own) make at most 54; 256 leaves room for any published one.
MAX_EXPANSION = 256
# The most characters each normalizer makes of one: a Unicode normal form at most 18 (U+FDFA
# under NFKC), case mapping 3, byte-level 4 (a UTF-8 character's bytes); BERT's lower-cases,
# decomposes (4) and spaces CJK characters (3). Replace, Prepend, Precompiled and Sequence
# are measured from their settings (:func:`_expansion`); any other type is refused.
EXPANSION = {
    "NFC": 3,
    "NFD": 4,
    "NFKC": 18,
    "NFKD": 18,
    "Lowercase": 3,
    "Strip": 1,
    "StripAccents": 1,
    "Nmt": 1,
    "ByteLevel": 4,
    "BertNormalizer": 36,
}
MAX_PREPEND = 16  # characters a Prepend normalizer adds (SentencePiece's "▁": one)
EXTRA = 'pip install -e ".[text]"'


def library() -> Any:
    """The ``tokenizers`` package, or one line naming the extra."""
    try:
        import tokenizers
    except ImportError:
        raise UserError(f"data=text needs Hugging Face tokenizers: {EXTRA}") from None
    return tokenizers


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


def checked(json_text: str, where: str) -> dict:
    """``json_text`` as a tokenizer's JSON, refused in one line when it is too large, not
    JSON, has too many tokens, holds a ``Regex`` pattern, normalizers that expand their input
    beyond :data:`MAX_EXPANSION`, BPE dropout, a padding id outside its vocabulary, or is
    anything the library cannot build."""
    _check_size(len(json_text), where)
    try:
        parsed = json.loads(json_text)
    except (json.JSONDecodeError, RecursionError):
        raise UserError(f"{where}: the tokenizer is not JSON; give a tokenizer.json") from None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict | list):
        raise UserError(
            f"{where}: not a Hugging Face tokenizer.json (no model.vocab); save one with "
            "tokenizer.save(...)"
        )
    if len(vocab) > MAX_VOCAB:
        raise UserError(
            f"{where}: the tokenizer holds {len(vocab):,} tokens, more than {MAX_VOCAB:,}; "
            "refusing it (was it edited?)"
        )
    pattern = _regex_in(parsed)
    if pattern is not None:
        raise UserError(
            f"{where}: the tokenizer runs a regular expression ({pattern[:40]!r}...), which "
            "can take unbounded time on crafted input; use one without Regex patterns, or "
            "data.tokenizer=auto to train one"
        )
    expansion = _expansion(parsed.get("normalizer"), where)
    if expansion > MAX_EXPANSION:
        raise UserError(
            f"{where}: the tokenizer's normalizers can make more than {MAX_EXPANSION} "
            f"characters of one ({expansion:,.0f} counted), and would fill the memory on crafted input; "
            "use one with fewer expanding normalizers, or data.tokenizer=auto to train one"
        )
    if model.get("dropout"):
        raise UserError(
            f"{where}: the tokenizer applies BPE dropout (model.dropout={model['dropout']!r}), "
            "which tokenizes a text differently each time; torchloom stores none so: was it "
            "edited?"
        )
    try:
        size = library().Tokenizer.from_str(json_text).get_vocab_size()
    except UserError:
        raise
    except Exception as error:  # whatever the library's parser says: its first line
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else "unreadable"
        raise UserError(f"{where}: the tokenizers library cannot read it ({first})") from None
    pad = pad_id_of(parsed, where)
    if not 0 <= pad < size:
        raise UserError(
            f"{where}: the tokenizer's padding id {pad} is outside its {size:,} tokens; give a "
            "tokenizer whose padding token is in its vocabulary"
        )
    return parsed


def _expansion(normalizer: Any, where: str) -> float:
    """The most characters ``normalizer`` (a tokenizer JSON's, or null) makes of one."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type") if isinstance(normalizer, dict) else None
    if kind == "Sequence" and isinstance(normalizer.get("normalizers"), list):
        product = 1.0
        for member in normalizer["normalizers"]:
            product *= _expansion(member, where)
            if product > MAX_EXPANSION:
                break  # a vast chain stops being counted here
        return product
    if kind == "Replace":
        pattern = normalizer.get("pattern")
        found = pattern.get("String") if isinstance(pattern, dict) else None
        content = normalizer.get("content")
        if isinstance(found, str) and found and isinstance(content, str):
            return max(1.0, len(content) / len(found))
    elif kind == "Prepend":
        if isinstance(normalizer.get("prepend"), str) and len(normalizer["prepend"]) <= MAX_PREPEND:
            return 1 + len(normalizer["prepend"])  # a text of one character, at the worst
    elif kind == "Precompiled":
        return _precompiled_expansion(normalizer.get("precompiled_charsmap"), where)
    elif kind in EXPANSION:
        return EXPANSION[kind]
    raise UserError(
        f"{where}: the tokenizer's normalizer {str(kind)[:40]!r} is not one torchloom can "
        "bound (what it makes of a text could be unbounded); give one without it, or "
        "data.tokenizer=auto to train one"
    )


def _precompiled_expansion(charsmap: Any, where: str) -> float:
    """SentencePiece's compiled normalization map (base64: a trie's size as 4 bytes, the
    trie, then the replacement strings, each ended by a zero byte): a character becomes at
    most its longest replacement, in bytes."""
    import base64
    import binascii

    try:
        blob = base64.b64decode(charsmap or "", validate=True)
        trie = int.from_bytes(blob[:4], "little")
        if len(blob) < 4 or 4 + trie > len(blob):
            raise ValueError
    except (binascii.Error, ValueError, TypeError):
        raise UserError(f"{where}: the tokenizer's precompiled normalizer does not read") from None
    return max([1, *(len(part) for part in blob[4 + trie :].split(b"\0"))])


def _check_size(size: int, where: str) -> None:
    if size > MAX_JSON_BYTES:
        raise UserError(
            f"{where}: the tokenizer is {size / 2**20:.0f} MB, more than the "
            f"{MAX_JSON_BYTES // 2**20} MB a tokenizer.json holds; refusing it"
        )


def _regex_in(node: Any, depth: int = 0) -> str | None:
    """The first ``{"Regex": ...}`` pattern anywhere in a tokenizer's JSON."""
    if depth > 64:
        return "(nested too deep)"
    if isinstance(node, dict):
        if "Regex" in node:
            return str(node["Regex"])
        node = list(node.values())
    if isinstance(node, list):
        for item in node:
            found = _regex_in(item, depth + 1)
            if found is not None:
                return found
    return None


def pad_id_of(parsed: dict, where: str) -> int:
    """The id that pads: the tokenizer's padding setting, else a token named like a pad."""
    padding = parsed.get("padding")
    if isinstance(padding, dict) and isinstance(padding.get("pad_id"), int):
        return padding["pad_id"]
    for added in parsed.get("added_tokens") or []:
        named = isinstance(added, dict) and added.get("content") in PAD_NAMES
        if named and isinstance(added.get("id"), int):
            return added["id"]
    vocab = parsed["model"]["vocab"]
    if isinstance(vocab, dict):
        for name in PAD_NAMES:
            if isinstance(vocab.get(name), int):
                return vocab[name]
    raise UserError(
        f"{where}: the tokenizer has no padding token ({', '.join(PAD_NAMES)}); give one "
        "that has, or data.tokenizer=auto to train one"
    )


def given(path: str, max_length: int) -> TextTokenizer:
    """``data.tokenizer=PATH``: a local tokenizer.json (or a folder holding one); its BPE
    dropout, if any, switched off (said once)."""
    file = Path(path)
    file = file / "tokenizer.json" if file.is_dir() else file
    try:
        _check_size(file.stat().st_size, str(file))  # before reading it
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
    json_text = _without_dropout(json_text, str(file))
    checked(json_text, str(file))
    return TextTokenizer(json_text, f"a given file ({file})", max_length)


def _without_dropout(json_text: str, where: str) -> str:
    """``json_text`` with its BPE dropout switched off, and said: dropout makes tokenizing
    random, so predictions, evaluations, a resume and the exports would change from run to
    run (two predict.py runs on the same 50 texts differed on all 50). Anything that is not a
    tokenizer with dropout is left as it is, for :func:`checked` to judge."""
    _check_size(len(json_text), where)
    try:
        parsed = json.loads(json_text)
    except (json.JSONDecodeError, RecursionError):
        return json_text
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(model, dict) or not model.get("dropout"):
        return json_text
    log.warning(
        "warning: %s applies BPE dropout (%r): switched off, so that a text is tokenized the "
        "same way every time (training, evaluation, prediction and exports alike)",
        where,
        model["dropout"],
    )
    model["dropout"] = None
    return json.dumps(parsed, ensure_ascii=False)


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
