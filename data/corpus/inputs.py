"""Streams: windows of a corpus's token ids, each token's target the next (``data=corpus``),
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
from data.corpus.vocabulary import Vocabulary, from_record
from utils.errors import UserError


class StreamIds(BatchTransform):
    """Token ids, moved to the device and never normalised."""

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.device)


@dataclass(frozen=True, kw_only=True)
class Stream:
    """A corpus's token ids; ``vocabulary``: how text becomes them (data/corpus/vocabulary.py)."""

    vocabulary: Vocabulary
    name = "token stream"

    @property
    def token_unit(self) -> str | None:
        """What one token is where bits per unit are exact: character, byte (task=causal_lm)."""
        return self.vocabulary.unit

    @classmethod
    def claims(cls, record: dict, path: Path) -> Stream | None:
        """A stored inputs record holding a corpus vocabulary, checked as untrusted data: its
        own sha256, and one id for each of the model's outputs."""
        if record.get("corpus") is None:
            return None
        vocabulary = from_record(record["corpus"], str(path))
        if vocabulary.size != record.get("num_classes"):  # the model's outputs: one an id
            raise UserError(
                f"{path}: its vocabulary holds {vocabulary.size} tokens, and its model predicts "
                f"{record.get('num_classes')!r} (was it edited?); use the checkpoint as written"
            )
        return cls(vocabulary=vocabulary)

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
        return StreamIds(mean, std, device, augment, channels_last)

    def example(
        self,
        shape: Sequence[int],
        batch: int,
        device: torch.device,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """A full window of ids: zeros, or drawn from the vocabulary by ``generator``."""
        if generator is None:
            return torch.zeros(batch, *shape, dtype=torch.long, device=device)
        ids = torch.randint(0, self.vocabulary.size, (batch, *shape), generator=generator)
        return ids.to(device)

    def model_hints(
        self, shape: Sequence[int], train: Any, mean: Sequence[float], std: Sequence[float]
    ) -> dict[str, Any]:
        return {"vocab_size": self.vocabulary.size}

    def builder_hints(self) -> dict[str, Any]:
        """A resumed run's corpus is tokenized by the vocabulary it stored, never one refitted."""
        return {"stored_vocabulary": self.vocabulary.record()}

    def record(self) -> dict[str, Any]:
        return {"corpus": self.vocabulary.record()}

    def following(self, stored: Any) -> Stream:
        return self

    def fixed(self, train: Any) -> Stream:
        return self

    def check_encoded_as(self, stored: Any, source: Any, name: str, use: str, fills: bool) -> None:
        """Data tokenized by another vocabulary than the checkpoint's is refused."""
        theirs = getattr(stored, "vocabulary", None)
        if theirs is not None and theirs.record()["sha256"] != self.vocabulary.record()["sha256"]:
            raise UserError(
                f"{source} was trained on another vocabulary than {name}'s; {use} on text "
                "tokenized as it was trained (data.tokenizer as the run had it)"
            )

    def targets_in(self) -> str:
        return "the next tokens"

    def read_raw(self, path: Path, shape: Sequence[int]) -> tuple[list[str], torch.Tensor, Any]:
        raise UserError(
            f'input={path}: a language model continues a prompt; use prompt="..." or '
            "prompts=<file of one prompt a line>"
        )

    def front(
        self, model: nn.Module, mean: Sequence[float], std: Sequence[float], shape: Sequence[int]
    ) -> nn.Module:
        raise UserError(
            "exports of a language model are not supported in this version; sample from it "
            'with predict.py prompt="..."'
        )

    def prompt_ids(self, text: str, where: str) -> torch.Tensor:
        """A prompt's ids (predict.py prompt=): a character the vocabulary lacks is refused."""
        if not text:
            raise UserError(f"{where} is empty; give the text to continue")
        return self.vocabulary.encode(text, where)

    def text_of(self, ids: Sequence[int]) -> str:
        return self.vocabulary.decode(list(ids))

    def shown(self, sample: torch.Tensor) -> str:
        """A window as its text."""
        return self.vocabulary.decode(sample.tolist())
