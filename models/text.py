"""Models for texts (``data=text``): each takes token ids [N, L] (padded on the right with the
tokenizer's ``pad_id``) and, optionally, their mask [N, L] (1 for a token); without a mask it is
read from the ids.

- :func:`text_bag` (fastText-style, Joulin et al. 2017): the mean of the texts' token
  embeddings and of hashed bigram embeddings, then one hidden layer. Fast, and strong on
  sentence-length sets of a few thousand texts; what ``model=auto`` picks for text.
- :func:`text_transformer` (``model=text_transformer``): a small pre-norm Transformer encoder
  with learned positions, pooled by the mean of its tokens or its first ([CLS]) token.

    python train.py data=text data.path=reviews.csv model=text_transformer model.layers=4
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from utils.config.arguments import DROPOUT, NON_NEGATIVE_INT, POSITIVE_INT, checked, one_of
from utils.errors import UserError
from utils.text import first_line

BIGRAM_PRIME = 1_000_003  # a bigram (a, b) is hashed to (a · prime + b) mod buckets
# The bag's parameters are stored ÷5 and read ×5: under Adam, whose steps are about the LR
# whatever the gradient's size, the bag then trains as at 5× optim.lr (0.01 at the default
# 0.002), the rate a bag of embeddings wants (1,122 debate statements: 65.3% test accuracy at
# 0.002, 70.0% at 0.01; benchmarks/text_figures.py) while optim stays the one every model shares.
LR_SCALE = 5.0


class ScaledLinear(nn.Linear):
    """``nn.Linear`` read ×:data:`LR_SCALE` and initialised ÷ it: the same function at the
    start, trained as at that times the LR."""

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.weight.div_(LR_SCALE)
            if self.bias is not None:
                self.bias.div_(LR_SCALE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * LR_SCALE


@dataclass(frozen=True)
class TextShape:
    """What a text model takes from the data: the tokenizer's ``vocab_size`` and ``pad_id``,
    texts of at most ``max_length`` tokens, and ``outputs`` columns."""

    vocab_size: int
    pad_id: int
    max_length: int
    outputs: int

    @classmethod
    def of(cls, input_shape, num_classes, vocab_size, pad_id, name: str) -> TextShape:
        if vocab_size is None or len(input_shape) != 1:
            raise UserError(
                f"model={name} takes texts (data=text: token ids [L]), and the data gives "
                f"samples of shape {list(input_shape)}; use data=text, or another model"
            )
        return cls(vocab_size, pad_id or 0, input_shape[0], num_classes)


def held_tokens(ids: torch.Tensor, mask: torch.Tensor | None, pad_id: int) -> torch.Tensor:
    """Where the texts' tokens are (bool [N, L]): the mask given, or the ids that do not pad."""
    return (ids != pad_id) if mask is None else mask.bool()


def pooled(hidden: torch.Tensor, held: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per text from its tokens' [N, L, D]: the first token's (``cls``), or the mean
    of the held tokens (``mean``)."""
    if pooling == "cls":
        return hidden[:, 0]
    weight = held.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weight).sum(1) / weight.sum(1).clamp(min=1)


class TextBag(nn.Module):
    """Mean token and hashed-bigram embeddings → dropout → a hidden layer (none: ``hidden``
    0, a linear model of the embeddings) → the outputs."""

    def __init__(
        self, shape: TextShape, dim: int, hidden: int, dropout: float, buckets: int
    ) -> None:
        super().__init__()
        self.pad_id, self.buckets = shape.pad_id, buckets
        self.tokens = nn.Embedding(shape.vocab_size, dim)
        self.bigrams = nn.Embedding(buckets, dim) if buckets else None
        for table in filter(None, (self.tokens, self.bigrams)):  # N(0, 1) ÷ LR_SCALE
            nn.init.normal_(table.weight, std=1 / LR_SCALE)
        layers = [ScaledLinear(dim, hidden), nn.GELU(), nn.Dropout(dropout)] if hidden else []
        last = ScaledLinear(hidden or dim, shape.outputs)
        self.head = nn.Sequential(nn.Dropout(dropout), *layers, last)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        held = held_tokens(ids, mask, self.pad_id)
        weight = held.unsqueeze(-1).to(self.tokens.weight.dtype)
        summed = (self.tokens(ids) * weight).sum(1)
        count = weight.sum(1)
        if self.bigrams is not None and ids.shape[1] > 1:
            pairs = (ids[:, :-1] * BIGRAM_PRIME + ids[:, 1:]) % self.buckets
            both = weight[:, :-1] * weight[:, 1:]
            summed = summed + (self.bigrams(pairs) * both).sum(1)
            count = count + both.sum(1)
        return self.head(summed / count.clamp(min=1) * LR_SCALE)


class TextTransformer(nn.Module):
    """Token and position embeddings → ``layers`` pre-norm encoder layers → a pooled vector →
    the outputs. Padding is masked out of attention and of the mean."""

    def __init__(
        self, shape: TextShape, width: int, layers: int, heads: int, dropout: float, pooling: str
    ) -> None:
        super().__init__()
        if width % heads:
            raise UserError(f"model.width={width} must be a multiple of model.heads={heads}")
        self.pad_id, self.pooling = shape.pad_id, pooling
        self.tokens = nn.Embedding(shape.vocab_size, width)
        self.positions = nn.Embedding(shape.max_length, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(width, shape.outputs))
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        held = held_tokens(ids, mask, self.pad_id)
        at = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(at)
        x = self.norm(self.encoder(x, src_key_padding_mask=~held))
        return self.head(pooled(x, held, self.pooling))


@checked("model", dim=POSITIVE_INT, hidden=NON_NEGATIVE_INT, dropout=DROPOUT)
def text_bag(
    input_shape: Sequence[int],
    num_classes: int,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    dim: int = 128,
    hidden: int = 0,
    dropout: float = 0.5,
    bigram_buckets: int = 0,
) -> TextBag:
    """conf/model/text_bag.yaml."""
    shape = TextShape.of(input_shape, num_classes, vocab_size, pad_id, "text_bag")
    if not (isinstance(bigram_buckets, int) and 0 <= bigram_buckets <= 2**22):
        raise UserError(f"model.bigram_buckets={bigram_buckets!r} must be 0 (off) to 4,194,304")
    return TextBag(shape, dim, hidden, dropout, bigram_buckets)


@checked(
    "model",
    width=POSITIVE_INT,
    layers=POSITIVE_INT,
    heads=POSITIVE_INT,
    dropout=DROPOUT,
    pooling=one_of("mean", "cls"),
)
def text_transformer(
    input_shape: Sequence[int],
    num_classes: int,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    width: int = 256,
    layers: int = 4,
    heads: int = 4,
    dropout: float = 0.1,
    pooling: str = "mean",
) -> TextTransformer:
    """conf/model/text_transformer.yaml."""
    shape = TextShape.of(input_shape, num_classes, vocab_size, pad_id, "text_transformer")
    return TextTransformer(shape, width, layers, heads, dropout, pooling)


HF_EXTRA = 'pip install -e ".[hf]"'
# model=hf's encoder families: bidirectional, with a [CLS]-style first token.
ENCODERS = (
    "albert",
    "bert",
    "camembert",
    "deberta",
    "deberta-v2",
    "distilbert",
    "electra",
    "modernbert",
    "mpnet",
    "roberta",
    "xlm-roberta",
)
MAX_CONFIG_BYTES = 2**20  # a config.json is a few kB
# Keys of a config.json that are never taken: where it came from, what to import or download,
# which attention kernel or quantizer to load (a hub name would fetch and run code), its dtype.
DROPPED = (
    "architectures",
    "attn_implementation",
    "auto_map",
    "dtype",
    "kernel_config",
    "quantization_config",
    "torch_dtype",
    "transformers_version",
    "trust_remote_code",
    "use_kernels",
)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise UserError(f"model=hf needs Hugging Face transformers: {HF_EXTRA}") from None
    transformers.utils.logging.set_verbosity_error()  # its loading bar and notes stay out
    transformers.utils.logging.disable_progress_bar()
    return transformers


def read_architecture(path: str) -> dict:
    """``path``'s ``config.json``, read as data and cleaned: what a run records to rebuild the
    encoder without the folder."""
    file = Path(path).expanduser() / "config.json"
    try:
        if file.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"model.path={path}: {file} is over 1 MB; is it a config.json?")
        parsed = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        why = getattr(error, "strerror", None) or "not a JSON file"
        raise UserError(
            f"model.path={path}: cannot read {file}: {why}; give a folder written by "
            "save_pretrained (config.json, model.safetensors, tokenizer.json)"
        ) from None
    return cleaned(parsed, f"model.path={path}")


def cleaned(parsed: Any, where: str) -> dict:
    """An encoder's configuration as data: a mapping of plain values whose ``model_type`` is
    one of :data:`ENCODERS`, without the keys in :data:`DROPPED` or private ones."""
    if not isinstance(parsed, dict) or parsed.get("model_type") not in ENCODERS:
        found = parsed.get("model_type") if isinstance(parsed, dict) else None
        raise UserError(
            f"{where}: model_type={found!r} is not an encoder model=hf builds "
            f"({', '.join(ENCODERS)})"
        )
    plain = (str, int, float, bool, type(None))
    return {
        key: value
        for key, value in parsed.items()
        if isinstance(key, str)
        and not key.startswith("_")
        and key not in DROPPED
        and (
            isinstance(value, plain)
            or (isinstance(value, list) and all(isinstance(v, plain) for v in value))
            or (isinstance(value, dict) and all(isinstance(v, plain) for v in value.values()))
        )
    }


class HfEncoder(nn.Module):
    """The encoder → its last hidden states pooled (first token or mean) → dropout → a linear
    head. Takes ``(ids, mask)`` as every text model does."""

    def __init__(self, encoder: nn.Module, pad_id: int, outputs: int, dropout: float, pooling: str):
        super().__init__()
        self.encoder, self.pad_id, self.pooling = encoder, pad_id, pooling
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # BERT's own pooler is not used: no parameter left untrained
        width = encoder.config.hidden_size
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(width, outputs))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        held = held_tokens(ids, mask, self.pad_id)
        hidden = self.encoder(input_ids=ids, attention_mask=held.long(), return_dict=True)
        hidden = hidden.last_hidden_state  # return_dict: whatever the stored config says
        return self.head(pooled(hidden, held, self.pooling))

    def layer_groups(self) -> list[tuple[str, Any]]:
        """The embeddings (and whatever comes before the first layer), each encoder layer (the
        longest ``ModuleList``), then the head with whatever follows the last layer (a final
        norm): optim.layer_decay's layers, from the input."""
        lists = [m for m in self.encoder.modules() if isinstance(m, nn.ModuleList)]
        blocks = list(max(lists, key=len)) if lists else []
        inside = {id(p) for block in blocks for p in block.parameters()}
        before, after, seen_block = [], [], False
        for parameter in self.encoder.parameters():
            if id(parameter) in inside:
                seen_block = True
            else:
                (after if seen_block else before).append(parameter)
        layers = [(f"layer.{i}", block) for i, block in enumerate(blocks)]
        return [("embeddings", before), *layers, ("head", [*after, *self.head.parameters()])]


@checked("model", dropout=DROPOUT, pooling=one_of("cls", "mean"))
def hf_model(
    input_shape: Sequence[int],
    num_classes: int,
    path: str | None,
    architecture: dict | None = None,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    pad_id: int | None = None,
    pooling: str = "cls",
    dropout: float = 0.1,
) -> HfEncoder:
    """conf/model/hf.yaml. ``path``: the folder the encoder's weights are read from (None when
    rebuilt from a checkpoint, whose weights replace them); ``architecture``: its recorded
    config.json (read from ``path`` when not given); ``tokenizer``: what data.tokenizer
    follows (the model reads nothing from it)."""
    if vocab_size is None or len(input_shape) != 1:
        raise UserError(
            f"model=hf takes texts (data=text: token ids [L]), and the data gives samples of "
            f"shape {list(input_shape)}; use data=text"
        )
    if architecture is None and path is None:
        raise UserError("model.path=??? : give the folder save_pretrained wrote")
    if isinstance(architecture, DictConfig):  # as Hydra passes a mapping
        architecture = OmegaConf.to_container(architecture)
    where = f"model.path={path}" if architecture is None else "model.architecture"
    config = config_of(architecture if architecture is not None else read_architecture(path), where)
    _check_fit(config, input_shape[0], vocab_size)
    encoder = _encoder(config, path)
    return HfEncoder(encoder, pad_id or 0, num_classes, dropout, pooling)


def config_of(recorded: Any, where: str) -> Any:
    """The transformers configuration a recorded (or stored: untrusted) architecture
    describes, cleaned again and with PyTorch's own attention."""
    values = dict(cleaned(recorded, where))
    model_type = values.pop("model_type")
    try:
        config = _transformers().AutoConfig.for_model(model_type, **values)
    except Exception as error:  # transformers' own validation: one line, the first of it
        raise UserError(f"{where}: not a {model_type} configuration: {first_line(error)}") from None
    config._attn_implementation = "sdpa"
    return config


def _check_fit(config: Any, length: int, vocab_size: int) -> None:
    """The texts' ids and lengths fit the encoder's embeddings, or one line saying which."""
    if vocab_size > config.vocab_size:
        raise UserError(
            f"the tokenizer has {vocab_size:,} tokens and the encoder embeds "
            f"{config.vocab_size:,}: tokenize with the model's own tokenizer (leave "
            "data.tokenizer to follow model.tokenizer)"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and length > positions:
        raise UserError(
            f"data.max_length={length} is more than the encoder's {positions} positions; "
            f"set data.max_length={positions} or less"
        )


def _encoder(config: Any, path: str | None) -> nn.Module:
    """The encoder: with the weights in ``path``'s ``model.safetensors``, or fresh (rebuilt from
    a checkpoint, whose weights come next)."""
    auto = _transformers().AutoModel
    if path is None:
        try:  # a stored architecture: transformers' own refusal (a pad id past the vocabulary)
            return auto.from_config(config, attn_implementation="sdpa")
        except UserError:
            raise
        except Exception as error:
            raise UserError(
                f"model.architecture: the encoder cannot be built: {first_line(error)}"
            ) from None
    folder = Path(path).expanduser()
    if not any(folder.glob("model*.safetensors")):
        raise UserError(
            f"model.path={path}: no model.safetensors there (weights are read as safetensors "
            "only; convert a pytorch_model.bin with save_pretrained(..., "
            "safe_serialization=True))"
        )
    try:
        encoder, loading = auto.from_pretrained(
            str(folder),
            config=config,
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            attn_implementation="sdpa",
            output_loading_info=True,
        )
    except Exception as error:  # whatever transformers raises on a folder it cannot load
        raise UserError(
            f"model.path={path}: its weights do not load: {first_line(error)}"
        ) from None
    # transformers starts what the file lacks from random values, its notice silenced: an
    # encoder fine-tuned from random weights without a word. BERT's pooler is not used
    # (HfEncoder drops it), so a folder saved without it is whole.
    missing = sorted(k for k in loading.get("missing_keys", ()) if not k.startswith("pooler."))
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise UserError(
            f"model.path={path}: its weights lack {len(missing)} of the encoder's tensors "
            f"({shown}), which would start from random values; save the whole encoder with "
            "save_pretrained, or give the folder it came from"
        )
    return encoder
