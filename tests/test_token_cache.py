"""A corpus's token cache (data/corpus/cache.py) through the real entry point: a later run
reads the ids memory-mapped instead of tokenizing and trains to the same weights; a changed
corpus makes a new entry and removes the stale one; an entry changed on the disk (a byte of
the ids, a description whose ids and sha256 were both rewritten past the vocabulary, an edited
vocabulary) is said, made again and never trained on; a cache folder that cannot be written
is one warning and the run goes on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import checkpoint, run_train
from test_language_models import LM, TINY, shakespeare

CACHE = ".torchloom-cache"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    (tmp_path / "corpus.txt").write_text(shakespeare(6000), encoding="utf-8")
    return tmp_path


def entries(cwd: Path) -> list[Path]:
    return sorted((cwd / CACHE).glob("corpus-*.json"))


def same_weights(cwd: Path, a: str, b: str) -> bool:
    one, two = checkpoint(cwd, a)["model"], checkpoint(cwd, b)["model"]
    return all(torch.equal(one[key], two[key]) for key in one)


def test_a_later_run_reads_the_ids_it_cached_and_trains_to_the_same_weights(corpus):
    first = run_train(corpus, *LM, *TINY, "run_name=first")
    assert "tokenized into" in first.stderr + first.stdout
    [described] = entries(corpus)
    stored = json.loads(described.read_text())
    assert stored["dtype"] == "uint16" and stored["train"] + stored["val"] == 6000
    ids = np.fromfile(described.with_suffix(".ids"), dtype=np.uint16)
    chars = stored["vocabulary"]["chars"]
    assert "".join(chars[i] for i in ids) == shakespeare(6000)  # the corpus, id by id
    again = run_train(corpus, *LM, *TINY, "run_name=again")
    assert "tokenized into" not in again.stderr + again.stdout  # read, not tokenized
    run_train(corpus, *LM, *TINY, "run_name=uncached", "data.cache=off")
    assert same_weights(corpus, "first", "again") and same_weights(corpus, "first", "uncached")
    assert entries(corpus) == [described]


def test_a_changed_corpus_makes_a_new_entry_and_the_stale_one_goes(corpus):
    run_train(corpus, *LM, *TINY, "run_name=first")
    [old] = entries(corpus)
    (corpus / "corpus.txt").write_text(shakespeare(7000), encoding="utf-8")
    run_train(corpus, *LM, *TINY, "run_name=second")
    [new] = entries(corpus)
    assert new != old and not old.with_suffix(".ids").exists()
    assert json.loads(new.read_text())["train"] + json.loads(new.read_text())["val"] == 7000


def rewrite_ids(described: Path, change) -> None:
    """Rewrite the entry's ids by ``change`` and record their new sha256 and the description's
    digest, as code that knows the format would: only the vocabulary check can tell."""
    stored = json.loads(described.read_text())
    path = described.with_suffix(".ids")
    ids = np.fromfile(path, dtype=stored["dtype"])
    change(ids)
    path.write_bytes(ids.tobytes())
    stored["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    stored.pop("digest")
    stored["digest"] = hashlib.sha256(json.dumps(stored, sort_keys=True).encode()).hexdigest()
    described.write_text(json.dumps(stored))


def flip_a_byte(described: Path) -> None:
    path = described.with_suffix(".ids")
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))


def past_the_vocabulary(described: Path) -> None:
    rewrite_ids(described, lambda ids: ids.__setitem__(5, 60_000))


def edited_vocabulary(described: Path) -> None:
    stored = json.loads(described.read_text())
    stored["vocabulary"]["chars"] = stored["vocabulary"]["chars"][::-1]  # ids mean other chars
    described.write_text(json.dumps(stored))


def moved_split(described: Path) -> None:
    stored = json.loads(described.read_text())
    stored["train"], stored["val"] = stored["train"] - 500, stored["val"] + 500  # ids untouched
    described.write_text(json.dumps(stored))


def cut_short(described: Path) -> None:
    path = described.with_suffix(".ids")
    path.write_bytes(path.read_bytes()[:-2])


@pytest.mark.parametrize(
    "damage, said",
    [
        (flip_a_byte, "does not match the sha256"),
        (past_the_vocabulary, "holds ids its vocabulary lacks"),
        (edited_vocabulary, "cannot be read"),
        (cut_short, "cut short"),
        (moved_split, "does not match the digest"),
    ],
)
def test_an_entry_changed_on_the_disk_is_said_made_again_and_never_trained_on(corpus, damage, said):
    run_train(corpus, *LM, *TINY, "run_name=first")
    [described] = entries(corpus)
    damage(described)
    result = run_train(corpus, *LM, *TINY, "run_name=again")
    output = result.stderr + result.stdout
    assert said in output and "tokenizing the corpus again" in output
    assert same_weights(corpus, "first", "again")
    assert entries(corpus) == [described]  # made again, whole
    run_train(corpus, *LM, *TINY, "run_name=third")
    assert same_weights(corpus, "first", "third")


def test_a_cache_folder_that_cannot_be_written_is_one_warning_and_the_run_goes_on(corpus):
    (corpus / "afile").write_text("not a folder")
    result = run_train(corpus, *LM, *TINY, "run_name=through", "data.cache_dir=afile/cache")
    assert "cannot be written" in result.stderr + result.stdout
    run_train(corpus, *LM, *TINY, "run_name=uncached", "data.cache=off")
    assert same_weights(corpus, "through", "uncached")
    assert (corpus / "afile").read_text() == "not a folder"


def test_a_cache_folder_inside_a_corpus_folder_is_not_part_of_its_key(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text(shakespeare(3000), encoding="utf-8")
    (books / "b.txt").write_text(shakespeare(6000)[3000:], encoding="utf-8")
    folder = [*LM[:3], "data.path=books", "data.cache_dir=books/cache", *TINY]
    first = run_train(tmp_path, *folder, "run_name=first")
    assert "tokenized into" in first.stderr + first.stdout
    again = run_train(tmp_path, *folder, "run_name=again")
    assert "tokenized into" not in again.stderr + again.stdout  # the same key: read
    assert same_weights(tmp_path, "first", "again")
