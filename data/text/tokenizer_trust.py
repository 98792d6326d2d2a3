"""Is a tokenizer from elsewhere safe to run, and does it tokenize a text the same way each
time? Every tokenizer read from elsewhere (a checkpoint, the cache, a given file) is untrusted
input: its size and vocabulary are bounded, it is parsed as JSON first, a pattern the Rust
regex engine would run (``Regex``: a backtracking engine) is refused, and so is a chain of
normalizers that could make of one character more than :data:`MAX_EXPANSION` (a 3 kB file of
chained replacements, each doubling its input, exhausted the memory in seconds), so a crafted
file cannot hang the run or fill the memory. What the library cannot build, and a padding id
outside the vocabulary, are one line. A given tokenizer's BPE dropout (random merges, which
made two predictions of the same texts differ) is switched off, with a warning; a stored or
cached one holding it is refused.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from utils.errors import UserError

log = logging.getLogger("torchloom")

MAX_JSON_BYTES = 64 * 2**20  # a tokenizer.json read from elsewhere: at most this much
MAX_VOCAB = 1_000_000  # ... and at most this many tokens (pretrained ones hold 30k–260k)
PAD_NAMES = ("[PAD]", "<pad>", "<|pad|>", "<PAD>")  # a given tokenizer's padding token
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


def checked(json_text: str, where: str) -> dict:
    """``json_text`` as a tokenizer's JSON, refused in one line when it is too large, not
    JSON, has too many tokens, holds a ``Regex`` pattern, normalizers that expand their input
    beyond :data:`MAX_EXPANSION`, BPE dropout, a padding id outside its vocabulary, or is
    anything the library cannot build."""
    check_size(len(json_text), where)
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


def check_size(size: int, where: str) -> None:
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


def without_dropout(json_text: str, where: str) -> str:
    """``json_text`` with its BPE dropout switched off, and said: dropout makes tokenizing
    random, so predictions, evaluations, a resume and the exports would change from run to
    run (two predict.py runs on the same 50 texts differed on all 50). Anything that is not a
    tokenizer with dropout is left as it is, for :func:`checked` to judge."""
    check_size(len(json_text), where)
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
