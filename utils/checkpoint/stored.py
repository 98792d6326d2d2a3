"""What another run stored, read as untrusted data for ``evaluate.py``: a torchloom checkpoint
or a ``.safetensors`` export with its config (checked before anything is built from it,
utils/config/trust.py), the stored data config with this command line's ``data.*`` overrides, and
the ``.safetensors`` export itself (the ``export`` extra)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from utils.checkpoint.format import averaged_checkpoint
from utils.checkpoint.load import load_checkpoint
from utils.config.arguments import POSITIVE_INT
from utils.config.build import build
from utils.config.trust import (
    INTERPOLATION,
    check_stored_config,
    require_keys,
    walk_keys,
    with_current_targets,
    without_callbacks,
)
from utils.errors import UserError
from utils.evaluation.export import DIGEST_KEY
from utils.files import save_atomic
from utils.intact import tensors_digest
from utils.model.modules import accepted_by
from utils.model.weights import weights_that_fit

log = logging.getLogger("torchloom")
WEIGHTS = ("auto", "swa", "ema", "raw")


def read_checkpoint(
    path: Path, config_path: str | None, which: str = "auto", loaded: dict | None = None
) -> tuple[dict, dict, dict | None, str]:
    """(stored config, model weights, inputs record, which weights: ema, raw or export) from a
    torchloom checkpoint or a .safetensors export (which may have no inputs record: None). The
    config is checked as untrusted data before anything is built from it. ``which`` weights of
    a checkpoint: ``swa`` or ``ema`` (trainer.swa's or trainer.ema's average), ``raw`` (the
    trained weights), or ``auto`` (what validation judged: :func:`judged_averages`). A calibration fitted on the other weights is
    left out of the record, with a warning (utils/evaluation/calibration.py). ``loaded``: the
    checkpoint at ``path`` as the caller loaded it already (load_checkpoint), not read again."""
    if which not in WEIGHTS:
        raise UserError(f"weights={which!r} must be auto, swa, ema or raw")
    inputs, name = None, "export"
    if path.suffix != ".safetensors":
        checkpoint = load_checkpoint(path) if loaded is None else loaded
        config, source = checkpoint.get("config"), path
        weights, name = chosen_weights(checkpoint, which, path)
        inputs = calibration_for(checkpoint.get("inputs"), name, path)
    else:
        if which in ("swa", "ema"):
            raise UserError(f"{path} holds one set of weights (an export); drop weights={which}")
        weights, stored, inputs = read_safetensors(path)
        if config_path:
            config, source = read_yaml_config(Path(config_path)), Path(config_path)
        elif stored is None:
            raise UserError(
                f"{path} carries no config; export it again with evaluate.py ckpt=<its "
                f"checkpoint> export={path.name}, which stores it, or pass config=<the "
                "config as plain YAML>"
            )
        else:
            config, source = stored, path
    config = without_callbacks(with_current_targets(config))
    require_keys(config, source, {"model": dict, "data": dict, "seed": int})
    check_stored_config(config, source)
    if inputs is not None and not isinstance(inputs, dict):
        raise UserError(f"{path}: its inputs record is not what torchloom writes (was it edited?)")
    return config, weights, inputs, name


def calibration_for(inputs: Any, weights: str, path: Path) -> Any:
    """``inputs`` without its calibration when that was fitted on other weights than
    ``weights`` (ema or raw): a temperature belongs to the weights it was fitted to."""
    calibrated = inputs.get("calibration") if isinstance(inputs, dict) else None
    fitted_on = calibrated.get("weights") if isinstance(calibrated, dict) else None
    if fitted_on in ("swa", "ema", "raw") and fitted_on != weights:
        log.warning(
            "%s: its calibration was fitted on the %s weights, so it is not applied to "
            "the %s weights (weights=%s applies it)",
            path,
            fitted_on,
            weights,
            fitted_on,
        )
        return {key: value for key, value in inputs.items() if key != "calibration"}
    return inputs


def average_checkpoints(paths: list[Path], which: str) -> tuple[dict, dict, dict | None, str]:
    """(config, weights, inputs record, which weights) of the equal-weight average of the
    ``which`` weights of ``paths`` (a run's top-k copies): the config and record of the last,
    without a calibration (fitted to other weights). Every file must hold the same tensors."""
    if len(paths) < 2:
        raise UserError(
            f"average=top_k needs two or more top-k copies; found {len(paths)} "
            "(train with trainer.keep_top_k=3 or more)"
        )
    summed: dict[str, torch.Tensor] = {}
    for path in paths:
        config, weights, inputs, name = read_checkpoint(path, None, which)
        if summed and {k: v.shape for k, v in weights.items()} != {
            k: v.shape for k, v in summed.items()
        }:
            raise UserError(
                f"average=top_k: {path} holds other tensors than {paths[0]} (another "
                "model?); average copies of one run only"
            )
        for key, value in weights.items():
            if value.is_floating_point():
                summed[key] = summed.get(key, 0) + value.double()
            else:  # counters: the last file's
                summed[key] = value
    averaged = {
        key: (value / len(paths)).to(weights[key].dtype)
        if weights[key].is_floating_point()
        else value
        for key, value in summed.items()
    }
    if isinstance(inputs, dict):
        inputs = {key: value for key, value in inputs.items() if key != "calibration"}
    return config, averaged, inputs, name


def task_config(stored: dict) -> DictConfig:
    """The stored task node; a checkpoint written before the task group existed trained a
    plain classifier."""
    task = stored.get("task") or {
        "_target_": "utils.tasks.classification",
        "label_smoothing": 0.0,
        "class_weights": None,
    }
    if not isinstance(task, dict):
        raise UserError("the stored config's task is not a mapping (was it edited?)")
    return OmegaConf.create(task)


# The keys naming what a built-in model's weights started from (torchvision's, timm's, a
# Hugging Face folder), by builder.
STARTED_FROM = {
    "models.pretrained.torchvision_model": "weights",
    "models.timm_models.timm_model": "pretrained",
    "models.text.hf_model": "path",
}


def model_config(stored: dict) -> dict:
    """The stored model node to rebuild the model from, without the pretrained weights it
    started from: the checkpoint's own weights replace them, and the stored path (or hub name)
    is never read."""
    key = STARTED_FROM.get(stored.get("_target_"), "weights")
    return {**stored, key: None} if key in stored else stored


class TensorBudget(torch.overrides.TorchFunctionMode):
    """Refuses, in one line, a build that makes more than ``limit`` tensors: a stored config
    that asks for 100,000 encoder layers would otherwise spend minutes and gigabytes making them
    on the meta device before its weights are found not to fit."""

    FACTORIES = (torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.made = limit, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FACTORIES:
            self.made += 1
            if self.made > self.limit:
                raise UserError(
                    f"the stored model config builds more than {self.limit:,} tensors, far "
                    "more than its checkpoint's weights; was it edited?"
                )
        return func(*args, **(kwargs or {}))


def check_stored_model(node: Any, shapes: dict[str, Any], weights: dict) -> None:
    """Build the model a stored config describes on the meta device, where parameters take no
    memory, and check that the file's ``weights`` fit it, before the real model is built: an
    edited config (``hidden_sizes: [1000000000]``, a vast ``num_classes``) is refused with the
    mismatch table instead of allocating what it asks for. A builder that cannot run on the
    meta device is left to the real build."""

    try:
        with torch.device("meta"), TensorBudget(4 * len(weights) + 1000):
            model = build(node, **accepted_by(node["_target_"], shapes))
        expected = model.state_dict()
    except UserError:
        raise
    except Exception:
        return
    weights_that_fit(expected, weights, strict=True)


def judged_averages(checkpoint: dict) -> tuple[str, ...]:
    """The averages training judged its validation and test by, in order (utils/fit/loop.py
    Parts.judged): SWA's; the EMA's unless ``trainer.ema.evaluate=false`` (the raw weights
    were judged). ``weights=auto`` means these, so every command sees what training saw."""
    config = checkpoint.get("config")
    trainer = config.get("trainer") if isinstance(config, dict) else None
    ema = trainer.get("ema") if isinstance(trainer, dict) else None
    evaluated = not isinstance(ema, dict) or ema.get("evaluate", True) is not False
    return ("swa", "ema") if evaluated else ("swa",)


def chosen_weights(checkpoint: dict, which: str, path: Path) -> tuple[dict, str]:
    """(the weights ``which`` names, their name: swa, ema or raw; see :func:`read_checkpoint`)."""
    if which == "auto":
        which = next(
            (k for k in judged_averages(checkpoint) if checkpoint.get(k) is not None), "raw"
        )
    if which == "raw":
        return checkpoint["model"], "raw"
    average = checkpoint.get(which)
    if average is None:
        trained = "trainer.swa.start" if which == "swa" else "trainer.ema"
        raise UserError(
            f"{path} holds no {which.upper()} weights (trained without {trained}); use weights=raw"
        )
    if not isinstance(average, dict) or not isinstance(average.get("model"), dict):
        raise UserError(
            f"{path}: its {which} entry is not what torchloom writes (was it "
            "edited?); weights=raw reads the trained weights"
        )
    return average["model"], which


def read_safetensors(path: Path) -> tuple[dict, Any, Any]:
    """(weights, stored config or None, stored inputs record or None) of an export."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise UserError(
            'reading .safetensors needs the extra: pip install -e ".[export]"'
        ) from None
    try:
        with safe_open(str(path), framework="pt") as f:
            weights = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
            metadata = f.metadata() or {}
        stored, inputs = metadata.get("torchloom_config"), metadata.get("torchloom_inputs")
        read = weights, *(None if s is None else json.loads(s) for s in (stored, inputs))
    except Exception:
        raise UserError(f"not a readable checkpoint: {path}") from None
    if DIGEST_KEY in metadata and metadata[DIGEST_KEY] != tensors_digest(weights):  # not before
        raise UserError(
            f"{path} is damaged: its weights do not match the sha256 written with them (changed "
            "on a disk or in a copy), and nothing from it was loaded; copy or export it again"
        )
    return read


MAX_YAML_BYTES = 2**20  # a run's config: a few kilobytes


def read_yaml_config(path: Path) -> Any:
    """A config file (``config=``, for an export without one) as plain containers, parsed but
    never resolved (its interpolations are refused as a stored config's are). A file
    from elsewhere larger than a config, or with YAML aliases (which Hydra never writes, and
    which can expand tenfold a level: seven levels kept the load going past 5 minutes), is
    refused before it is loaded."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_YAML_BYTES + 1)
        text = data.decode() if len(data) <= MAX_YAML_BYTES else None  # bytes, not characters
        if text is None or _aliased(text):
            raise UserError(
                f"config={path}: not a config torchloom writes (larger than "
                f"{MAX_YAML_BYTES:,} bytes, or with YAML aliases); pass the config as plain "
                "YAML, or export again with evaluate.py, which stores it in the file"
            )
        return OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    except UserError:
        raise
    except Exception:
        raise UserError(f"config={path}: not a readable YAML config") from None


def _aliased(text: str) -> bool:
    return any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, yaml.SafeLoader))


# The data keys that say where, and how much, a command writes, deletes or starts: a cache's
# folder and size, a download, worker processes. They are this machine's and this command
# line's to say, never a stored config's (an evaluated checkpoint from elsewhere wrote cache
# entries into, and evicted files from, the folder it named, and started the 40 workers it
# named): each is replaced by the value here unless this command line gives one.
LOCAL_DATA_KEYS = {
    "download": False,  # a download only for data.download=true given here
    "cache": "off",  # an image folder's cache: evaluation reads each image once anyway
    "cache_dir": None,  # <data.root>/.torchloom-cache, for data.cache=... given here
    "cache_max_gb": None,  # half the memory available here
    "shard_cache_gb": 0,  # row groups are read once: nothing kept
    "shard_cache_dir": None,  # ~/.cache/torchloom/shards, for data.shard_cache_gb given here
    "num_workers": None,  # one per core here, at most 8
    "tokenizer_cache": None,  # ~/.cache/torchloom/tokenizers (the stored tokenizer is used)
}


def data_config(stored: dict, overrides: DictConfig, record: Any = None) -> DictConfig:
    """The checkpoint's data config with the non-null ``data.*`` overrides applied; ``auto``
    channels and statistics are those its inputs ``record`` (a checked
    :class:`utils.checkpoint.record.InputRecord`) says training chose, not refitted. The stored
    values of :data:`LOCAL_DATA_KEYS` are not followed. A value training read from the
    environment (recorded as ``${oc.env:NAME}``, never resolved from a file) must be given
    here: one line names the key."""
    merged = dict(stored)
    merged.update({key: value for key, value in LOCAL_DATA_KEYS.items() if key in merged})
    if record is not None:
        chosen = {"channels": record.input_shape[0], "mean": record.mean, "std": record.std}
        merged.update({key: value for key, value in chosen.items() if merged.get(key) == "auto"})
    for key, value in OmegaConf.to_container(overrides).items():
        if value is None:
            continue
        if key == "batch_size":  # evaluation batches are the run's eval_batch_size
            POSITIVE_INT.check("data.batch_size", value)
            key = "eval_batch_size"
        if key not in merged:
            raise UserError(f"data.{key} does not apply to {stored['_target_']}")
        merged[key] = value
    for key, value in walk_keys(merged, "data"):
        if isinstance(value, str) and INTERPOLATION in value:  # only ${oc.env:NAME} is let in
            raise UserError(
                f"{key}={value}: training read it from the environment, and a stored config's "
                f"interpolations are never resolved; give {key}=... on this command line"
            )
    return OmegaConf.create(merged)


@contextlib.contextmanager
def reading_stored_data(node: DictConfig, overrides: DictConfig) -> Iterator[None]:
    """Reading the data a stored config names: a refusal names the path, never what the file
    holds (its columns, a cell), since this command line did not name that file; the stored
    path could be any file. With ``data.path``/``data.root`` given here, errors are as usual."""
    try:
        yield
    except UserError:
        named_here = any(overrides.get(key) is not None for key in ("path", "root"))
        key = "path" if node.get("path") else "root"
        where = node.get(key)
        if named_here or where is None or not Path(str(where)).exists():  # nothing to hide
            raise
        raise UserError(
            f"the checkpoint's data.{key}={where} does not hold the data it was "
            "trained on (what it holds is not shown: the path came from the "
            f"checkpoint); pass data.{key}=... to name the data here"
        ) from None


def keep_average(
    model: Any,
    stored: tuple[dict, dict | None],
    copies: list[Path],
    path: Path,
    refitted: str,
    out: Any,
) -> None:
    """The averaged weights (with their refitted statistics) as a checkpoint evaluate.py,
    predict.py and init_from read: the ``stored`` config and inputs record beside them."""
    config, inputs = stored
    save_atomic(
        averaged_checkpoint(
            model=model.state_dict(),
            config=config,
            inputs=inputs,
            classes=(inputs or {}).get("classes"),
            averaged_from=[str(p) for p in copies],
        ),
        path,
    )
    out.print(
        f"averaged {len(copies)} top-k copies ({', '.join(p.name for p in copies)}) into "
        f"{path}{refitted}"
    )
