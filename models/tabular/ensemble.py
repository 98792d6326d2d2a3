"""k members sharing one MLP (TabM-mini): each scales the MLP's input by its own vector and
has its own output layer, the k run as one batched forward."""

from __future__ import annotations

import torch
from torch import nn

from models.tabular.numbers import PeriodicEmbedding


class MemberScale(nn.Module):
    """The k members' scaling of the MLP's input, [N, D] (or each member's own rows,
    [N, k, D]) → [N, k, D] (random signs at the start, TabM's; one member: ones, a plain
    MLP). ``own_rows``: in training each member takes rows of its own (share_batches=false)."""

    def __init__(self, members: int, width: int, own_rows: bool = False) -> None:
        super().__init__()
        self.own_rows = own_rows and members > 1
        signs = torch.randint(0, 2, (members, width)) * 2.0 - 1
        self.weight = nn.Parameter(signs if members > 1 else torch.ones(1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x if x.dim() == 3 else x[:, None, :]) * self.weight


class EnsembleMLP(nn.Module):
    """``preprocess`` → ``embed`` (of all features but the last ``plain``, which join its output
    as they are) → the k ``members``' copies of the input through one shared ``backbone`` MLP
    (Linear, ReLU, Dropout) at once → k output layers. It takes rows [N, F], or in training
    each member's own rows [N, k, F] (``batch_members``: k then, 1 when they share batches)."""

    def __init__(
        self,
        preprocess: nn.Module,
        embed: nn.Module,
        members: MemberScale,
        backbone: nn.Sequential,
        outputs: int,
        plain: int = 0,
    ) -> None:
        super().__init__()
        self.preprocess, self.embed, self.plain = preprocess, embed, plain
        self.member_scale, self.backbone = members, backbone
        self.members, width = members.weight.shape
        self.batch_members = self.members if members.own_rows else 1  # what the batches draw
        for layer in backbone:  # the last hidden layer's width, or the input's without one
            width = layer.out_features if isinstance(layer, nn.Linear) else width
        bound = width**-0.5
        shape = (self.members, width, outputs)
        self.head_weight = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.head_bias = nn.Parameter(torch.empty(self.members, outputs).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(x)
        if self.plain:  # the 0/1 columns after the numbers, as they are
            numbers = x.shape[-1] - self.plain
            x = torch.cat([self.embed(x[..., :numbers]), x[..., numbers:]], dim=-1)
        else:
            x = self.embed(x)
        x = self.member_scale(x)  # [N, k, D]: the members' copies, or their own rows
        x = self.backbone(x)  # the k copies through the one MLP
        out = torch.einsum("nkd,kdo->nko", x, self.head_weight) + self.head_bias
        return out if self.training else out.mean(dim=1)

    def describe(self) -> str:
        """One line: its parts (said at start-up by model=auto)."""
        widths = "-".join(str(m.out_features) for m in self.backbone if isinstance(m, nn.Linear))
        embedding = type(self.embed).__name__.removesuffix("Embedding").lower()
        embedding = "no" if embedding == "identity" else embedding
        scaling = getattr(self.preprocess, "said", "")
        start = ""
        if isinstance(self.embed, PeriodicEmbedding):
            start = f", frequencies from N(0, {self.embed.scale:g})"
        plain = f", {self.plain} 0/1 columns as they are" if self.plain else ""
        own = ", each on batches of its own" if self.batch_members > 1 else ""
        rows = getattr(self, "train_rows", None)
        fitted = f"; fitted to {rows:,} training rows" if rows is not None else ""
        return (
            f"{scaling}{embedding} embeddings{plain}, {self.members} members sharing a "
            f"{widths or 'linear'} MLP{own}{start}{fitted}"
        )
