"""A corpus held in Parquet shards, local or on object storage (``data.path`` a ``.parquet``
file, a folder or glob of them, or an ``s3://``/``gs://``/``hf://`` URL, read through
data/shards/storage.py as ``data=parquet`` reads them): the ``data.text`` column's texts,
joined by a newline, or the ``data.tokens`` column's token ids (lists of whole numbers, as a
tokenizer of ``data.tokenizer`` gave them), laid end to end in file and row order. Token
shards shard.py wrote (``out/train``, ``out/val``, their vocabulary's record in
``out/vocabulary.json``) are read split as written, with that vocabulary (checked as a
checkpoint's is).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data.shards.parquet import description, json_beside
from data.shards.row_groups import row_groups
from data.shards.storage import SCHEMES, files_of, read_row_group
from data.text.tokenizer_trust import MAX_JSON_BYTES
from utils.errors import UserError

VOCABULARY = "vocabulary.json"  # beside token shards: the record of the vocabulary that made them


def written_by_shard(path: str) -> tuple[dict, str, str] | None:
    """(the vocabulary's record, the train shards, the val shards) of token shards shard.py
    wrote at ``path``, read as untrusted data, or None where torchloom.json names none."""
    folder = path.rstrip("/")
    named = description(folder).get("vocabulary")
    if named is None:
        return None
    if named != VOCABULARY:
        raise UserError(
            f"{folder}/torchloom.json names vocabulary={named!r}; shard.py writes {VOCABULARY}"
        )
    record = json_beside(folder, VOCABULARY, MAX_JSON_BYTES).get("corpus")
    if not isinstance(record, dict):
        raise UserError(
            f"{folder}/{VOCABULARY} is not the vocabulary record shard.py writes (missing or "
            "edited?); write the shards again"
        )
    return record, f"{folder}/train", f"{folder}/val"


def is_url(path: str | Path) -> bool:
    """Whether ``data.path`` names objects on storage rather than a local path."""
    return str(path).startswith(SCHEMES[:-1])


def is_parquet(path: str | Path) -> bool:
    """Whether ``data.path`` names Parquet shards rather than text files."""
    path = str(path)
    local = Path(path)
    if is_url(path) or local.suffix.lower() == ".parquet" or "*" in path:
        return True
    return local.is_dir() and any(local.rglob("*.parquet")) and not any(local.rglob("*.txt"))


def parquet_texts(path: str, column: str) -> str:
    """The ``column`` of every row of the shards at ``path``, joined by a newline."""
    parts = []
    for table in _tables(path, column):
        values = table.column(column).to_pylist()
        if any(v is not None and not isinstance(v, str) for v in values):
            raise UserError(
                f"data.path={path}: column {column!r} holds {type(values[0]).__name__}s, not "
                "texts; name a text column with data.text, or ids with data.tokens"
            )
        parts += [v for v in values if v is not None]
    return "\n".join(parts)


def parquet_ids(path: str, column: str, vocab_size: int) -> np.ndarray:
    """The token ids of the ``column`` of every row, end to end; each below ``vocab_size``."""
    chunks = []
    for table in _tables(path, column):
        values = table.column(column).combine_chunks()
        if not hasattr(values, "flatten"):
            raise UserError(
                f"data.path={path}: column {column!r} is not a list of token ids; name a "
                "column of id lists with data.tokens, or texts with data.text"
            )
        chunks.append(np.asarray(values.flatten().to_numpy(zero_copy_only=False)))
    ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    if ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0):
        raise UserError(f"data.path={path}: column {column!r} holds values that are no token ids")
    if ids.size and int(ids.max()) >= vocab_size:
        raise UserError(
            f"data.path={path}: column {column!r} holds id {int(ids.max())}, and the "
            f"vocabulary (data.tokenizer) has {vocab_size}; give the tokenizer that made them"
        )
    return ids.astype(np.int64)


def _tables(path: str, column: str):
    shards = files_of(path, "data.path")
    groups, _, schema = row_groups(shards)
    if column not in schema.names:
        raise UserError(
            f"data.path={path}: no column {column!r} in {shards[0].name} (it holds "
            f"{', '.join(schema.names[:8])}); name the column"
        )
    for shard, group in groups:
        yield read_row_group(shards[shard], group, [column])
