"""Evaluating a model on a split: loss, top-1 and top-5 accuracy."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from utils.distributed import all_sum
from utils.precision import Precision

TOP5 = "acc_top5"


def measured_metrics(num_classes: int) -> list[str]:
    """What :func:`evaluate` measures for ``num_classes`` classes: top-5 accuracy only when
    there are more than 5."""
    return ["loss", "acc"] + ([TOP5] if num_classes > 5 else [])


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    precision: Precision,
    num_classes: int,
    confusion: bool = False,
) -> dict:
    """Mean loss and accuracy over every sample of ``batches``, in eval mode; with
    ``confusion``, also the confusion matrix (rows: true class, columns: predicted).

    Sums stay on the device; there is one host synchronisation, at the end. Under torchrun each
    process evaluates its shard and the sums are added across processes, so every process
    gets the figures of the whole split.
    """
    was_training = model.training
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    top_k = 5 if TOP5 in measured_metrics(num_classes) else 1
    sums, count = None, 0  # [loss, top-1 hits, top-k hits], summed on the device
    counts = None  # confusion counts, flattened
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
        if confusion:
            pairs = labels * num_classes + logits.argmax(dim=1)
            batch_counts = torch.bincount(pairs, minlength=num_classes * num_classes)
            counts = batch_counts if counts is None else counts + batch_counts
        count += len(labels)
    model.train(was_training)
    if sums is None:  # this process's shard was empty; the others' still count
        sums = torch.zeros(3, device=device)
        counts = torch.zeros(num_classes * num_classes, dtype=torch.long, device=device)
    device = sums.device
    count = int(all_sum(torch.tensor(count, device=device)).item())
    if count == 0:
        return {}
    loss, acc, acc_top_k = (all_sum(sums) / count).tolist()
    metrics = {"loss": loss, "acc": acc}
    if top_k == 5:
        metrics[TOP5] = acc_top_k
    if confusion:
        metrics["confusion"] = all_sum(counts).view(num_classes, num_classes).cpu()
    return metrics


def per_class_scores(confusion: torch.Tensor) -> dict[str, list[float]]:
    """Precision, recall and F1 of each class from a confusion matrix (rows: true class).
    A class never predicted (or never present) scores 0 rather than dividing by zero."""
    confusion = confusion.double()
    hits = confusion.diagonal()
    precision = hits / confusion.sum(dim=0).clamp(min=1)
    recall = hits / confusion.sum(dim=1).clamp(min=1)
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    return {"precision": precision.tolist(), "recall": recall.tolist(), "f1": f1.tolist()}
