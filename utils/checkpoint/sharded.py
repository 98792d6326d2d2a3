"""Sharded checkpoints (``trainer.strategy=fsdp``): how they are written whole or not at all,
and read as data only.

A sharded checkpoint is a folder (``checkpoints/<run>/last/``, ``best/``) holding what
``torch.distributed.checkpoint`` (DCP) writes — each process's shards of the model's and the
optimizer's tensors (``__<rank>_0.distcp``) and the ``.metadata`` that indexes them — and
:data:`STATE_FILE`, everything else a resume needs (counters, config, each process's RNG, the
schedule, the callbacks' state, the run record), written by rank 0 as a ``.pt`` file of plain
data once DCP is done. Its presence is what makes the folder complete.

Writing goes to ``<name>.partial/``; once complete, the earlier folder is renamed aside
(``<name>.old/``), the new one into place, and the old one removed: a kill at any moment leaves
a complete checkpoint under ``<name>`` or ``<name>.old`` (:func:`complete_folder` finds it).

Reading: the index (DCP's ``.metadata``, a pickle) is read as data and checked whole first
(utils/checkpoint/sharded_index.py); tensors are read by DCP with ``weights_only=True`` into
zeros, each tensor's bytes checked against the checksums written with them
(utils/intact.py), and a read that fails is one line.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from utils.checkpoint.sharded_index import METADATA, read_metadata
from utils.errors import UserError
from utils.evaluation.export import export_safetensors
from utils.files import SHARDED_STATE, save_atomic, sharded_folder
from utils.intact import damaged_record
from utils.model.weights import load_weights, weights_that_fit

log = logging.getLogger("torchloom")

STATE_FILE = SHARDED_STATE  # everything but the sharded tensors; written last: the folder is whole
PARTIAL, OLD = ".partial", ".old"


def _reader(folder: Path, known: Any = None) -> Any:
    """DCP's reader of ``folder``, whose index is read as data (``known``: read already)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = known if known is not None else read_metadata(Path(self.path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().read_data(*args, **kwargs)
            except UserError:
                raise
            except Exception as error:  # torch's own line would advise loading it unsafely
                raise damaged(type(error).__name__) from None

        def _slice_file(self, file: Any, item: Any) -> Any:
            """Each tensor's bytes (a ``torch.save`` archive), its records' checksums checked
            before DCP's ``torch.load`` reads them."""
            file.seek(item.offset)
            read = io.BytesIO(file.read(item.length))
            damage = damaged_record(read)
            if damage:
                raise damaged(f"{item.relative_path}: {damage}")
            return read

    def damaged(why: str) -> UserError:
        return UserError(
            f"refusing to load {folder}: its tensor files are damaged or were edited ({why}), "
            "and nothing from them was run; copy the checkpoint again, or resume from the one "
            "beside it"
        )

    return SafeReader(str(folder))


# --- Finding ---------------------------------------------------------------------------------


is_sharded = sharded_folder  # whether a path is a sharded checkpoint's folder (whole or not)


def whole(path: Path) -> bool:
    return path.is_dir() and (path / METADATA).is_file() and (path / STATE_FILE).is_file()


def complete_folder(path: Path) -> Path | None:
    """``path`` when whole, else the ``.old`` one a kill mid-swap left, else None."""
    for candidate in (path, path.with_name(path.name + OLD)):
        if whole(candidate):
            return candidate
    return None


# --- Writing ---------------------------------------------------------------------------------


def save_sharded(tensors: dict, state: dict | None, folder: Path, writes: bool) -> None:
    """``tensors`` (each process its shards; every process calls this) and ``state`` (rank
    0's: ``writes``) as the sharded checkpoint ``folder``, whole or not at all."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    partial = folder.with_name(folder.name + PARTIAL)
    if writes:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    distributed = dist.is_initialized()
    if distributed:
        dist.barrier()
    dcp.save(tensors, checkpoint_id=str(partial), no_dist=not distributed)
    if writes:
        save_atomic(state, partial / STATE_FILE)
        replace_folder(partial, folder)
    if distributed:
        dist.barrier()


def replace_folder(new: Path, folder: Path) -> None:
    """``new`` (whole) in place of ``folder``: the old one renamed aside first, removed last."""
    old = folder.with_name(folder.name + OLD)
    if folder.exists():
        if whole(old) and not whole(folder):
            shutil.rmtree(folder)  # a kill mid-swap: old is the whole one
        else:
            shutil.rmtree(old, ignore_errors=True)
            os.rename(folder, old)
    os.rename(new, folder)
    shutil.rmtree(old, ignore_errors=True)


def copy_sharded(source: Path, folder: Path) -> None:
    """A whole copy of the sharded checkpoint ``source`` as ``folder`` (best/ of last/)."""
    partial = folder.with_name(folder.name + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    replace_folder(partial, folder)


# --- Reading ---------------------------------------------------------------------------------


def load_into(folder: Path, tensors: dict, metadata: Any = None) -> None:
    """Fill ``tensors`` (a state dict of this process's shards, or of whole tensors) from
    ``folder`` (``metadata``: its index, when read already): DCP reshards what another number
    of processes wrote."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():  # "assuming ... a single process": so it is
            warnings.simplefilter("ignore", UserWarning)
            reader = _reader(folder, metadata)
            dcp.load(tensors, storage_reader=reader, no_dist=not dist.is_initialized())
    except (Exception, CheckpointException) as error:  # DCP's own is a BaseException
        if isinstance(error, CheckpointException) and error.failures:  # the first process's
            error = next(iter(error.failures.values()))[0]
        if isinstance(error, UserError):  # the index's, or the reader's
            raise error from None
        reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        raise UserError(
            f"cannot read {folder}: {reason or type(error).__name__}; the checkpoint does not "
            "fit this model, or its files are incomplete"
        ) from None


def whole_tensors(folder: Path, prefix: str, metadata: Any = None) -> dict[str, torch.Tensor]:
    """Every tensor under ``prefix`` (``model.``) gathered whole, in one process without
    torchrun: what evaluate.py, predict.py, the exports and init_from read (``metadata``: the
    folder's index, when read already)."""
    metadata = metadata or read_metadata(folder)
    wanted = {
        key: torch.zeros(tuple(entry.size), dtype=entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith(prefix)
    }
    load_into(folder, wanted, metadata)  # the index read and checked once
    return {key.removeprefix(prefix): value for key, value in wanted.items()}


# --- Models and optimizers -------------------------------------------------------------------


def sharded_state(model: Any, optimizer: Any) -> tuple[dict, list]:
    """What a sharded checkpoint's DCP files hold — the model's and the optimizer's tensors by
    parameter name (this process's shards of them) — and the optimizer's param groups (plain
    values, for :data:`STATE_FILE`)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optimizer_state = get_state_dict(model, optimizer)
    return {"model": weights, "optimizer": optimizer_state["state"]}, optimizer_state[
        "param_groups"
    ]


def restore_sharded(folder: Path, model: Any, optimizer: Any = None, saved: Any = None) -> None:
    """The model's (and with ``optimizer``, its state's) tensors from the sharded checkpoint
    ``folder``, into this process's shards; ``saved``: the optimizer entry of its state file
    (the param groups). Another number of processes than wrote it: DCP reshards."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if optimizer is None:
        weights = get_model_state_dict(model)
        tensors = {"model": weights}
        load_into(folder, tensors)
        set_model_state_dict(model, tensors["model"])
        return
    tensors, _ = sharded_state(model, optimizer)
    load_into(folder, tensors)
    groups = (saved or {}).get("param_groups")
    if not isinstance(groups, list):
        raise UserError(f"{folder}: its optimizer's settings are missing; was it edited?")
    try:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=tensors["model"],
            optim_state_dict={"state": tensors["optimizer"], "param_groups": groups},
        )
    except (KeyError, ValueError, RuntimeError) as error:
        raise UserError(
            f"the optimizer state in {folder} does not fit this model's parameters "
            f"({str(error)[:200]}); start from its weights with init_from={folder} instead"
        ) from None


def load_whole(model: Any, weights: dict) -> None:
    """Whole weights (a checkpoint's, init_from) into a sharded model: each process keeps its
    shards of them. Names and shapes are checked as for any model first."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    fitting = weights_that_fit(model.state_dict(), weights, strict=True)
    set_model_state_dict(model, fitting, options=StateDictOptions(full_state_dict=True))


def whole_weights(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights gathered whole on the CPU of rank 0 (a collective: every process
    calls it; the others get nothing)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def restore_training(
    path: Path, checkpoint: dict, model: Any, optimizer: Any, sharded: bool
) -> None:
    """The weights and optimizer state of the checkpoint at ``path`` into a run's model and
    optimizer: from a sharded folder each process reads its shards (under any strategy: DCP
    reshards, a plain model takes them whole); a whole-model file into a plain model; a
    whole-model file into a sharded run (``sharded``) is refused in one line."""
    if is_sharded(path):
        restore_sharded(path, model, optimizer, checkpoint["optimizer"])
        return
    if sharded:
        raise UserError(
            f"{path} is a whole-model checkpoint; trainer.strategy=fsdp resumes sharded ones: "
            f"resume it with trainer.strategy=ddp, or start from its weights with "
            f"init_from={path}"
        )
    load_weights(model, checkpoint["model"])
    try:
        optimizer.load_state_dict(checkpoint["optimizer"])
    except (ValueError, KeyError) as error:
        raise UserError(
            f"the checkpoint's optimizer state does not fit this model's parameters "
            f"({error}); start from its weights with init_from=... instead"
        ) from None


def consolidate(model: Any, folder: Path, record: Any, writes: bool) -> None:
    """``trainer.fsdp.consolidate``: the model's (best) weights gathered whole (every process
    sends its shards) into ``folder/best.safetensors`` with the run's config and inputs
    record, as ``evaluate.py export=...safetensors`` writes one: read without torchrun."""
    weights = whole_weights(model)
    if writes:
        path = folder / "best.safetensors"
        export_safetensors(weights, record.resolved, record.inputs, path)
        log.info("trainer.fsdp.consolidate: the best weights, whole, in %s", path)
