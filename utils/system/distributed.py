"""Data-parallel training on PyTorch's own engine: torchrun starts the processes,
torch.distributed connects them (NCCL on CUDA, gloo on CPU), DDP averages the gradients.

    torchrun --nproc_per_node=8 train.py model=resnet18 data=cifar10
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=host0:29500 --rdzv-id=job42 train.py ...        # and node_rank=1

Without torchrun's environment everything here is a no-op for one process. Every rank trains;
rank 0 alone prints, draws the progress bar, writes TensorBoard, checkpoints and metrics.json.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from utils.errors import UserError
from utils.system.signals import Interrupted

log = logging.getLogger("torchloom")


@dataclass(frozen=True)
class Processes:
    """Where this process stands among the processes of the run."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def processes_from_env() -> Processes:
    """This process's place, from the variables torchrun sets (one process without them)."""
    if "LOCAL_RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return Processes()
    return Processes(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
    )


def join(processes: Processes, device: torch.device, alone_too: bool = False) -> torch.device:
    """Join the process group (NCCL on CUDA, gloo on CPU), binding this process to its local
    GPU; with ``alone_too`` (trainer.strategy=fsdp) a group of one when torchrun started none,
    so a sharded run continues as one process. Returns the device it trains on."""
    if not processes.enabled:
        if alone_too and not dist.is_initialized():
            store = dist.HashStore()
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
        return device
    if device.type == "cuda":
        if processes.local_rank >= torch.cuda.device_count():
            raise UserError(
                f"torchrun started {os.environ.get('LOCAL_WORLD_SIZE')} processes on this machine "
                f"but it has {torch.cuda.device_count()} GPU(s); lower --nproc_per_node"
            )
        device = torch.device("cuda", processes.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return device


def is_distributed() -> bool:
    return dist.is_initialized()


def close_processes() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, processes: Processes, device: torch.device, sync_batchnorm: bool):
    """DDP around the model when there are several processes (BatchNorm statistics synced
    across them with ``sync_batchnorm``); the model itself otherwise."""
    if not processes.enabled:
        return model
    if sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


# A context that does nothing, stateless: one serves every step (a step of a small model takes
# about a millisecond, and making a context each time a few microseconds of it).
NO_CONTEXT = contextlib.nullcontext()


def gradient_sync(model: nn.Module, sync: bool):
    """A context in which backward all-reduces the gradients only when ``sync``: micro-batches
    before the last of an accumulated step keep theirs local (DDP's ``no_sync``)."""
    # FSDP2: reduce-scatter on the last only. Asked of the class: a module's own attribute
    # lookup raises inside nn.Module.__getattr__ first, a cost in every micro-batch.
    if hasattr(type(model), "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        return NO_CONTEXT
    if sync or not isinstance(model, nn.parallel.DistributedDataParallel):
        return NO_CONTEXT
    return model.no_sync()


def all_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over all processes (the tensor itself for one process)."""
    if dist.is_initialized():
        tensor = tensor.clone()
        dist.all_reduce(tensor)
    return tensor


def all_rows(tensor: torch.Tensor) -> torch.Tensor:
    """The rows of ``tensor`` from every process, in rank order (the tensor itself for one
    process): each process's evaluation shard, whole, for a metric that ranks every sample
    (average precision). Shards may differ in length."""
    if not dist.is_initialized():
        return tensor
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.long, device=tensor.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(tensor)], device=tensor.device))
    longest = int(max(size.item() for size in sizes))
    padded = tensor.new_zeros(longest, *tensor.shape[1:])
    padded[: len(tensor)] = tensor
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat([part[: int(size.item())] for part, size in zip(gathered, sizes, strict=True)])


def all_mean(value: float, device: torch.device) -> float:
    """The mean of ``value`` over all processes (``value`` itself for one process)."""
    if not dist.is_initialized():
        return value
    total = all_sum(torch.tensor(value, dtype=torch.float64, device=device))
    return total.item() / dist.get_world_size()


def agree(flag: bool, device: torch.device) -> bool:
    """True on every process when it is true on any: all stop at the same step."""
    if not dist.is_initialized():
        return flag
    return bool(all_sum(torch.tensor(float(flag), device=device)).item())


def gathered(value: dict) -> list:
    """Every process's ``value`` (a dict of plain values and tensors), in rank order, its
    tensors on the CPU; ``[value]`` for one process."""
    value = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in value.items()}
    if not dist.is_initialized():
        return [value]
    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def first_of(value: object) -> object:
    """The first non-None of each process's ``value``, in rank order, on every process (a
    callback's stop asked in one process, utils/fit/callbacks/hooks.py); ``value`` for one."""
    if not dist.is_initialized():
        return value
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return next((item for item in gathered if item is not None), None)


def rescale_position(
    batch_in_epoch: int, saved: tuple[int, int], now: tuple[int, int], accumulate: int
) -> int:
    """A mid-epoch data position saved by ``saved`` = (processes, samples of a global batch),
    for ``now`` = the same of this run: the same number of samples into the epoch, rounded down
    to a whole optimizer step. The order of the epoch is global (data/batching/order.py), so
    with the same global batch on another world size the run continues the same sample stream
    (its numerics may differ: the reductions add in another order); with another global batch,
    some samples of the interrupted epoch may be seen twice or not at all."""
    (saved_world, saved_batch), (world, batch) = saved, now
    if (saved_world, saved_batch) == (world, batch) or batch_in_epoch == 0:
        return batch_in_epoch
    position = batch_in_epoch * saved_batch // batch // accumulate * accumulate
    if saved_batch == batch:
        log.warning(
            "warning: the checkpoint was written by %d process(es), this run has %d with the "
            "same global batch (%d samples): it continues the same sample stream at batch %d; "
            "the numbers may differ in their last bits (sums in another order)",
            saved_world,
            world,
            batch,
            position,
        )
        return position
    log.warning(
        "warning: the checkpoint was written by %d process(es) in global batches of %d, this "
        "run has %d in global batches of %d: the epoch continues at batch %d, %d samples in "
        "(not bit-exact: some samples of this epoch may be seen twice or not at all)",
        saved_world,
        saved_batch,
        world,
        batch,
        position,
        position * batch,
    )
    return position


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class Unwritable(Exception):
    """A cache folder cannot be written (a read-only mount, a path through a file)."""


def once_per_machine(make: Any) -> None:
    """``make()`` the files, on one process per machine under torchrun: local rank 0
    builds (or checks) them while the others wait, then every process maps the same files.
    What ended the build on any machine (bad input, a cache folder that cannot be written, a
    stop signal) ends every process the same way, with the same line. Machines sharing one
    cache folder build it each at once, safely: a cache file is renamed into place whole."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        make()
        return
    outcome = None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            make()
        except (UserError, Unwritable) as error:
            outcome = (type(error).__name__, str(error))
        except Interrupted:
            outcome = ("Interrupted", "")
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, outcome)  # the waiting processes wait here
    failed = next((found for found in outcomes if found is not None), None)
    if failed is not None:
        kind, message = failed
        raise {"UserError": UserError, "Unwritable": Unwritable}.get(kind, Interrupted)(message)
