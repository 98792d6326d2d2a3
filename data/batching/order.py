"""Which sample comes next: the one owner of the data order, for every kind, as a pure function
of (seed, epoch, the data's sizes), so that a resume (on any number of workers, or on another
world size with the same global batch) continues the same stream.

- Data held whole (tensors, the image cache): a permutation of every sample an epoch.
- An ensemble's members training on batches of their own (``model.share_batches=false``, data
  held whole): one permutation per member, the first the shared one (:func:`member_orders`).
- Shards (data=parquet): the row groups permuted, then the samples shuffled within each window
  of ``data.shuffle_window`` consecutive row groups of that permutation (a block shuffle: a
  window's row groups are read once, together). A window of every row group is the full
  shuffle.
- A token stream (data=corpus): each pass over it starts at an offset drawn in [0, T), and its
  windows of T tokens are permuted (:func:`window_order`).

Each process takes its rows of every global batch (data/batching/batches.py batch_bounds), so
the stream of global batches does not depend on how many processes share it.
"""

from __future__ import annotations

import torch

from utils.system.seeding import mix_seed

WINDOW_SALT = 7  # the within-window shuffles draw from another stream than the row groups' order


def permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(mix_seed(seed, epoch))
    return torch.randperm(n, generator=generator)


MEMBER_SALT = 13  # each further member's order draws from a stream of its own


def member_orders(n: int, seed: int, epoch: int, members: int) -> torch.Tensor:
    """[members, n]: each member's permutation of ``epoch`` (TabM's independent batches:
    ``share_training_batches=False``), member 0's the one every other run draws
    (:func:`permutation`), so one member is the shared order itself."""
    orders = [permutation(n, seed, epoch)]
    for member in range(1, members):
        generator = torch.Generator().manual_seed(mix_seed(seed, epoch, MEMBER_SALT, member))
        orders.append(torch.randperm(n, generator=generator))
    return torch.stack(orders)


def repeated(order: torch.Tensor, repeats: int) -> torch.Tensor:
    """``data.augment.repeats`` (repeated augmentation, Hoffer et al. 2020; timm's
    RepeatAugSampler): each sample of the epoch's ``order`` ``repeats`` times in a row — so its
    copies fall in one global batch, on different processes — cut to the epoch's length. Each
    copy is a slot ``id + n·r`` (``r``: which copy), so each draws its own augmentation; the
    sample is ``slot % n``."""
    if repeats == 1:
        return order
    n = len(order)
    copies = torch.arange(repeats, device=order.device).view(1, -1) * n
    return (order.view(-1, 1) + copies).reshape(-1)[:n]


def block_order(sizes: list[int], seed: int, epoch: int, window: int) -> torch.Tensor:
    """Global sample ids (row groups numbered in file order, their rows counted on from the
    group before) in the order of ``epoch``: the groups of ``sizes`` permuted by (seed, epoch),
    then the samples of each ``window`` consecutive groups of that permutation shuffled."""
    starts = torch.tensor([0, *sizes]).cumsum(0)
    groups = permutation(len(sizes), seed, epoch)
    generator = torch.Generator().manual_seed(mix_seed(seed, epoch, WINDOW_SALT))
    parts = []
    for lo in range(0, len(sizes), max(1, window)):
        ids = torch.cat([torch.arange(starts[g], starts[g + 1]) for g in groups[lo : lo + window]])
        parts.append(ids[torch.randperm(len(ids), generator=generator)])
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


BUCKET_SALT = 11  # the bucketed batches' order draws from a stream of its own
BUCKET_BATCHES = 64  # texts are sorted by length within windows of this many global batches


def bucketed(order: torch.Tensor, lengths: torch.Tensor, batch: int, seed: int, epoch: int):
    """Texts of similar lengths in each global ``batch`` (less padding), still a pure function
    of (seed, epoch): the epoch's ``order`` cut into windows of :data:`BUCKET_BATCHES` global
    batches, each window sorted by length (stably) and cut into batches, and the whole batches
    shuffled by (seed, epoch); the partial batch, if any, stays last (BatchPlan keeps or drops
    it). Returns the new order of the same samples."""
    n = len(order)
    window = batch * BUCKET_BATCHES
    sorted_parts = []
    for lo in range(0, n, window):
        part = order[lo : lo + window]
        sorted_parts.append(part[torch.sort(lengths[part], stable=True).indices])
    ordered = torch.cat(sorted_parts) if sorted_parts else order
    whole = n // batch
    generator = torch.Generator().manual_seed(mix_seed(seed, epoch, BUCKET_SALT))
    batches = ordered[: whole * batch].view(whole, batch)[
        torch.randperm(whole, generator=generator)
    ]
    return torch.cat([batches.reshape(-1), ordered[whole * batch :]])


RANDOM_WINDOWS_SALT = 17  # data.windows=random draws from a stream of its own


def random_windows(windows: int, starts: int, seed: int, data_pass: int) -> torch.Tensor:
    """Where each of the ``windows`` windows of "pass" ``data_pass`` starts when windows are
    drawn anywhere (``data.windows=random``): ``windows`` starts in [0, ``starts``), drawn with
    replacement, a pure function of (seed, pass) as :func:`window_order` is."""
    generator = torch.Generator().manual_seed(mix_seed(seed, data_pass, RANDOM_WINDOWS_SALT))
    return torch.randint(starts, (windows,), generator=generator)


def window_order(windows: int, window: int, seed: int, data_pass: int) -> torch.Tensor:
    """Where each of the ``windows`` windows of ``window`` tokens of pass ``data_pass`` over a
    token stream starts, in the order they are read: an offset in [0, window) drawn for the
    pass, then the windows from there permuted (data/corpus/stream.py)."""
    generator = torch.Generator().manual_seed(mix_seed(seed, data_pass))
    offset = int(torch.randint(window, (1,), generator=generator))
    return offset + torch.randperm(windows, generator=generator) * window
