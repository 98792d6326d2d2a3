"""A corpus to train a language model on (``data=corpus``): one stream of token ids.

    python train.py task=causal_lm model=gpt data=corpus                    # tiny Shakespeare
    python train.py task=causal_lm model=gpt data=corpus data.path=notes/ data.tokenizer=byte
    python train.py task=causal_lm model=gpt data=corpus data.path=t.jsonl data.text=body

``path``: a text file (``.txt``, or ``.gz`` of one), a folder of ``.txt`` files (in name
order), or a CSV/TSV/JSON-lines file whose ``data.text`` column holds the texts; files and rows
are joined with one newline between them. None: the bundled tiny Shakespeare
(data/assets/README.md). Read strictly (UTF-8, no NUL byte: data/text/files.py), tokenized once
by the vocabulary (data/corpus/vocabulary.py), and split as nanoGPT splits: the last
``split.val_share`` of the tokens for validation, unless ``split.val_path`` gives a file of
its own. The run is tested on the val split (there is no third).
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data.batching.dataset import Batching, Data, Splits
from data.batching.targets import Targets, reads_targets
from data.corpus.inputs import Stream
from data.corpus.stream import TokenStream
from data.corpus.vocabulary import Vocabulary, fitted, from_record
from data.text.files import MAX_FILE_BYTES, decoded, read_rows, texts_of
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
    round_steps: int | None = None,
    accumulate: int = 1,
    stored_vocabulary: Mapping | None = None,
    **options,
) -> Data:
    """conf/data/corpus.yaml. ``block_size``: the tokens a window holds (the model's context);
    ``round_steps``: trainer.val_every_n_steps (a round of that many optimizer steps is the
    loop's epoch; None: a pass over the stream); ``stored_vocabulary``: the checkpoint's, on a
    resume (never fitted again); ``options``: the keys of :class:`Batching` but mean and std."""
    options.pop("targets", None)
    check_values("data", {"block_size": block_size}, {"block_size": POSITIVE_INT})
    source = Path(path) if path else BUNDLED
    train_text, val_text, val_source = split_text(source, text, split)
    vocabulary = _vocabulary(tokenizer, vocab_size, stored_vocabulary, train_text, val_text, source)
    train = vocabulary.encode(train_text, f"{source} (train)")
    val = vocabulary.encode(val_text, f"{val_source} (val)")
    for name, ids, where in (("train", train, source), ("val", val, val_source)):
        if len(ids) < block_size + 1:
            raise UserError(
                f"the {name} split of {where} holds {len(ids):,} tokens, fewer than one window "
                f"of data.block_size + 1 = {block_size + 1}; lower data.block_size or give "
                "more text"
            )
    rounds = (round_steps or 0) * accumulate
    streams = Splits(TokenStream(train, block_size, rounds), TokenStream(val, block_size))
    log.info(
        "corpus %s: %s train and %s val tokens, %s of them (data.tokenizer=%s), windows of %d",
        source.name,
        f"{len(train):,}",
        f"{len(val):,}",
        f"{vocabulary.size:,}",
        vocabulary.kind if vocabulary.kind != "bpe" else tokenizer,
        block_size,
    )
    batching = Batching(mean=[0.0], std=[1.0], **options)
    targets = Targets("next_tokens", vocabulary.size)
    data = Data(
        f"corpus {source.name}",
        streams,
        vocabulary.size,
        batching,
        targets,
        inputs=Stream(vocabulary=vocabulary),
    )
    data.mean, data.std = [0.0] * block_size, [1.0] * block_size  # ids are never normalised
    return data


def split_text(source: Path, column: str, split: Mapping[str, Any]) -> tuple[str, str, Path]:
    """(train text, val text, where val came from): the last ``split.val_share`` of the
    characters (nanoGPT's split: by characters, then tokenized), or ``split.val_path``'s."""
    whole = corpus_text(source, column)
    if split.get("val_path"):
        val_source = Path(split["val_path"])
        return whole, corpus_text(val_source, column), val_source
    share = split.get("val_share", 0.1)
    if not isinstance(share, float | int) or isinstance(share, bool) or not 0 < share < 1:
        raise UserError(f"data.split.val_share={share!r} must be a share between 0 and 1")
    cut = int(len(whole) * (1 - share))
    return whole[:cut], whole[cut:], source


def corpus_text(source: Path, column: str) -> str:
    """The text of a corpus file or folder (module docstring), or one line naming it."""
    if source.is_dir():
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
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise UserError(
            f"{path} line {line}: byte 0x{data[error.start]:02x} is not UTF-8; save the text "
            "as UTF-8"
        ) from None


def _checked(text: str, path: Path) -> str:
    """A text file's text, refused when it holds a NUL byte (a binary file decodes as UTF-8
    when its bytes happen to be ASCII)."""
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UserError(
            f"{path} line {line}: holds a NUL byte (\\x00), which no text does; is it binary? "
            "give a text file"
        )
    return text


def _vocabulary(
    tokenizer: str, vocab_size: Any, stored: Mapping | None, train: str, val: str, source: Path
) -> Vocabulary:
    if stored is not None:  # Hydra hands a dict argument over as a DictConfig
        plain = OmegaConf.to_container(stored) if isinstance(stored, DictConfig) else stored
        return from_record(plain, "the resumed checkpoint")
    return fitted(str(tokenizer), train, train + val, vocab_size, str(source))
