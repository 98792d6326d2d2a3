"""A local Hugging Face encoder (``model=hf``): a folder's config and weights read as untrusted
data, checked to fit the data's tokens, with a new head on its first token."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from models.text.layers import held_tokens, pooled
from utils.config.arguments import DROPOUT, checked, one_of
from utils.errors import UserError
from utils.text import first_line

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
