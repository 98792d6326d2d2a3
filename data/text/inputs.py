"""Tokens: token ids [L] of a fitted or given tokenizer, padded on the right (``data=text``),
and what this kind answers (data/batching/inputs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.batching.batches import BatchTransform
from data.text.files import decoded, read_rows, texts_of
from data.text.tokenizer import from_record, token_ids
from utils.errors import UserError


class TokenIds(BatchTransform):
    """Token ids: indices, moved to the device and never normalised. ``pad_id``: the id that
    pads (data/batching/batches.py TensorBatches cuts each batch to its longest text)."""

    def __init__(self, pad_id: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pad_id = pad_id

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.device)


@dataclass(frozen=True, kw_only=True)
class Tokens:
    """Texts as token ids; ``text``: the tokenizer's record (data/text/tokenizer.py, with the
    columns read), ``pad_id``: the id that pads."""

    text: dict
    pad_id: int
    name = "tokens"

    @classmethod
    def claims(cls, record: dict, path: Path) -> Tokens | None:
        """A stored inputs record holding a tokenizer, checked as untrusted data."""
        if record.get("text") is None:
            return None
        tokenizer = from_record(record["text"], str(path))
        return cls(text=record["text"], pad_id=tokenizer.pad_id)

    def transform(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device,
        *,
        shape: Sequence[int] = (),
        augment: Any = None,
        channels_last: bool = False,
    ) -> BatchTransform:
        return TokenIds(self.pad_id, mean, std, device, augment, channels_last)

    def example(
        self,
        shape: Sequence[int],
        batch: int,
        device: torch.device,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Texts of every one of the ``shape`` tokens (the most a batch holds), none padding."""
        return torch.full((batch, *shape), int(self.pad_id == 0), dtype=torch.long, device=device)

    def model_hints(
        self, shape: Sequence[int], train: Any, mean: Sequence[float], std: Sequence[float]
    ) -> dict[str, Any]:
        tokenizer = from_record(self.text, "the data's text record")
        return {"vocab_size": tokenizer.vocab_size, "pad_id": tokenizer.pad_id}

    def builder_hints(self) -> dict[str, Any]:
        """A resumed run's texts are tokenized by the tokenizer it stored, never one refitted."""
        return {"stored_text": self.text}

    def record(self) -> dict[str, Any]:
        return {"text": self.text}

    def following(self, stored: Any) -> Tokens:
        return self

    def fixed(self, train: Any) -> Tokens:
        return self

    def check_encoded_as(self, stored: Any, source: Any, name: str, use: str, fills: bool) -> None:
        """The tokenizer is the stored one already (:meth:`builder_hints`)."""

    def targets_in(self) -> str:
        return "the labels"

    def read_raw(self, path: Path, shape: Sequence[int]) -> tuple[list[str], torch.Tensor, Any]:
        """Texts tokenized as training did (:func:`predicted_texts`)."""
        return (*predicted_texts(path, self.text), None)

    def front(
        self, model: nn.Module, mean: Sequence[float], std: Sequence[float], shape: Sequence[int]
    ) -> nn.Module:
        return RawTokens(model, self.text)

    def plain(self, samples: torch.Tensor) -> list[str]:
        """The texts as the tokenizer reads their ids back, padding left out."""
        tokenizer = from_record(self.text, "the data's text record").tokenizer
        rows = [[i for i in row if i != self.pad_id] for row in samples.tolist()]
        return tokenizer.decode_batch(rows)

    def shown(self, sample: torch.Tensor) -> str:
        """A text as the tokenizer reads its ids back, padding left out."""
        tokenizer = from_record(self.text, "the data's text record").tokenizer
        ids = [i for i in sample.tolist() if i != self.pad_id]
        return tokenizer.decode(ids)


def predicted_texts(path: Path, record: dict) -> tuple[list[str], torch.Tensor]:
    """predict.py's input for a text model (``record``: the checkpoint's checked text record):
    a CSV/TSV/JSON-lines file holding the text column(s) training read (each row named by its
    number), a ``.txt`` file, or a folder of ``.txt`` files (named by their paths in it);
    tokenized as training did. Returns (names, ids [N, L])."""
    chosen = from_record(record, "the checkpoint")
    if path.is_dir() or path.suffix.lower() == ".txt":
        base = path if path.is_dir() else path.parent
        files = [path] if path.is_file() else sorted(f for f in path.rglob("*.txt") if f.is_file())
        if not files:
            raise UserError(f"input={path}: no .txt files")
        names = [str(f.relative_to(base)) for f in files]
        texts = [decoded(f).strip() for f in files]
    else:
        header, rows, _ = read_rows(path)
        texts = texts_of(header, rows, record.get("columns") or ["text"], path)
        names = [str(n) for n in range(1, len(rows) + 1)]
    return names, token_ids(texts, chosen, "input")


class RawTokens(nn.Module):
    """Token ids [N, L] and their mask [N, L] (int64, 1 for a token, texts padded on the right
    with ``pad_id``) → the model's outputs. The export's record carries the tokenizer's JSON,
    ``max_length`` and ``pad_id``, so a program that imports nothing of torchloom tokenizes
    with ``tokenizers`` alone as predict.py does (data/text/dataset.py)."""

    input_names = ("ids", "mask")

    def __init__(self, model: nn.Module, text: dict) -> None:
        super().__init__()
        self.model, self.text = model, text
        tokenizer = from_record(text, "the checkpoint")  # checked: size, sha256, pad id
        self.vocab_size, self.pad_id = tokenizer.vocab_size, tokenizer.pad_id
        self.max_length = tokenizer.max_length

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> Any:
        return self.model(ids, mask)

    def example(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` texts of 1 to L tokens, L growing with the batch (the length is dynamic)."""
        length = min(self.max_length, 3 + 2 * batch)
        ids = torch.randint(0, self.vocab_size, (batch, length), generator=generator)
        held = torch.randint(1, length + 1, (batch, 1), generator=generator)
        mask = (torch.arange(length).view(1, -1) < held).long()
        return ids.masked_fill(mask == 0, self.pad_id), mask

    def describe(self) -> dict:
        return {
            "kind": "tokens",
            "dtype": "int64",
            "shape": ["batch", "length"],
            "inputs": "ids and mask, int64 [batch, length]: the tokenizer's ids (special tokens "
            "as its post-processor adds them, cut at max_length), padded on the right with "
            "pad_id; mask 1 for a token, 0 for padding",
        }

    def carries(self) -> dict:
        """The tokenizer's JSON text, ``max_length``, ``pad_id`` and the columns read."""
        wanted = ("tokenizer", "max_length", "pad_id", "columns")
        return {k: self.text[k] for k in wanted if k in self.text}
