"""Which samples a run validates on: the seeded hold-out of val and test, and k-fold
cross-validation (``data.split.folds``, ``fold``, ``stratify``, ``group``).

    python train.py data=csv data.path=t.csv data.target=y data.split.folds=5 data.split.fold=2
    python train.py -m data.split.fold='range(5)' data.split.folds=5     # a sweep over folds
    python train.py cv=5                                                  # all five in one job

The test split is held out first, by the same seeded permutation as without folds, so it is
the same for every fold (and for the run without folds). What is left (train ∪ val) is dealt
into ``folds`` parts: fold ``k`` validates on part ``k`` and trains on the others.

- ``stratify``: ``auto`` (on for class labels, off for label sets and values), true or false.
  Stratified folds deal each class's samples round the folds in a seeded order, so every fold
  holds each class within one sample of its share.
- ``group``: a column (data=csv, data=image_csv) whose value ties samples together (a patient, a
  photo session): a group is never in two folds, nor in test and another split. Groups are
  placed largest first into the fold holding the fewest samples so far (ties in a seeded order).

The folds depend on ``data.split.seed`` alone (data=digits: ``split_seed``), never on the
training seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from data.batching.splits import TensorSplit, fill_splits
from utils.errors import UserError

STRATIFY = ("auto", True, False)


@dataclass(frozen=True)
class FoldPlan:
    """``data.split``'s fold keys, checked: ``folds`` (None: no cross-validation), ``fold``,
    ``stratify`` (resolved for the kind of targets), ``group`` (a column name or None) and the
    hold-out ``seed``."""

    folds: int | None
    fold: int
    stratify: bool
    group: str | None
    seed: int

    @classmethod
    def of(
        cls, split: Mapping[str, Any] | None, classes: bool, seed: int, groups_allowed: bool = False
    ) -> FoldPlan:
        """The plan of a ``data.split`` node (None or a node without fold keys: no folds);
        ``classes``: the targets are class labels (else label sets or values, which are not
        stratified); ``groups_allowed``: the data has columns."""
        split = split or {}
        folds, fold = split.get("folds"), split.get("fold", 0)
        stratify, group = split.get("stratify", "auto"), split.get("group")
        whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        if folds is not None and not (whole(folds) and folds >= 2):
            raise UserError(
                f"data.split.folds={folds} must be a whole number, 2 or more (or "
                "null: no cross-validation)"
            )
        if not whole(fold) or fold < 0 or (folds is not None and fold >= folds):
            upper = f"0 to {folds - 1}" if folds else "0 (no data.split.folds)"
            raise UserError(f"data.split.fold={fold} must be a whole number from {upper}")
        if folds is None and fold:
            raise UserError(
                f"data.split.fold={fold} needs data.split.folds=K (the number of folds)"
            )
        if stratify not in STRATIFY:
            raise UserError(f"data.split.stratify={stratify!r} must be auto, true or false")
        if group is not None and not (isinstance(group, str) and group):
            raise UserError(f"data.split.group={group!r} must be a column name or null")
        if group is not None and not groups_allowed:
            raise UserError(
                "data.split.group names a column, and this data has none; it is "
                "for data=csv and data=image_csv"
            )
        if stratify is True and not classes:
            raise UserError(
                "data.split.stratify=true needs class labels, and these targets "
                "are label sets or values; set data.split.stratify=auto"
            )
        if stratify is True and group is not None:
            raise UserError(
                "data.split.stratify=true and data.split.group together are not "
                "supported: groups are kept whole, unstratified; set stratify=auto"
            )
        on = classes and group is None if stratify == "auto" else bool(stratify)
        return cls(folds, fold, on, group, seed)

    def held_out(
        self, count: int, sizes: Sequence[int], groups: Sequence[Any] | None = None
    ) -> list[torch.Tensor]:
        """Indices of ``count`` samples cut into parts of ``sizes`` (the rest first), by the
        seeded permutation of :func:`data.batching.splits.holdout`; with ``groups``, whole groups,
        each part taking groups until it holds its size."""
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.seed))
        rest = count - sum(sizes)
        if rest <= 0 or min(sizes, default=1) <= 0:
            raise UserError(f"cannot hold out {list(sizes)} samples from a split of {count}")
        if groups is None:
            bounds = [0, rest, *(rest + sum(sizes[: i + 1]) for i in range(len(sizes)))]
            return [order[lo:hi] for lo, hi in pairwise(bounds)]
        members = _members(groups, order)
        parts: list[list[int]] = [[] for _ in sizes]
        names = list(members)
        for index, size in reversed(list(enumerate(sizes))):  # test first, from the end
            while len(parts[index]) < size and len(names) > 1:
                parts[index] += members.pop(names.pop())
        left = sorted(i for name in names for i in members[name])
        if not left or any(not part for part in parts):
            raise UserError(
                f"data.split.group={self.group}: {len(set(groups))} groups are too "
                f"few to hold out {list(sizes)} samples whole"
            )
        return [torch.tensor(left)] + [torch.tensor(sorted(part)) for part in parts]

    def parts(
        self,
        count: int,
        sizes: Mapping[str, int],
        labels: Sequence[Any] | None = None,
        groups: Sequence[Any] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Indices of ``count`` samples by split: the held-out ``sizes`` by name (of whole
        ``groups`` when given), then, with folds, fold :attr:`fold` of the rest as ``val``
        (stratified by ``labels``) and the others as ``train``."""
        rest, *held = self.held_out(count, list(sizes.values()), groups)
        parts = dict(zip(sizes, held, strict=True))
        if self.folds is not None:
            pool = None
            if self.stratify and labels is not None:
                pool = (
                    labels[rest]
                    if isinstance(labels, torch.Tensor)
                    else [labels[i] for i in rest.tolist()]
                )
            pool_groups = None if groups is None else [groups[i] for i in rest.tolist()]
            rest, parts["val"] = self.cut(rest, pool, pool_groups)
        return {"train": rest, **parts}

    def cut(
        self, pool: torch.Tensor, labels: Sequence[Any] | None, groups: Sequence[Any] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(train, val) indices of fold :attr:`fold`, out of the ``pool`` indices (train ∪
        val); ``labels`` and ``groups`` are those of the pool's samples, in pool order."""
        assigned = self.assign(len(pool), labels, groups)
        return pool[assigned != self.fold], pool[assigned == self.fold]

    def assign(
        self, count: int, labels: Sequence[Any] | None, groups: Sequence[Any] | None = None
    ) -> torch.Tensor:
        """The fold of each of ``count`` samples: stratified by ``labels`` when :attr:`stratify`,
        whole ``groups`` when given, else a seeded deal."""
        assert self.folds is not None
        if count < self.folds:  # before anything of the folds' size is allocated
            raise UserError(f"data.split.folds={self.folds}: only {count} samples to deal")
        if groups is not None and len(set(groups)) < self.folds:
            raise UserError(
                f"data.split.group={self.group}: {len(set(groups))} groups are too "
                f"few for {self.folds} folds"
            )
        generator = torch.Generator().manual_seed(self.seed + 1)  # not the hold-out's order
        order = torch.randperm(count, generator=generator)
        fold = torch.empty(count, dtype=torch.long)
        if groups is not None:
            members = _members(groups, order)
            sizes = [0] * self.folds
            for name in sorted(members, key=lambda n: -len(members[n])):  # stable: seeded ties
                smallest = min(range(self.folds), key=lambda f: (sizes[f], f))
                fold[members[name]] = smallest
                sizes[smallest] += len(members[name])
            if min(sizes) == 0:
                raise UserError(
                    f"data.split.group={self.group}: {len(members)} groups are too "
                    f"few for {self.folds} folds"
                )
            return fold
        if self.stratify and labels is not None:
            by_class: dict[Any, list[int]] = {}
            for i in order.tolist():
                by_class.setdefault(_key(labels[i]), []).append(i)
            dealt = 0  # continues across classes, so the folds' sizes differ by at most one
            for key in sorted(by_class, key=str):
                for i in by_class[key]:
                    fold[i] = dealt % self.folds
                    dealt += 1
        else:
            fold[order] = torch.arange(count) % self.folds
        return fold


def _key(label: Any) -> Any:
    return label.item() if isinstance(label, torch.Tensor) else label


def _members(groups: Sequence[Any], order: torch.Tensor) -> dict[Any, list[int]]:
    """Each group's sample indices, the groups in the seeded ``order`` of their first sample."""
    members: dict[Any, list[int]] = {}
    for i in order.tolist():
        members.setdefault(groups[i], []).append(i)
    return members


@dataclass(frozen=True)
class FoldIds:
    """What a fold's validation samples are, for out-of-fold predictions (cv=K's oof.csv):
    the fold's number and one name per val sample, in val order (a table's line, a manifest's
    path, an image's file, an array's row)."""

    fold: int
    names: list[str]


def tensor_splits(
    samples: Any,
    given: Mapping[str, Any],
    split: Mapping[str, Any],
    plan: FoldPlan,
    groups: Sequence[Any] | None = None,
) -> tuple:
    """(train, val, test, val rows) of the :class:`data.batching.splits.TensorSplit` ``samples`` by
    ``plan``: a ``given`` test split (a file of its own) or the test share held out first (of
    whole ``groups`` when given), then fold ``plan.fold`` of the rest as val (or the val share,
    without folds). ``val rows``: the val samples' indices in ``samples``."""

    if plan.folds is None and plan.group is None:  # the plain seeded hold-out, as it always was
        return (*fill_splits(samples, given, split), None)
    if plan.folds is not None and "val" in given:
        raise UserError(
            "data.split.folds cuts val out of data.path; drop data.split.val_path "
            "(the folds cover train and val)"
        )
    take = lambda rows: TensorSplit(samples.inputs[rows], samples.labels[rows])  # noqa: E731
    sizes = {
        name: max(1, round(split[name] * len(samples)))
        for name in ("val", "test")
        if name not in given and (name == "test" or plan.folds is None)
    }
    parts = plan.parts(len(samples), sizes, samples.labels, groups)
    splits = {**given, **{name: take(rows) for name, rows in parts.items()}}
    return splits["train"], splits["val"], splits["test"], parts.get("val")


def group_values(
    header: list[str], rows: list[list[str]], path: Any, group: str | None
) -> list[str] | None:
    """Each row's value of the ``group`` column (data.split.group), in row order; None without
    one. A missing column, or a row without a value, is refused naming it."""
    if group is None:
        return None
    if group not in header:
        raise UserError(
            f"data.split.group={group}: {path} has no such column; its columns are "
            f"{', '.join(header)}"
        )
    at = header.index(group)
    for line, row in enumerate(rows, start=2):
        if not row[at].strip():
            raise UserError(
                f"{path} line {line}: no value in column {group!r} "
                "(data.split.group): give every row its group"
            )
    return [row[at].strip() for row in rows]
