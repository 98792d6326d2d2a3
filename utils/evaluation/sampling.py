"""How a language model continues a prompt (``predict.py prompt="ROMEO:"``).

Token by token: the logits of the last position, divided by ``temperature`` (0: the most
likely token each time), cut to the ``top_k`` most likely, and one token drawn from their
softmax by a generator seeded with ``seed`` alone, so the same checkpoint, prompt and seed give
the same text. A model with a ``new_cache()`` (models/gpt.py) keeps each layer's keys
and values, so a token costs one position's work; once the text outgrows the model's context,
each step reads the last ``block_size`` tokens again, as training's windows held them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from utils.errors import UserError


def continued(
    model: nn.Module,
    record: Any,
    prompts: Sequence[str],
    options: Any,
    device: torch.device,
    where: str,
) -> list[str]:
    """Each of ``prompts`` followed by ``options.max_new_tokens`` tokens of ``model``, as text.
    ``record``: the checkpoint's inputs record, whose kind of input turns text into ids and
    back, and whose window is the context when the model names no ``block_size``."""
    inputs = record.inputs
    if not hasattr(inputs, "prompt_ids"):
        raise UserError(
            f"ckpt={where}: its model is not a language model (it takes {inputs.name}); "
            "predict on inputs with input=..., or give a task=causal_lm checkpoint"
        )
    check_options(options)
    block_size = int(getattr(model, "block_size", 0) or record.input_shape[-1])
    texts = []
    for number, prompt in enumerate(prompts, start=1):
        name = "prompt" if len(prompts) == 1 else f"prompt {number}"
        ids = inputs.prompt_ids(prompt, name).to(device)
        generator = torch.Generator(device=device).manual_seed(int(options.seed))
        new = generated(model, ids, options, generator, block_size)
        texts.append(prompt + inputs.text_of(new))
    return texts


def check_options(options: Any) -> None:
    numbers = {
        "max_new_tokens": (options.max_new_tokens, 1),
        "top_k": (options.top_k, 1),
    }
    for key, (value, least) in numbers.items():
        if value is not None and (not isinstance(value, int) or value < least):
            raise UserError(f"{key}={value!r} must be a whole number of at least {least}")
    if not isinstance(options.temperature, int | float) or options.temperature < 0:
        raise UserError(
            f"temperature={options.temperature!r} must be 0 (the likeliest token) or more"
        )


@torch.inference_mode()
def generated(
    model: nn.Module,
    ids: torch.Tensor,
    options: Any,
    generator: torch.Generator,
    block_size: int,
) -> list[int]:
    """The ids ``model`` adds after ``ids`` [P] (module docstring)."""
    model.eval()
    cache = model.new_cache() if hasattr(model, "new_cache") else None
    text = ids.tolist()
    window = torch.tensor(text[-block_size:], device=ids.device)[None]
    new: list[int] = []
    for _ in range(int(options.max_new_tokens)):
        if cache is not None and len(text) <= block_size:
            logits = model(window, cache) if not new else model(window[:, -1:], cache)
        else:
            logits = model(window)
        token = _drawn(logits[0, -1].float(), options, generator)
        new.append(token)
        text.append(token)
        window = torch.tensor(text[-block_size:], device=ids.device)[None]
    return new


def _drawn(logits: torch.Tensor, options: Any, generator: torch.Generator) -> int:
    if options.temperature == 0:
        return int(logits.argmax())
    logits = logits / options.temperature
    if options.top_k is not None and options.top_k < logits.numel():
        cut = torch.topk(logits, options.top_k).values[-1]
        logits = logits.masked_fill(logits < cut, float("-inf"))
    probabilities = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))
