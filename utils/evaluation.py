"""Evaluating a model on a split: loss, top-1 and top-5 accuracy."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from utils.precision import Precision


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    precision: Precision,
    num_classes: int,
) -> dict[str, float]:
    """Mean loss and accuracy over every sample of ``batches``, in eval mode.

    Sums stay on the device; there is one host synchronisation, at the end.
    """
    was_training = model.training
    model.eval()
    top_k = 5 if num_classes > 5 else 1
    sums, count = None, 0  # [loss, top-1 hits, top-k hits], summed on the device
    for images, labels in batches:
        with precision.autocast():
            logits = model(images)
        hits = logits.topk(top_k, dim=1).indices == labels[:, None]
        batch_sums = torch.stack(
            [
                F.cross_entropy(logits.float(), labels, reduction="sum"),
                hits[:, 0].sum().float(),
                hits.any(dim=1).sum().float(),
            ]
        )
        sums = batch_sums if sums is None else sums + batch_sums
        count += len(labels)
    model.train(was_training)
    if sums is None:
        return {}
    loss, acc, acc_top_k = (sums / count).tolist()
    metrics = {"loss": loss, "acc": acc}
    if top_k == 5:
        metrics["acc_top5"] = acc_top_k
    return metrics
