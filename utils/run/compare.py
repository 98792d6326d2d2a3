"""Why two runs differ: their configs, code, packages, machine and data, grouped, each read
from a run folder (its ``provenance.json``: the config of its last attempt), a checkpoint
folder (its ``last.pt``) or a checkpoint file, as untrusted data (compare.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from utils.checkpoint.load import load_checkpoint
from utils.config.build import flatten
from utils.errors import UserError
from utils.files import read_json_object
from utils.run.provenance import checked
from utils.run.resume_changes import INVOCATION_KEYS

MAX_DEPTH = 64  # nesting deeper than any record or config torchloom writes
GROUPS = ("config", "code", "packages", "machine", "data")


def read_run(path: Path) -> tuple[dict, dict]:
    """(config, provenance) of a run folder, a checkpoint folder or a checkpoint file, each
    nested no deeper than :data:`MAX_DEPTH` (what is compared is walked recursively)."""
    config, provenance = _read(path)
    for part in (config, provenance):
        if _too_deep(part):
            raise UserError(
                f"{path}: its record nests deeper than torchloom writes; was it edited?"
            )
    return config, provenance


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests containers deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return False


def _read(path: Path) -> tuple[dict, dict]:
    if path.is_dir() and (path / "provenance.json").is_file():
        record = read_json_object(path / "provenance.json")
        attempts = record.get("attempts")
        last = attempts[-1] if isinstance(attempts, list) and attempts else {}
        config = last.get("config") if isinstance(last, dict) else None
        return (config if isinstance(config, dict) else {}), record
    file = path / "last.pt" if path.is_dir() else path
    if not file.is_file():
        raise UserError(
            f"{path}: neither a run folder (with provenance.json) nor a checkpoint; give "
            "runs/<run>, checkpoints/<run> or a .pt file"
        )
    stored = load_checkpoint(file)
    provenance = checked(stored.get("provenance"), file)
    if provenance is None:
        raise UserError(f"{file} predates the provenance record; compare runs trained since")
    config = stored.get("config")
    return (config if isinstance(config, dict) else {}), provenance


def differences(first: tuple[dict, dict], second: tuple[dict, dict]) -> dict[str, list]:
    """Per group, the ``(key, first's value, second's value)`` that differ."""
    (config_a, prov_a), (config_b, prov_b) = first, second
    found = {
        "config": _diff(_config(config_a), _config(config_b)),
        "code": _diff(_flat(prov_a.get("code")), _flat(prov_b.get("code"))),
        "packages": _diff(_dict(prov_a.get("packages")), _dict(prov_b.get("packages"))),
        "machine": _diff(_flat(prov_a.get("machine")), _flat(prov_b.get("machine"))),
    }
    data_a, data_b = _dict(prov_a.get("data")), _dict(prov_b.get("data"))
    found["data"] = _diff(_data(data_a), _data(data_b))
    return found


def _data(data: dict) -> dict:
    """Per source and per split: what the data is (the per-sample hashes are not shown)."""
    return flatten({"sources": _dict(data.get("sources")), "splits": _dict(data.get("splits"))})


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _flat(value: Any) -> dict:
    return flatten(_dict(value))


def _config(config: dict) -> dict:
    """The config's keys that say what the run is (not how it was started: run_name, resume)."""
    return {
        key: value
        for key, value in flatten(config).items()
        if key.split(".")[0] not in (*INVOCATION_KEYS, "hydra")
    }


def _diff(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    absent = "(absent)"
    return [
        (key, a.get(key, absent), b.get(key, absent))
        for key in sorted(set(a) | set(b), key=str)
        if a.get(key, absent) != b.get(key, absent)
    ]
