"""A corpus to train a language model on (``data=corpus``): one stream of token ids.

    python train.py task=causal_lm model=gpt data=corpus                    # tiny Shakespeare
    python train.py task=causal_lm model=gpt data=corpus data.path=notes/ data.tokenizer=byte
    python train.py task=causal_lm model=gpt data=corpus data.path=t.jsonl data.text=body

``path``: a text file (``.txt``, or ``.gz`` of one), a folder of ``.txt`` files (in name
order), a CSV/TSV/JSON-lines file whose ``data.text`` column holds the texts, or Parquet shards
(data/corpus/parquet.py: a text column, or ``data.tokens``, a column of token ids); files and
rows are joined with one newline between them. None: the bundled tiny Shakespeare
(data/assets/README.md). Read strictly (UTF-8, no NUL byte: data/text/files.py), tokenized once
by the vocabulary (data/corpus/vocabulary.py) into a memory-mapped cache of ids that later runs
read instead (data/corpus/cache.py), and split as nanoGPT splits: the last
``split.val_share`` of the tokens for validation, unless ``split.val_path`` gives a file of
its own. The run is tested on the val split (there is no third).
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from data.batching.dataset import Batching, Data, Splits
from data.batching.targets import Targets, reads_targets
from data.corpus.cache import Tokenized, token_cache
from data.corpus.inputs import Stream
from data.corpus.parquet import VOCABULARY, is_parquet, parquet_ids, parquet_texts, written_by_shard
from data.corpus.stream import TokenStream
from data.corpus.vocabulary import Vocabulary, fitted, from_record
from data.text.files import MAX_FILE_BYTES, decoded, read_rows, texts_of, utf8_text
from utils.config.arguments import POSITIVE_INT, check_values
from utils.errors import UserError

log = logging.getLogger("torchloom")

BUNDLED = Path(__file__).resolve().parents[1] / "assets" / "tinyshakespeare.txt.gz"
TEXT_FILES = {".txt", ".text", ".md"}


@reads_targets("next_tokens", classes=False)
def load_corpus(
    path: str | None,
    text: str,
    tokenizer: str,
    vocab_size: int | str,
    block_size: int,
    split: Mapping[str, Any],
    tokens: str | None = None,
    cache: str = "auto",
    cache_dir: str | None = None,
    round_steps: int | None = None,
    accumulate: int = 1,
    windows: str = "random",
    stored_vocabulary: Mapping | None = None,
    **options,
) -> Data:
    """conf/data/corpus.yaml. ``block_size``: the tokens a window holds (the model's context);
    ``tokens``: Parquet shards' column of token ids (instead of texts); ``cache``,
    ``cache_dir``: where the ids are kept (data/corpus/cache.py); ``round_steps``:
    trainer.val_every_n_steps (a round of that many optimizer steps is the loop's epoch;
    None: a pass over the stream); ``windows``: how training windows are drawn, ``random`` or
    ``passes`` (data/corpus/stream.py); ``stored_vocabulary``: the checkpoint's, on a resume (never
    fitted again); ``options``: the keys of :class:`Batching` but mean and std."""
    options.pop("targets", None)
    check_values("data", {"block_size": block_size}, {"block_size": POSITIVE_INT})
    source = str(path) if path else str(BUNDLED)
    asked = (tokenizer, vocab_size, stored_vocabulary)
    tokenize = partial(tokenized, source, (text, tokens), asked, split)
    described = {"text": text, "tokens": tokens, "tokenizer": tokenizer, "vocab_size": vocab_size}
    described |= {"split": dict(split), "stored": _stored_sha256(stored_vocabulary)}
    held = token_cache(cache, cache_dir, path and str(path), described)
    vocabulary, train, val, val_source = held.held(tokenize) if held else tokenize()
    for name, ids, where in (("train", train, source), ("val", val, val_source)):
        if len(ids) < block_size + 1:
            raise UserError(
                f"the {name} split of {where} holds {len(ids):,} tokens, fewer than one window "
                f"of data.block_size + 1 = {block_size + 1}; lower data.block_size or give "
                "more text"
            )
    rounds = (round_steps or 0) * accumulate
    streams = Splits(TokenStream(train, block_size, rounds, windows), TokenStream(val, block_size))
    name = source.rstrip("/").rsplit("/", 1)[-1]
    log.info(
        "corpus %s: %s train and %s val tokens, %s of them (data.tokenizer=%s), windows of %d",
        name,
        f"{len(train):,}",
        f"{len(val):,}",
        f"{vocabulary.size:,}",
        vocabulary.kind if vocabulary.kind != "bpe" else tokenizer,
        block_size,
    )
    batching = Batching(mean=[0.0], std=[1.0], **options)
    targets = Targets("next_tokens", vocabulary.size)
    inputs = Stream(vocabulary=vocabulary)
    data = Data(f"corpus {name}", streams, vocabulary.size, batching, targets, inputs=inputs)
    data.mean, data.std = [0.0] * block_size, [1.0] * block_size  # ids are never normalised
    return data


def tokenized(source: str, columns: tuple, asked: tuple, split: Mapping[str, Any]) -> Tokenized:
    """The corpus at ``source`` split and tokenized: ``columns`` (data.text, data.tokens: ids
    a tokenizer made already, split by ids), ``asked`` as :func:`_vocabulary` takes it."""
    text, tokens = columns
    if tokens:
        written = written_by_shard(source) if is_parquet(source) else None
        vocabulary = _vocabulary(asked, "", "", source, ids=written or True)
        if written and not split.get("val_path"):  # shard.py's splits, as it wrote them
            train = parquet_ids(written[1], tokens, vocabulary.size)
            val = parquet_ids(written[2], tokens, vocabulary.size)
            return vocabulary, torch.from_numpy(train), torch.from_numpy(val), written[2]
        return (vocabulary, *split_ids(source, tokens, split, vocabulary.size))
    train_text, val_text, val_source = split_text(source, text, split)
    vocabulary = _vocabulary(asked, train_text, val_text, source)
    train = vocabulary.encode(train_text, f"{source} (train)")
    return vocabulary, train, vocabulary.encode(val_text, f"{val_source} (val)"), val_source


def split_text(source: str, column: str, split: Mapping[str, Any]) -> tuple[str, str, str]:
    """(train text, val text, where val came from): the last ``split.val_share`` of the
    characters (nanoGPT's split: by characters, then tokenized), or ``split.val_path``'s."""
    whole = corpus_text(source, column)
    share = _val_share(split)
    if split.get("val_path"):
        val_source = str(split["val_path"])
        return whole, corpus_text(val_source, column), val_source
    cut = int(len(whole) * (1 - share))
    return whole[:cut], whole[cut:], source


def split_ids(
    source: str, column: str, split: Mapping[str, Any], vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(train ids, val ids, where val came from) of shards' ``column`` of token ids: the last
    ``split.val_share`` of the ids, or ``split.val_path``'s shards."""
    if not is_parquet(source):
        raise UserError(
            f"data.tokens={column} reads token ids from Parquet shards, and data.path={source} "
            "is no Parquet; give shards, or leave data.tokens out to read texts"
        )
    whole = torch.from_numpy(parquet_ids(source, column, vocab_size))
    share = _val_share(split)
    if split.get("val_path"):
        val_source = str(split["val_path"])
        return whole, torch.from_numpy(parquet_ids(val_source, column, vocab_size)), val_source
    cut = int(len(whole) * (1 - share))
    return whole[:cut], whole[cut:], source


def _val_share(split: Mapping[str, Any]) -> float:
    share = split.get("val_share", 0.1)
    if not isinstance(share, float | int) or isinstance(share, bool) or not 0 < share < 1:
        raise UserError(f"data.split.val_share={share!r} must be a share between 0 and 1")
    return float(share)


def corpus_text(given: str | Path, column: str) -> str:
    """The text of a corpus file, folder or shards (module docstring), or one line naming it.
    ``given`` as the user wrote it (a URL is no local path: ``Path`` would fold its ``//``)."""
    given = str(given)
    source = Path(given)
    if is_parquet(given):
        text = _checked(parquet_texts(given, column), given)
    elif source.is_dir():
        files = sorted(
            f
            for f in source.rglob("*")
            if f.is_file()
            and f.suffix.lower() in TEXT_FILES
            and not any(part.startswith(".") for part in f.relative_to(source).parts)
        )
        if not files:
            raise UserError(f"data.path={source}: no .txt files in it; give a text file or folder")
        text = "\n".join(_checked(decoded(f), f) for f in files)
    elif not source.is_file():
        raise UserError(f"data.path={source}: no such file or folder")
    elif source.suffix.lower() == ".gz":
        text = _checked(_gunzipped(source), source)
    elif source.suffix.lower() in {".csv", ".tsv", ".tab", ".jsonl"}:
        header, rows, _ = read_rows(source)
        text = "\n".join(texts_of(header, rows, column, source))
    else:
        text = _checked(decoded(source), source)
    if not text.strip():
        raise UserError(f"data.path={source}: holds no text; give a corpus")
    return text


def _gunzipped(path: Path) -> str:
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError) as error:
        raise UserError(f"cannot read {path}: {error} (is it a gzip file?)") from None
    if len(data) > MAX_FILE_BYTES:
        raise UserError(f"{path} holds more than 2 GB of text; split it into files")
    return utf8_text(data, path)


def _checked(text: str, path: Path | str) -> str:
    """A text file's text, refused when it holds a NUL byte (a binary file decodes as UTF-8
    when its bytes happen to be ASCII)."""
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UserError(
            f"{path} line {line}: holds a NUL byte (\\x00), which no text does; is it binary? "
            "give a text file"
        )
    return text


def _vocabulary(asked: tuple, train: str, val: str, source: str, ids: Any = False) -> Vocabulary:
    """The checkpoint's vocabulary on a resume (``asked``: data.tokenizer, data.vocab_size and
    the stored vocabulary), else the one ``data.tokenizer`` names; ids read as they are
    (``ids``) need the tokenizer that made them: the one token shards carry (``ids`` is then
    :func:`written_by_shard`'s), bytes, or a tokenizer.json."""
    tokenizer, vocab_size, stored = asked
    if stored is not None:  # Hydra hands a dict argument over as a DictConfig
        plain = OmegaConf.to_container(stored) if isinstance(stored, DictConfig) else stored
        return from_record(plain, "the resumed checkpoint")
    if isinstance(ids, tuple):
        return from_record(ids[0], f"{source}/{VOCABULARY}")
    if ids and str(tokenizer) in ("char", "bpe"):
        raise UserError(
            f"data.tokens reads ids a tokenizer made, and data.tokenizer={tokenizer} would fit "
            "a new one; name that tokenizer (a tokenizer.json path, or byte)"
        )
    return fitted(str(tokenizer), train, train + val, vocab_size, source)


def _stored_sha256(stored: Mapping | None) -> str | None:
    """A resumed checkpoint's vocabulary, by the sha256 its record carries (checked when it
    is read: :func:`_vocabulary`): ids made by it are cached apart from a fitted one's."""
    return None if stored is None else str(stored.get("sha256"))
