"""Start-up checks against the classic PyTorch pitfalls: cheap, run once, each silenced by name
(``trainer.silence_guards=[probability_outputs]``).

- ``unregistered_modules``: sub-modules kept in a plain list, dict or tuple attribute are not
  registered, so their weights never reach the optimizer or the checkpoint.
- ``probability_outputs``: outputs that are already probabilities (non-negative, rows summing
  to 1) fed to cross-entropy, which expects logits: a softmax too many (task=classification
  only: other tasks' outputs may be anything).
- ``batchnorm_batch_of_one``: BatchNorm cannot normalise a training batch of one sample.
- ``non_finite_inputs``: NaN or Inf in the first training batches.
- ``small_eval_splits``: a val or test split of fewer than 30 samples: a figure on it moves in
  steps of 1/N (accuracy in steps of 0.2 on 5 samples), so best.pt is chosen by noise.
- ``few_steps``: a run of fewer than 100 optimizer steps (2 epochs of a small set), too few for
  most models to learn from; ``trainer.max_epochs=auto`` fits the epochs to the data's size.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from data.batching.batches import BatchPlan
from utils.errors import UserError
from utils.schedulers import FEW_STEPS, StepCounts, epochs_for
from utils.system.sharding import without_grad

GUARDS = (
    "unregistered_modules",
    "probability_outputs",
    "batchnorm_batch_of_one",
    "non_finite_inputs",
    "small_eval_splits",
    "few_steps",
)
MIN_EVAL_SAMPLES = 30
log = logging.getLogger("torchloom")


def check_guard_names(silenced: Sequence[str]) -> None:
    unknown = sorted(set(silenced) - set(GUARDS))
    if unknown:
        raise UserError(
            f"trainer.silence_guards: unknown guard(s) {unknown}; the guards are {list(GUARDS)}"
        )


def unregistered_modules(model: nn.Module) -> None:
    internal = set(vars(nn.Module()))  # _modules, _parameters, hooks ...: torch's own bookkeeping
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute in internal:
                continue
            items = value.values() if isinstance(value, dict) else value
            if isinstance(value, (list, tuple, dict)) and any(
                isinstance(v, nn.Module) for v in items
            ):
                where = f"{module_name}.{attribute}" if module_name else attribute
                container = "nn.ModuleDict" if isinstance(value, dict) else "nn.ModuleList"
                raise UserError(
                    f"the model keeps sub-modules in a plain {type(value).__name__} "
                    f"'{where}' of {module.__class__.__name__}: their parameters are not "
                    f"registered and would never train; wrap it in {container}(...)"
                )


def probability_outputs(outputs: torch.Tensor) -> None:
    if (
        outputs.ndim == 2
        and bool((outputs >= 0).all())
        and torch.allclose(
            outputs.sum(dim=1), torch.ones(len(outputs), device=outputs.device), atol=1e-3
        )
    ):
        log.warning(
            "warning: the model outputs probabilities (non-negative rows summing to 1), but "
            "the loss is cross-entropy, which applies softmax itself: return logits, i.e. "
            "remove the final softmax"
        )


def batchnorm_batch_of_one(model: nn.Module, batch_size: int) -> None:
    if batch_size == 1 and any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
    ):
        raise UserError(
            "the model has BatchNorm layers and data.batch_size=1: BatchNorm cannot normalise a "
            "single sample; raise data.batch_size (and trainer.accumulate_grad_batches if "
            "memory is short) or use GroupNorm/LayerNorm"
        )


def non_finite_inputs(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], split: str) -> None:
    for index, (images, _) in enumerate(batches):
        if not bool(torch.isfinite(images).all()):
            raise UserError(
                f"the {split} split has NaN or Inf inputs in batch {index}: clean the data "
                f"(or its normalisation: is a data.std 0?)"
            )


def run_guards(
    model: nn.Module,
    input_shape: Sequence[int],
    batch_size: int,
    first_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    silenced: Sequence[str],
) -> None:
    """Every guard not in ``silenced``; the model is left as it was (eval, no gradients)."""
    check_guard_names(silenced)
    active = [name for name in GUARDS if name not in silenced]
    if "unregistered_modules" in active:
        unregistered_modules(model)
    if "batchnorm_batch_of_one" in active:
        batchnorm_batch_of_one(model, batch_size)
    if "non_finite_inputs" in active:
        non_finite_inputs(first_batches, "train")
    if "probability_outputs" in active:
        device = next(model.parameters(), torch.empty(0)).device
        generator = torch.Generator(device=device).manual_seed(0)  # not the training RNG
        inputs = torch.randn(4, *input_shape, device=device, generator=generator)
        given = next(iter(first_batches), None)
        if given is not None and not given[0].is_floating_point():  # token ids: real ones
            inputs = given[0][:4]
        was_training = model.training
        model.eval()
        with without_grad(model):
            probability_outputs(model(inputs))
        model.train(was_training)


def small_eval_splits(sizes: dict[str, int], test_split: str) -> None:
    """One warning for each of val and the split testing uses that is too small to judge by."""
    for split in dict.fromkeys(("val", test_split)):
        count = sizes.get(split)
        if count is not None and 0 < count < MIN_EVAL_SAMPLES:
            log.warning(
                "warning: the %s split holds %d samples: its figures move in steps of "
                "%.2g, so %s; hold out more (data.split.%s=0.2 for a table or arrays, "
                "data.%s_size for synthetic data, or more files in its %s split)",
                split,
                count,
                1 / count,
                "best.pt is chosen by noise" if split == "val" else "its test figure is rough",
                split,
                split,
                split,
            )


@dataclass(frozen=True)
class StartUp:
    """What the start-up checks found: the first training batches (also shown in
    TensorBoard), how many optimizer steps an epoch and the run take, and in how many epochs
    (``trainer.max_epochs``, fitted to the data's size when ``auto``)."""

    first_batches: list[tuple[torch.Tensor, torch.Tensor]]
    steps: StepCounts
    epochs: int


def run_length(trainer: Any, steps_per_epoch: int, whole_epoch: int) -> tuple:
    """(epochs, :class:`StepCounts`, how they were chosen): ``trainer.max_steps`` steps in as
    many epochs as they reach into, else ``trainer.max_epochs`` (auto: fitted to the
    training set's ``whole_epoch`` batches)."""
    if trainer.max_steps:
        epochs = -(-trainer.max_steps // steps_per_epoch)
        steps = StepCounts(steps_per_epoch, trainer.max_steps)
        return (
            epochs,
            steps,
            f" (trainer.max_steps={trainer.max_steps}, epochs of {steps_per_epoch} steps)",
        )
    accumulate = trainer.accumulate_grad_batches
    epochs = epochs_for(trainer.max_epochs, max(whole_epoch // accumulate, 1))
    auto = trainer.max_epochs == "auto"
    fitted = " (trainer.max_epochs=auto, fitted to the training set's size)" if auto else ""
    return epochs, StepCounts(steps_per_epoch, steps_per_epoch * epochs), fitted


def check_start_up(
    model: nn.Module, data: Any, batches: Any, trainer: Any, task: Any, processes: Any
) -> StartUp:
    """The guards on the first two training batches (less those the ``task`` says do not
    apply), then the run's length: an epoch must hold at least one optimizer step, and
    ``trainer.max_epochs=auto`` is fitted to the training set's size. Logs what one step
    trains on, by all of ``processes`` (torchrun's world), and how many steps the run takes."""
    world_size = processes.world_size
    first = list(itertools.islice(batches.epoch(0), 2))
    silenced = [*trainer.silence_guards, *task.quiet_guards]
    run_guards(model, data.input_shape, data.batch_size, first, silenced)
    if "small_eval_splits" not in silenced:
        small_eval_splits(data.sizes(), data.test_split)
    accumulate = trainer.accumulate_grad_batches
    steps_per_epoch = len(batches) // accumulate
    if steps_per_epoch == 0:
        raise UserError(
            f"{len(batches)} training batches cannot fill one step of "
            f"trainer.accumulate_grad_batches={accumulate}; lower it"
        )
    log.info(
        "data %s: %s samples; %d per optimizer step (batch %d per process × %d "
        "accumulated × %d processes)",
        data.name,
        data.sizes(),
        data.batch_size * accumulate * world_size,
        data.batch_size,
        accumulate,
        world_size,
    )
    # Fitted to whole epochs of the data: a debug limit shortens each epoch, not their count.
    samples = data.sizes()["train"]
    plan = BatchPlan(
        batch_size=data.batch_size,
        train=True,
        seed=0,
        world_size=world_size,
        keep_partial=accumulate == 1,
    )
    epochs, steps, fitted = run_length(trainer, steps_per_epoch, plan.batch_count(samples))
    log.info(
        "%d samples, batch %d, %d epochs%s = %d optimizer steps",
        samples,
        data.batch_size * accumulate * world_size,
        epochs,
        fitted,
        steps.total,
    )
    if "few_steps" not in silenced and not debugging(trainer) and 0 < steps.total < FEW_STEPS:
        log.warning(
            "warning: this run takes only %d optimizer steps, too few for most models to "
            "learn from; raise trainer.max_epochs (or set it to auto) or lower data.batch_size",
            steps.total,
        )
    return StartUp(first, steps, epochs)


def debugging(trainer: Any) -> bool:
    """A debug mode that shortens the run on purpose (conf/debug/)."""
    limited = trainer.limit_train_batches is not None or trainer.overfit_batches
    return bool(limited or trainer.profile_steps or trainer.shapes_only)
