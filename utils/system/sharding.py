"""How the model is split across processes: ``trainer.strategy`` (``auto``, ``ddp``, ``fsdp``).

``ddp`` (and ``auto``, with several processes) keeps a whole model in every process and
averages the gradients (utils/system/distributed.py). ``fsdp`` shards parameters, gradients
and optimizer state across the processes with PyTorch's FSDP2 (``fully_shard``): each block
``trainer.fsdp.blocks`` names, then the root, over a one-dimensional device mesh (gloo on the
CPU, NCCL on CUDA). A block's parameters are gathered for its forward and backward and
sharded again after (``trainer.fsdp.reshard_after_forward``); gradients are reduce-scattered.

    torchrun --nproc_per_node=8 train.py trainer.strategy=fsdp model=resnet18 precision=bf16

What FSDP does not carry yet is refused at start-up in one line naming the key
(:func:`check_strategy`).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch
from torch import nn

from utils.errors import UserError

log = logging.getLogger("torchloom")

STRATEGIES = ("auto", "ddp", "fsdp")
# Blocks that repeat in torchvision's models: the unit each all-gather brings in.
KNOWN_BLOCKS = ("BasicBlock", "Bottleneck", "EncoderBlock", "CNBlock", "InvertedResidual")


def check_strategy(cfg: Any) -> None:
    """``trainer.strategy`` is one of :data:`STRATEGIES`; under ``fsdp``, what FSDP does not
    carry in this version is refused in one line naming the key."""
    trainer = cfg.trainer
    if trainer.strategy not in STRATEGIES:
        raise UserError(
            f"trainer.strategy={trainer.strategy!r} is unknown; use one of {STRATEGIES}"
        )
    if trainer.strategy != "fsdp":
        return
    refused = [
        ("trainer.ema.decay", trainer.ema.decay is not None, "null"),
        ("trainer.swa.start", trainer.swa.start is not None, "null"),
        ("distill.teacher", cfg.distill.teacher is not None, "null"),
        ("trainer.compile", trainer.compile, "false"),
        ("trainer.sync_batchnorm", trainer.sync_batchnorm, "false"),
        ("trainer.keep_top_k", trainer.keep_top_k > 0, "0"),
        ("tune", cfg.tune is not None, "null"),
        ("model.freeze_backbone_epochs", bool(cfg.model.get("freeze_backbone_epochs")), "0"),
        ("trainer.log_grad_norms", trainer.log_grad_norms == "per_layer", "total"),
    ]
    for key, on, off in refused:
        if on:
            raise UserError(
                f"{key} is not supported with trainer.strategy=fsdp in this version; set "
                f"{key}={off}, or use trainer.strategy=ddp"
            )
    if str(cfg.precision.get("dtype")) in ("float16", "fp16"):
        raise UserError(
            "precision=fp16 is not supported with trainer.strategy=fsdp (its loss scaler "
            "does not see sharded gradients); use precision=bf16 or fp32"
        )
    if trainer.fsdp.consolidate:
        try:
            import safetensors  # noqa: F401
        except ImportError:
            raise UserError(
                'trainer.fsdp.consolidate=true writes best.safetensors: pip install -e ".[export]"'
            ) from None
    for name, entry in (cfg.get("callbacks") or {}).items():
        if entry and entry.get("mutable"):
            raise UserError(
                f"callbacks.{name}.mutable=true is not supported with trainer.strategy=fsdp "
                "(a hook would see one process's shards of the weights); use "
                "trainer.strategy=ddp"
            )


def blocks_of(model: nn.Module, names: Any) -> list[nn.Module]:
    """The modules each ``fully_shard`` call wraps, before the root: those whose class name
    is in ``names``; ``auto``: the blocks a model names (``repeated_blocks()``), torchvision's
    repeated blocks, else the entries of every
    ModuleList or Sequential whose two or more entries share a class and hold parameters,
    else the model's children that hold parameters."""
    if names != "auto":
        wanted = {names} if isinstance(names, str) else set(names)
        found = [m for m in model.modules() if type(m).__name__ in wanted]
        if not found:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise UserError(
                f"trainer.fsdp.blocks={sorted(wanted)}: no module of this model is of those "
                f"classes ({', '.join(present[:12])}...); name one of them, or auto"
            )
        return found
    declared = [m for m in model.modules() if hasattr(m, "repeated_blocks")]
    if declared:  # a model that names its blocks (models/gpt.py), even a single one
        return list(declared[0].repeated_blocks())
    known = [m for m in model.modules() if type(m).__name__ in KNOWN_BLOCKS]
    if known:
        return known
    repeated = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList | nn.Sequential):
            held = [m for m in module.children() if any(True for _ in m.parameters())]
            kinds = Counter(type(m) for m in held)
            if held and len(held) >= 2 and len(kinds) == 1 and len(list(held[0].children())):
                repeated += held
    if repeated:
        return repeated
    children = []  # a container has no forward of its own: its entries are the units
    for child in model.children():
        held = child.children() if isinstance(child, nn.ModuleList | nn.ModuleDict) else [child]
        children += [m for m in held if any(True for _ in m.parameters())]
    return children


def shard_model(model: nn.Module, device: torch.device, trainer: Any, dtype: torch.dtype) -> Any:
    """``model`` sharded in place with FSDP2 over every process, each block then the root;
    ``dtype`` (the precision's) becomes the parameters' compute dtype, gradients reduced in
    float32."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    settings = trainer.fsdp
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": settings.reshard_after_forward,
    }
    if dtype != torch.float32:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if settings.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    blocks = blocks_of(model, settings.blocks)
    kinds = Counter(type(b).__name__ for b in blocks)  # before fully_shard renames them
    if trainer.activation_checkpointing:
        checkpoint_blocks(model, blocks)
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())  # global shapes
    log.info(
        "trainer.strategy=fsdp: %s sharded over %d processes, then the root; parameters "
        "%s in all, %s in this process%s",
        ", ".join(f"{n} × {k}" for k, n in kinds.items()),
        dist.get_world_size(),
        shown_bytes(whole),
        shown_bytes(local_bytes(model.parameters())),
        "; activations recomputed per block" if trainer.activation_checkpointing else "",
    )
    return model


def checkpoint_blocks(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Activation checkpointing per block: each block's activations are recomputed in its
    backward instead of held (the same loss and gradients; less memory, more compute)."""
    from torch.distributed._composable import checkpoint

    for block in blocks:
        checkpoint(block)


def sharded_model(model: nn.Module) -> bool:
    """Whether ``model`` is sharded by FSDP (trainer.strategy=fsdp)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_bytes(tensors: Any) -> int:
    """The bytes this process holds of ``tensors``: a sharded tensor's local shard only."""
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def memory_per_process(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """``memory/param_bytes_per_process`` and ``memory/optimizer_bytes_per_process``: what
    this process holds of the parameters and of the optimizer's state (its moments, once a
    step has made them), under any strategy."""
    state = [
        value
        for entry in optimizer.state.values()
        for value in entry.values()
        if isinstance(value, torch.Tensor)
    ]
    figures = {
        "memory/param_bytes_per_process": local_bytes(model.parameters()),
        "memory/optimizer_bytes_per_process": local_bytes(state),
    }
    device = device_of(model)
    if device.type == "cuda":  # everything the step held at its peak: activations too
        figures["memory/peak_device_bytes_per_process"] = torch.cuda.max_memory_allocated(device)
    return figures


def evened(batches: Any, model: nn.Module) -> Any:
    """Evaluation batches under FSDP: every process must call the sharded model as often as
    the others (each call gathers parameters from all of them), but evaluation shards may
    differ by a batch. A process whose shard is done calls the model on one sample of the
    first batch any process saw, as long as another still has batches, and yields
    ``(inputs, None)`` for those calls: their outputs are not counted. Without sharding, the
    batches as they are."""
    if not sharded_model(model):
        yield from batches
        return
    import torch.distributed as dist

    stream = iter(batches)
    item = next(stream, None)
    shapes: list = [None] * dist.get_world_size()
    mine = None if item is None else (tuple(item[0].shape[1:]), item[0].dtype)
    dist.all_gather_object(shapes, mine)
    shape = next((s for s in shapes if s is not None), None)
    if shape is None:
        return
    filler = torch.zeros((1, *shape[0]), dtype=shape[1], device=device_of(model))
    while True:
        more = torch.tensor([0 if item is None else 1], device=filler.device)
        dist.all_reduce(more, op=dist.ReduceOp.MAX)
        if not more.item():
            return
        yield (filler, None) if item is None else item
        if item is not None:
            item = next(stream, None)


def device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    if parameter is None:
        return torch.device("cpu")
    local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
    return local.device


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm as one tensor: a sharded norm's full value (FSDP's clip returns one)."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def without_grad(model: nn.Module) -> Any:
    """``torch.inference_mode`` for a forward that trains nothing, but ``no_grad`` for a
    sharded model: FSDP reuses the buffers its parameters are gathered into, and one made in
    inference mode cannot be written by the training step after."""
    return torch.no_grad() if sharded_model(model) else torch.inference_mode()


def shown_bytes(count: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
