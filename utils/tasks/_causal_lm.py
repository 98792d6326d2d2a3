"""``task=causal_lm``: predict each next token of a stream (data=corpus, model=gpt).

The loss is the cross-entropy over the vocabulary at every position, in nats per token; the
figures are ``loss``, ``ppl`` (e to the loss) and, where one token is one character or one
byte (``data.tokenizer=char`` or ``byte``), ``bpc`` or ``bpb`` (the loss in bits). They are
sums over every predicted token of the split, divided once, so a split cut into batches of
any size, by any number of processes, gives the same figure.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from utils.errors import UserError
from utils.evaluation.sampling import generated
from utils.system.distributed import all_sum
from utils.tasks._base import Task

BITS = {"character": "bpc", "byte": "bpb"}  # the figure in bits, by what a token is


class CausalLM(Task):
    targets = "next_tokens"
    name = "causal_lm"
    unit = "tokens"
    outputs = "next-token scores over the vocabulary, at every position"
    monitor = "val/loss"
    mixes = False
    distills = False
    # A language model's outputs are logits over a vocabulary at each position: the guards
    # for a classifier's probabilities and one sample's BatchNorm do not apply.
    quiet_guards = ("probability_outputs",)
    simple_models = None
    shows_evidence = False  # [N, T, V] logits: its report is the loss curve and sampled text
    token_unit: str | None = None

    def fitted(self, data: Any, device: torch.device, stored: Any = None) -> CausalLM:
        fitted = super().fitted(data, device, stored)
        fitted.token_unit = getattr(data.inputs, "token_unit", None)
        return fitted

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """[positions, vocabulary]: a score for every token at every position."""
        return (*input_shape, self.count)

    def measured(self) -> list[str]:
        return ["loss", "ppl", *([BITS[self.token_unit]] if self.token_unit in BITS else [])]

    def scores(self, detailed: bool = False) -> TokenScores:
        return TokenScores(BITS.get(self.token_unit or ""))

    def loss(self) -> NextTokenLoss:
        return NextTokenLoss()

    def training_loss(self) -> NextTokenLoss:
        """The loss itself: logits [B, T, V] are positions, not an ensemble's members, so
        they never go through the members' loss (utils/tasks/_base.py MembersLoss)."""
        return self.loss()

    def nll(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        return float(F.cross_entropy(logits.flatten(0, -2), targets.flatten()))

    def sampled(self, model: Any, inputs: Any, tokens: int = 300) -> dict[str, Any]:
        """What the report shows of a language model: ``tokens`` it writes after a new line
        (its first token where the vocabulary has no new line), at temperature 0.8 among the
        200 likeliest, seeded: the same weights write the same text."""
        try:
            prompt = inputs.prompt_ids("\n", "the report's prompt")
        except UserError:
            prompt = torch.zeros(1, dtype=torch.long)
        device = next(model.parameters()).device
        options = SimpleNamespace(max_new_tokens=tokens, temperature=0.8, top_k=200, seed=0)
        generator = torch.Generator(device=device).manual_seed(0)
        block = int(getattr(model, "block_size", 0) or self.data.input_shape[-1])
        new = generated(model, prompt.to(device), options, generator, block)
        return {"sampled": [inputs.text_of(prompt.tolist() + new)]}

    def shown_targets(self, targets: torch.Tensor) -> list[str]:
        return [str(t[-1]) for t in targets.tolist()]

    def tables(self, out: Any, where: tuple[str, int | None], metrics: dict, split: str) -> dict:
        title = where[0]
        out.print(f"{title}: " + ", ".join(f"{split}/{k} {v:.4f}" for k, v in metrics.items()))
        return metrics

    def decode(self, outputs: torch.Tensor, options: Any) -> tuple[list[str], list, list[str]]:
        raise UserError(
            'a language model continues a prompt: predict.py prompt="..." (or prompts=FILE)'
        )

    def calibrate(self, *args: Any, **kwargs: Any) -> Any:
        raise UserError("calibrate= applies to classifiers; a language model has no threshold")


class NextTokenLoss:
    """Cross-entropy of logits [B, T, V] against the next tokens [B, T], mean over tokens."""

    tokens = True  # the loop logs train/tokens_per_second

    def training_note(self, mixing: Any) -> str | None:
        return None

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, -2), targets.reshape(-1))


class TokenScores:
    """Sums of the next-token loss (nats) and of the tokens predicted, over a whole split and
    every process; ``bits``: the name of the figure in bits per character or byte, if any."""

    def __init__(self, bits: str | None) -> None:
        self.bits = bits
        self.nats = torch.zeros((), dtype=torch.float64)
        self.tokens = 0

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        loss = F.cross_entropy(logits.flatten(0, -2), targets.reshape(-1), reduction="sum")
        self.nats = self.nats.to(loss.device) + loss.double()
        self.tokens += targets.numel()

    def result(self, device: torch.device) -> dict:
        nats = float(all_sum(self.nats.to(device)))
        tokens = int(all_sum(torch.tensor(self.tokens, device=device)).item())
        if tokens == 0:
            return {}
        loss = nats / tokens
        metrics = {"loss": loss, "ppl": math.exp(min(loss, 700.0))}
        if self.bits:
            metrics[self.bits] = loss / math.log(2)
        return metrics
