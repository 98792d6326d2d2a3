"""What a config read from a file may build.

A config stored in a checkpoint (or a ``.safetensors`` export, or a YAML file given to
``evaluate.py config=``) came from elsewhere, so it is data, never code:

- no interpolation anywhere in it, keys included (``${oc.create:...}`` would build objects the
  check below never saw, ``${oc.env:...}`` would read the environment);
- no Hydra instantiation key but ``_target_`` (and the optimizer's ``_partial_: true``):
  ``_recursive_``, ``_convert_``, ``_args_`` or a ``_partial_`` elsewhere change what building does;
- every ``_target_`` anywhere in the tree, nested ones and those inside ``_args_`` included, is
  one of its own group's exact list: the ``_target_`` values of ``conf/<group>/*.yaml`` (and of
  that group's node in the presets under ``conf/experiment/``), plus ``torch.optim``'s
  optimizer classes for ``optim``. A model's node may name no data loader, nor a task a logger:
  each group builds only what that group builds. No package prefix is trusted, and nothing is
  imported to decide. A model of one's own (``conf/model/<name>.yaml``) is in the model group's
  list as soon as its YAML file is there, as docs/extending.md says.

The check runs before anything in the config is resolved, imported or built. A stored
config's ``callbacks`` (the user's code that train.py ran) are dropped unread first: only
train.py builds callbacks, from its own command line. A logger's setting read from the
environment is stored as its ``${oc.env:NAME}`` (utils/config/secrets.py); only train.py builds
loggers, so that one interpolation is let be there, and never resolved; so is a data value's,
which evaluate.py replaces with its own command line's or refuses, naming the key.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from utils.config.schema import CONF
from utils.errors import UserError

# The groups a stored config holds builders of (conf/hydra and the callbacks in train.yaml are
# Hydra's own, never stored).
BUILDER_GROUPS = (
    "model",
    "data",
    "optim",
    "scheduler",
    "precision",
    "task",
    "experiment",
    "logger",
)
OPTIMIZERS = (
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "Adadelta",
    "Adagrad",
    "ASGD",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "LBFGS",
    "SparseAdam",
    "Adafactor",
    "Muon",
)
INTERPOLATION = "${"
ENVIRONMENT = re.compile(r"\$\{oc\.env:[A-Za-z_][A-Za-z0-9_]*\}")  # a setting as a run records it
# Hydra's instantiation keys besides _target_ (_partial_, _recursive_, _convert_, _args_) change
# what building does; a stored config may hold one only as torchloom's own conf/ files do.
STORED_SPECIAL_KEYS = {"optim._partial_": True}
# Where a stored config may hold a value training read from the environment, as the record
# writes it (``${oc.env:NAME}``, never resolved from a file): a logger's setting, built only by
# train.py; and a data value (``data.root=${oc.env:DATA}``), which evaluate.py takes only from
# its own command line (utils/checkpoint/stored.py data_config).
READ_FROM_ENVIRONMENT = ("logger.", "data.")
# The most keys and values a stored config holds, and its model node: a model takes a few
# dozen, its lists of layer sizes hundreds at most. Read as data first, they bound the config
# handling before any build: an edited config of 100,000 hidden layers took 19 s, one with a
# list of a million values under data 111 s, before the build refused them.
MAX_STORED_VALUES = 100_000
MAX_MODEL_VALUES = 4096


# Builders whose module moved since a checkpoint was written: a stored config naming the old
# path means the builder at the new one. Applied as the config is read (load_checkpoint, an
# export's or a YAML file's config), before the allowlist check and before a resume compares
# configs. The loggers moved (conf/logger), and the data builders into their families' folders
# (data/images/, data/tables/, data/arrays/, data/shards/); every other stored path is where it was.
MOVED_TARGETS = {
    "utils.trackers.TensorBoard": "utils.tracking.local.TensorBoard",
    "utils.trackers.CsvLog": "utils.tracking.local.CsvLog",
    "utils.tracker_mlflow.Mlflow": "utils.tracking.mlflow.Mlflow",
    "utils.tracker_wandb.Wandb": "utils.tracking.wandb.Wandb",
    "data.digits.load_digits": "data.images.digits.load_digits",
    "data.mnist.load_mnist": "data.images.mnist.load_mnist",
    "data.cifar10.load_cifar10": "data.images.cifar10.load_cifar10",
    "data.torchvision_datasets.load_torchvision": "data.images.torchvision_datasets.load_torchvision",
    "data.imagefolder.load_imagefolder": "data.images.imagefolder.load_imagefolder",
    "data.image_manifest.load_image_csv": "data.images.image_manifest.load_image_csv",
    "data.tabular.load_csv": "data.tables.tabular.load_csv",
    "data.tensors.load_tensors": "data.arrays.tensors.load_tensors",
    "data.synthetic.load_synthetic": "data.arrays.synthetic.load_synthetic",
    "data.parquet.load_parquet": "data.shards.parquet.load_parquet",
}


def with_current_targets(config: Any) -> Any:
    """``config`` (plain containers) with every ``_target_`` that moved renamed to where its
    builder lives now (:data:`MOVED_TARGETS`); everything else as it was."""
    if isinstance(config, dict):
        return {
            key: MOVED_TARGETS.get(value, value)
            if key == "_target_" and isinstance(value, str)
            else with_current_targets(value)
            for key, value in config.items()
        }
    if isinstance(config, list):
        return [with_current_targets(value) for value in config]
    return config


def without_callbacks(config: Any) -> Any:
    """``config`` without its ``callbacks`` node: never built from a file, never checked."""
    if not isinstance(config, dict):
        return config
    return {key: value for key, value in config.items() if key != "callbacks"}


@cache
def builders_at() -> dict[str, frozenset[str]]:
    """For each key where torchloom's own YAML files hold a ``_target_`` (``model._target_``,
    ``logger.csv._target_``), the exact strings a stored config may name there: those of
    ``conf/<group>/*.yaml`` at that key, of the presets' group nodes (``conf/experiment/``),
    and at ``optim._target_`` the optimizer classes of ``torch.optim``. A builder is allowed
    only where its own group holds it: no data loader inside ``data.augment``."""
    import yaml

    places: dict[str, set[str]] = {"optim._target_": {f"torch.optim.{n}" for n in OPTIMIZERS}}
    presets = [yaml.safe_load(p.read_text()) for p in sorted((CONF / "experiment").glob("*.yaml"))]
    for group in BUILDER_GROUPS:
        nodes = [yaml.safe_load(p.read_text()) for p in sorted((CONF / group).glob("*.yaml"))]
        nodes += [preset.get(group) for preset in presets if isinstance(preset, dict)]
        for node in nodes:
            for key, value in walk_keys(node, group):
                if key.endswith("._target_") and isinstance(value, str):
                    places.setdefault(key, set()).add(value)
    return {key: frozenset(targets) for key, targets in places.items()}


def group_builders(group: str) -> frozenset[str]:
    """Every ``_target_`` string a stored config's ``group`` node may name somewhere."""
    places = builders_at()
    return frozenset().union(*(places[k] for k in places if k.split(".", 1)[0] == group))


def allowed_builders() -> frozenset[str]:
    """Every ``_target_`` string some group of a stored config may name."""
    return frozenset().union(*(group_builders(group) for group in BUILDER_GROUPS))


def targets_in(node: Any) -> set[str]:
    """Every ``_target_`` string in plain containers ``node``, nested ones included."""
    if isinstance(node, dict):
        found = {node["_target_"]} if isinstance(node.get("_target_"), str) else set()
        for value in node.values():
            found |= targets_in(value)
        return found
    if isinstance(node, list):
        return set().union(*(targets_in(value) for value in node)) if node else set()
    return set()


def check_stored_config(config: Any, source: Path | str) -> None:
    """Refuse ``config`` (plain containers read from ``source``) if it holds an interpolation
    or a ``_target_`` that is not one torchloom's YAML files hold at that key
    (:func:`builders_at`), naming the key."""
    _check_size(config, source)
    for key, value in walk_keys(config, ""):
        recorded_environment = key.startswith(READ_FROM_ENVIRONMENT) and ENVIRONMENT.fullmatch(
            str(value)
        )
        if isinstance(value, str) and INTERPOLATION in value and not recorded_environment:
            raise UserError(
                f"refusing the config stored in {source}: {key}={value!r} is an interpolation, "
                "and a stored config is data; the file may be hostile, so nothing was built"
            )
        is_target = key.rsplit(".", 1)[-1] == "_target_"
        group = re.split(r"[.\[]", key, maxsplit=1)[0]
        if is_target and not (isinstance(value, str) and value in builders_at().get(key, ())):
            which = (
                f"for {group} (the _target_s in conf/{group}/)"
                if group in BUILDER_GROUPS
                else f"(a stored {group} builds nothing)"
            )
            raise UserError(
                f"refusing the config stored in {source}: {key}={value!r} is not one of "
                f"torchloom's builders {which}; the file may be hostile, so nothing was "
                "built or imported"
            )
    for key, value in walk_keys(config, ""):
        name = key.rsplit(".", 1)[-1]
        special = len(name) > 2 and name.startswith("_") and name.endswith("_")
        if special and name != "_target_" and STORED_SPECIAL_KEYS.get(key, ...) is not value:
            raise UserError(
                f"refusing the config stored in {source}: {key}={value!r} changes how it is "
                "built, and torchloom never stores it so; the file may be hostile, so nothing "
                "was built"
            )


def _check_size(config: Any, source: Path | str) -> None:
    """``config`` holds at most :data:`MAX_STORED_VALUES` keys and values, its model node at
    most :data:`MAX_MODEL_VALUES`: counted as they are walked, so a vast one stops early."""
    total = model = 0
    for key, _ in walk_keys(config, ""):
        total, model = total + 1, model + key.startswith("model.")
        if total > MAX_STORED_VALUES or model > MAX_MODEL_VALUES:
            node, most = (
                ("model node", MAX_MODEL_VALUES)
                if model > MAX_MODEL_VALUES
                else ("config", MAX_STORED_VALUES)
            )
            raise UserError(
                f"refusing the config stored in {source}: its {node} holds more than "
                f"{most:,} keys and values (counted up to {key.split('[')[0]}), more than "
                "torchloom writes; the file may be hostile (edited), so nothing was built"
            )


def walk_keys(node: Any, where: str):
    """(dotted key, value) for every key and leaf of plain containers."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if not isinstance(key, str) or INTERPOLATION in key:
                raise UserError(
                    f"refusing a stored config: key {path!r} is not a plain name; "
                    "the file may be hostile, so nothing was built"
                )
            yield path, value
            yield from walk_keys(value, path)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            path = f"{where}[{index}]"
            yield path, value
            yield from walk_keys(value, path)


def require_keys(config: Any, source: Path | str, keys: dict[str, type]) -> None:
    """``config`` is a dict with each of ``keys`` of its type: one line naming what is not."""
    if not isinstance(config, dict):
        raise UserError(f"{source} holds no torchloom config; it cannot be rebuilt from the file")
    for key, kind in keys.items():
        if not isinstance(config.get(key), kind):
            raise UserError(
                f"{source}: its stored config has no valid {key!r}; it was not written by "
                "torchloom (or was edited), so it cannot be rebuilt from the file"
            )


PLAIN_LEAVES = (str, int, float, bool, type(None))
MAX_PLAIN_DEPTH = 16
MAX_PLAIN_SIZE = 16 * 2**20  # characters and items of a stored record's plain part, together


def plain_data(value: Any, max_size: int = MAX_PLAIN_SIZE) -> bool:
    """Whether ``value`` (read from a file) is plain data within bounds: strings, numbers,
    booleans, None, lists and dicts with string keys, at most :data:`MAX_PLAIN_DEPTH` deep and
    ``max_size`` characters and items in all. Walked without recursion, so a record nested
    deeper than Python's stack, or one holding a tensor or a vast string, is a plain ``False``."""
    stack, size = [(value, 0)], 0
    while stack:
        node, depth = stack.pop()
        size += len(node) + 1 if isinstance(node, str | list | tuple | dict) else 1
        if depth > MAX_PLAIN_DEPTH or size > max_size:
            return False
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node):
                return False
            size += sum(len(key) for key in node)
            stack.extend((item, depth + 1) for item in node.values())
        elif isinstance(node, list | tuple):
            stack.extend((item, depth + 1) for item in node)
        elif not isinstance(node, PLAIN_LEAVES):
            return False
    return True


FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32: a divisor below it is 0 or inf
FLOAT32_MAX = 3.4028234663852886e38


def stored_floats(value: Any, count: int, divisor: bool = False) -> bool:
    """Whether ``value`` (read from a file) is a list of ``count`` numbers that stay finite as
    float32, the dtype they are applied in; a ``divisor`` (a standard deviation) is also at
    least float32's smallest normal number, so dividing by it gives no inf or NaN."""
    return (
        isinstance(value, list)
        and len(value) == count
        and all(
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and abs(v) <= FLOAT32_MAX
            and (not divisor or v >= FLOAT32_TINY)
            for v in value
        )
    )
