"""Where a corpus's token ids are kept (``data.cache``, ``data.cache_dir``): a corpus is read
and tokenized once into a file of ids, and every later run with the same source and tokenizer
memory-maps that file instead: no reading, no tokenizing, and the ids take the page cache once
however many processes of a machine read them (2 bytes a token for a vocabulary of at most
65,536 ids, as nanoGPT's ``train.bin``; 4 beyond).

An entry is two files in ``cache_dir`` (default ``<the corpus's folder>/.torchloom-cache``):
``corpus-<source>-<key>.ids`` (the train ids, then the val ids) and its ``.json`` (the
vocabulary's record, the counts, the ids' dtype and their file's sha256). ``<source>`` names
the corpus (its path from the folder that holds the cache folder); ``<key>`` covers what the
ids depend on: every file of the source (path, size, modification time), the val file's, the
columns, the tokenizer asked for (a tokenizer.json by its sha256) or a resumed checkpoint's
vocabulary, the split and this module's format version. A changed, added or removed file
makes a new entry, and the entries of the same source made from other files are removed.

An entry is written as a run's files are (utils/files.py: whole or not at all; the ids before
the description, so a description always has its ids) and read as data from elsewhere: the
description is JSON, checked field by field and against the sha256 of its fields written
with it (a split moved by an edited count trains on other tokens); the ids must have the size it says and the sha256
it records, the vocabulary is checked as a checkpoint's is (data/corpus/vocabulary.py), and an
id past the vocabulary is refused. An entry that fails any of these is said once, removed and
made again. (An entry rewritten whole and consistently, vocabulary, ids and sha256 together,
is read as what it says, as the corpus itself would be: whoever can write the cache folder can
write the corpus; the run's data fingerprint, of the ids read, tells a resume it changed.) A cache folder that cannot be written: one warning, and the run tokenizes in
memory. Under torchrun one process per machine makes or checks the entry while the others
wait (utils/system/distributed.py). The bundled corpus and shards on object storage are read
without one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.corpus.parquet import is_url
from data.corpus.vocabulary import Vocabulary, from_record
from utils.errors import UserError
from utils.files import atomic_file, file_sha256, write_json
from utils.system.distributed import Unwritable, once_per_machine

log = logging.getLogger("torchloom")

FORMAT_VERSION = 1
CACHE_SETTINGS = ("auto", "off")
SCAN_BYTES = 1 << 24  # an entry's ids are checked this many bytes at a time (an even count)
ENTRY = re.compile(r"corpus-[0-9a-f]{8}-[0-9a-f]{20}\.(ids|json)")

# What tokenizing gives: the vocabulary, the train and val ids, and where val came from.
Tokenized = tuple[Vocabulary, torch.Tensor, torch.Tensor, str]


@dataclass(frozen=True, kw_only=True)
class TokenCache:
    """One corpus's entry in ``folder``: ``source`` names the corpus, ``key`` what its ids
    depend on and ``listing`` its files alone (what tells a stale entry of it)."""

    folder: Path
    source: str
    key: str
    listing: str

    @property
    def ids_path(self) -> Path:
        return self.folder / f"corpus-{self.source}-{self.key}.ids"

    @property
    def described_path(self) -> Path:
        return self.ids_path.with_suffix(".json")

    def held(self, tokenize: Callable[[], Tokenized]) -> Tokenized:
        """The entry's ids, memory-mapped: checked, or made first by ``tokenize``."""
        try:
            once_per_machine(lambda: self._made(tokenize))
        except Unwritable as error:
            log.warning("%s; tokenizing in memory (point data.cache_dir elsewhere)", error)
            return tokenize()
        return self._mapped()

    def _made(self, tokenize: Callable[[], Tokenized]) -> None:
        problem = self._problem() if self.described_path.exists() else "absent"
        if problem is None:
            return
        if problem != "absent":
            log.warning("token cache %s %s; tokenizing the corpus again", self.ids_path, problem)
        self._write(*tokenize())

    def _write(self, vocabulary: Vocabulary, train: torch.Tensor, val: torch.Tensor, where: str):
        dtype = np.uint16 if vocabulary.size <= 1 << 16 else np.int32
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._remove_stale()
            with atomic_file(self.ids_path) as f:
                for ids in (train, val):
                    f.write(ids.numpy().astype(dtype).tobytes())
            described = {
                "version": FORMAT_VERSION,
                "listing": self.listing,
                "vocabulary": vocabulary.record(),
                "dtype": np.dtype(dtype).name,
                "train": len(train),
                "val": len(val),
                "val_source": where,
                "sha256": file_sha256(self.ids_path),
            }
            write_json({**described, "digest": _digest(described)}, self.described_path)
        except OSError as error:
            raise Unwritable(
                f"data.cache_dir={self.folder} cannot be written: {error.strerror or error}"
            ) from None
        log.info("corpus tokenized into %s", self.ids_path)

    def _remove_stale(self) -> None:
        """The entries of this corpus made from other files (never another name)."""
        for path in self.folder.glob(f"corpus-{self.source}-*.json"):
            if not ENTRY.fullmatch(path.name) or path == self.described_path:
                continue
            try:
                listing = json.loads(path.read_text()).get("listing")
            except (OSError, ValueError, AttributeError):
                listing = None
            if listing != self.listing:
                path.with_suffix(".ids").unlink(missing_ok=True)
                path.unlink(missing_ok=True)

    def _described(self) -> dict[str, Any]:
        described = json.loads(self.described_path.read_text(encoding="utf-8"))
        fields = {"train": int, "val": int, "dtype": str, "sha256": str, "val_source": str}
        if not isinstance(described, dict) or described.get("version") != FORMAT_VERSION:
            raise ValueError("is of another format")
        body = {key: value for key, value in described.items() if key != "digest"}
        if described.get("digest") != _digest(body):  # its counts, dtype, ids' sha256, ...
            raise ValueError("its description does not match the digest written with it")
        for name, kind in fields.items():
            if not isinstance(described.get(name), kind) or isinstance(described[name], bool):
                raise ValueError(f"has no valid {name}")
        if (
            described["dtype"] not in ("uint16", "int32")
            or min(described["train"], described["val"]) < 0
        ):
            raise ValueError("has a damaged description")
        return described

    def _problem(self) -> str | None:
        """What is wrong with the entry (the description, the ids' size or sha256, the
        vocabulary, an id past it), or None."""
        try:
            described = self._described()
            count = described["train"] + described["val"]
            if self.ids_path.stat().st_size != count * np.dtype(described["dtype"]).itemsize:
                return "is cut short or too long"
            sha256, low, high = _scanned(self.ids_path, described["dtype"])
            if sha256 != described["sha256"]:
                return "does not match the sha256 written with it"
            vocabulary = from_record(described.get("vocabulary"), str(self.described_path))
            if count and (high >= vocabulary.size or low < 0):
                return "holds ids its vocabulary lacks"
        except (OSError, ValueError, UserError) as error:
            return f"cannot be read ({error})"
        return None

    def _mapped(self) -> Tokenized:
        described = self._described()
        vocabulary = from_record(described["vocabulary"], str(self.described_path))
        train, val = described["train"], described["val"]
        dtype = {"uint16": torch.uint16, "int32": torch.int32}[described["dtype"]]
        ids = torch.from_file(str(self.ids_path), shared=False, size=train + val, dtype=dtype)
        return vocabulary, ids[:train], ids[train:], described["val_source"]


def token_cache(
    setting: str, folder: str | None, source: str | None, described: dict[str, Any]
) -> TokenCache | None:
    """The entry for a corpus at ``source`` (None: the bundled one) as ``described`` (its
    columns, tokenizer, split, a resumed vocabulary), or None when ``data.cache=off``, for the
    bundled corpus and for shards on object storage."""
    if setting not in CACHE_SETTINGS:
        raise UserError(f"data.cache={setting!r} must be one of {', '.join(CACHE_SETTINGS)}")
    if setting == "off" or source is None or is_url(source):
        return None
    where = Path(source)
    if not where.exists():
        return None  # the reader says what is missing
    home = where if where.is_dir() else where.parent
    cache = Path(folder) if folder else home / ".torchloom-cache"
    files = [_listing(where, cache)]
    val_path = described.get("split", {}).get("val_path")
    if val_path and not is_url(str(val_path)) and Path(str(val_path)).exists():
        files.append(_listing(Path(str(val_path)), cache))
    tokenizer = str(described.get("tokenizer"))
    if tokenizer.endswith(".json") and Path(tokenizer).is_file():
        described = {**described, "tokenizer_sha256": file_sha256(tokenizer)}
    listing = hashlib.sha256(json.dumps(files).encode()).hexdigest()
    settings = {"version": FORMAT_VERSION, "listing": listing, **described}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
    parent, at = cache.resolve().parent, where.resolve()
    named = at.relative_to(parent).as_posix() if at.is_relative_to(parent) else str(at)
    source_id = hashlib.sha256(named.encode()).hexdigest()[:8]
    return TokenCache(folder=cache, source=source_id, key=key[:20], listing=listing)


def _digest(described: dict[str, Any]) -> str:
    """The sha256 of a description's fields, written with them."""
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _scanned(path: Path, dtype: str) -> tuple[str, int, int]:
    """(sha256, smallest id, largest id) of an ids file, in one read of it."""
    digest, low, high = hashlib.sha256(), 0, 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(SCAN_BYTES), b""):
            digest.update(block)
            ids = np.frombuffer(block, dtype=dtype)
            if len(ids):
                low, high = min(low, int(ids.min())), max(high, int(ids.max()))
    return digest.hexdigest(), low, high


def _listing(where: Path, cache: Path) -> list[tuple[str, int, int]]:
    """Each file of a corpus (its path within it, size, modification time); hidden ones and
    the cache folder's out (a data.cache_dir inside the corpus would change its own key)."""
    if where.is_file():
        stat = where.stat()
        return [(where.name, stat.st_size, stat.st_mtime_ns)]
    found, cache = [], cache.resolve()
    for path in sorted(where.rglob("*")):
        parts = path.relative_to(where).parts
        hidden = any(part.startswith(".") for part in parts)
        if path.is_file() and not hidden and not path.resolve().is_relative_to(cache):
            stat = path.stat()
            found.append(("/".join(parts), stat.st_size, stat.st_mtime_ns))
    return found
