"""What produced a run: the command, the code (git commit, dirty flag, the diff's sha256, the
user modules a ``_target_`` names), the installed packages, the machine, and the data by
content (data/batching/fingerprint.py). Written at start by the process that writes, to
``runs/<run>/provenance.json`` and into every checkpoint (``provenance``); a requeued or
resumed run keeps the first record and adds an entry per attempt.

Every probe that fails is recorded as unavailable, with why: a run never fails because git is
missing or the project is not a repository. Nothing secret is recorded by default: no
environment variables, and the diff itself only with ``provenance.save_diff=true``, into the
run folder alone, never to a tracker.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from data.batching.fingerprint import changes, membership, overlap, sample_hashes
from utils.checkpoint.load import load_checkpoint
from utils.config.schema import CONF
from utils.config.secrets import redacted_argv, secret_values
from utils.config.trust import plain_data, targets_in
from utils.errors import UserError
from utils.files import file_sha256
from utils.text import shown

log = logging.getLogger("torchloom")
ROOT = CONF.parent  # the project: its git repository
OWN_PACKAGES = ("utils", "data", "models")  # torchloom's own modules: the commit covers them
GIT_TIMEOUT = 10  # seconds: a hung git is recorded as unavailable, not waited on
MAX_DIFF_BYTES = 256 * 2**20  # a diff larger than this is hashed no further (recorded so)


def _git(*args: str) -> bytes:
    result = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, timeout=GIT_TIMEOUT, check=True
    )
    return result.stdout


OWN_SOURCES = ("models", "utils", "data", "conf", "train.py", "evaluate.py", "predict.py")


def source_sha256() -> str:
    """The sha256 of the project's own source files (their paths and bytes): what the code
    was, with git or without it, untracked files included."""
    digest = hashlib.sha256()
    files = [ROOT / name for name in OWN_SOURCES if (ROOT / name).is_file()]
    for folder in (ROOT / name for name in OWN_SOURCES if (ROOT / name).is_dir()):
        files += [p for p in folder.rglob("*") if p.suffix in (".py", ".yaml")]
    for path in sorted(p for p in files if "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(ROOT).as_posix()}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def code_record(save_diff: Path | None = None) -> dict[str, Any]:
    """The project's commit, whether its files differ from it (tracked files changed, or
    source files git does not track: a model added as docs/extending.md says), the sha256 of
    ``git diff HEAD`` (the diff itself written to ``save_diff`` when given), each untracked
    source file's sha256, and the sha256 of all its source files. A project that is not a
    repository of its own (a copy inside another one) records no commit, with why."""
    record: dict[str, Any] = {"torchloom": _version("torchloom"), "source_sha256": source_sha256()}
    try:
        top = Path(_git("rev-parse", "--show-toplevel").decode().strip()).resolve()
        if top != ROOT.resolve():
            why = f"the project is not a git repository of its own (it lies inside {top})"
            return {**record, "commit": None, "dirty": None, "unavailable": why}
        record["commit"] = _git("rev-parse", "HEAD").decode().strip()
        diff = _git("diff", "HEAD", "--binary")
        listed = _git("ls-files", "--others", "--exclude-standard", "-z", "--", *OWN_SOURCES)
    except FileNotFoundError:
        return {**record, "commit": None, "dirty": None, "unavailable": "git is not installed"}
    except subprocess.TimeoutExpired:
        return {**record, "commit": None, "dirty": None, "unavailable": "git did not answer"}
    except subprocess.CalledProcessError as error:
        why = error.stderr.decode(errors="replace").strip().splitlines()[:1] or ["git failed"]
        return {**record, "commit": None, "dirty": None, "unavailable": why[0][:200]}
    untracked = sorted(
        name
        for name in listed.decode(errors="replace").split("\0")
        if name.endswith((".py", ".yaml"))
    )
    record["untracked"] = {name: file_sha256(ROOT / name) for name in untracked}
    record["dirty"] = bool(diff) or bool(untracked)
    record["diff_sha256"] = hashlib.sha256(diff).hexdigest() if diff else None
    if save_diff is not None and diff:
        save_diff.write_bytes(diff[:MAX_DIFF_BYTES])
        record["diff_file"] = save_diff.name
    return record


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def packages() -> dict[str, str]:
    """Every installed distribution's version, as this process would import it: read from the
    names of the ``*.dist-info`` folders on ``sys.path`` (``name-version.dist-info``), the first
    of a name winning as for an import; no subprocess and no metadata file parsed (that took
    half a second)."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = [e.name for e in os.scandir(entry or ".") if e.name.endswith(".dist-info")]
        except OSError:
            continue
        for name in sorted(names):
            project, _, version = name.removesuffix(".dist-info").rpartition("-")
            if project and version:
                found.setdefault(project.lower().replace("_", "-").replace(".", "-"), version)
    return dict(sorted(found.items()))


def user_modules(config: dict) -> dict[str, Any]:
    """The sha256 of each module a ``_target_`` names that is neither torchloom's own nor an
    installed package's (a ``model=`` or callback of one's own, even one kept in the project's
    folder, where ``git diff`` would not see it untracked), by module name."""
    found: dict[str, Any] = {}
    installed = {Path(p).resolve() for p in sys.path if "site-packages" in p}
    for target in sorted(targets_in(config)):
        module = target.rpartition(".")[0]
        try:
            spec = importlib.util.find_spec(module) if module else None
        except (ImportError, ValueError):
            spec = None
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin is None or not origin.is_file():
            continue
        own = any(origin.is_relative_to(ROOT / package) for package in OWN_PACKAGES)
        if own or any(origin.is_relative_to(p) for p in installed):
            continue
        found[module] = {
            "path": str(origin),
            "sha256": file_sha256(origin),
        }
    return found


def machine(processes: Any) -> dict[str, Any]:
    """Python, torch, torchvision, CUDA and cuDNN versions; the host, CPU and GPU models."""
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "torchvision": _version("torchvision"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "world_size": processes.world_size,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def attempt(resumed_from: Any, secrets: list[str], data_changes: Any = None) -> dict[str, Any]:
    """One attempt at the run: when, where, from which checkpoint, and any data change it
    was allowed to go on with."""
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "argv": redacted_argv(sys.argv, secrets),
        "resumed_from": str(resumed_from) if resumed_from else None,
        "data_changes": data_changes,
    }


# --- The record, at a run's start ------------------------------------------------------------

SHA256_HEX = 64
MAX_SAMPLES = 2**31  # per split: a stored hash list longer than this was not written by a run


def record_at_start(cfg: Any, data: Any, run: Any, processes: Any) -> dict[str, Any]:
    """The run's provenance: a fresh one, or on resume the checkpoint's first record with this
    attempt added. Data that changed since the checkpoint is refused in one line saying what
    changed, unless ``resume_allow_changes=true`` (then recorded in this attempt)."""
    # A resume compares the data with the checkpoint's: a split read lazily is decoded for it.
    fingerprint = data.fingerprint(decode=bool(run.resumed))
    now = {key: fingerprint[key] for key in ("sources", "splits", "samples", "listings")}
    if "objects" in fingerprint:  # shards: each object's footprint, to name what changed
        now["objects"] = fingerprint["objects"]
    diff = Path(run.run_dir) / "code.diff" if cfg.provenance.save_diff else None
    code = code_record(diff if processes.is_main else None)
    stored = checked(run.resumed[1].get("provenance"), run.resumed[0]) if run.resumed else None
    changed = data_changes(stored["data"], now) if stored else None
    if changed and not cfg.resume_allow_changes:
        raise UserError(
            f"the data changed since {run.resumed[0]}: {describe(changed)}; resuming would "
            "train on other data as one run. Start a new run, or resume anyway with "
            "resume_allow_changes=true (recorded in provenance.json)"
        )
    secrets = secret_values(cfg)
    resumed_from = run.resumed[0] if run.resumed else None
    this = {**attempt(resumed_from, secrets, changed), "code": _short(code)}
    this["config"] = run.record.resolved  # as this attempt ran it (compare.py reads the last)
    if stored:
        return {**stored, "data": now, "attempts": [*stored["attempts"], this]}
    command = {
        "argv": redacted_argv(sys.argv, secrets),
        "overrides": list(run.record.overrides),
        "seed": cfg.seed,
        "deterministic": bool(cfg.trainer.deterministic),
    }
    return {
        "command": command,
        "code": {**code, "modules": user_modules(run.record.resolved)},
        "packages": packages(),
        "machine": machine(processes),
        "data": now,
        "attempts": [this],
    }


def _short(code: dict) -> dict:
    return {key: code.get(key) for key in ("commit", "dirty", "diff_sha256", "source_sha256")}


def data_changes(before: dict, now: dict) -> dict | None:
    """Per split, the samples added and removed since ``before`` (None when nothing changed).
    A split is compared by content where both records hold it, else by its image files'
    listing (a split read lazily, data.cache=off, when it was recorded); a split neither
    record can compare (a record that predates listings) counts as unchanged, said once."""
    changed = {}
    listed = (before.get("listings") or {}), (now.get("listings") or {})
    splits = set(before["splits"]) | set(now["splits"]) | set(listed[0]) | set(listed[1])
    for split in sorted(splits):
        old, new = before["splits"].get(split), now["splits"].get(split)
        if old is not None and new is not None and old["sha256"] == new["sha256"]:
            continue
        if old is None or new is None:
            listings = listed[0].get(split), listed[1].get(split)
            if None in listings:
                log.info("%s split: the checkpoint's record cannot be compared with it", split)
            elif listings[0] != listings[1]:
                changed[split] = {"added": None, "removed": None, "by": "listing"}
                objects = _objects_changed(before, now, split)
                if objects is not None:
                    changed[split]["objects"] = objects
            continue
        old_hashes, new_hashes = before["samples"].get(split), now["samples"].get(split)
        if old_hashes is None or new_hashes is None:
            changed[split] = {"added": None, "removed": None}
        else:
            added, removed = changes(old_hashes, new_hashes)
            changed[split] = {"added": added, "removed": removed}
    return changed or None


def _objects_changed(before: dict, now: dict, split: str) -> list[str] | None:
    """The objects (shards) of ``split`` that changed, were added or were removed, by name,
    where both records name them (None where either predates it)."""
    old = (before.get("objects") or {}).get(split)
    new = (now.get("objects") or {}).get(split)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    return sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))


def describe(changed: dict) -> str:
    """``train: 1 sample added, 0 removed; val: ...`` (a changed sample counts as both)."""
    parts = []
    for split, counts in changed.items():
        if counts.get("objects"):  # shards: name the objects (a list read from a record)
            names = [shown(str(name)) for name in counts["objects"][:3]]
            more = len(counts["objects"]) - len(names)
            parts.append(
                f"{split}: these objects differ (name, size, version or Parquet footer): "
                f"{', '.join(names)}{f' and {more} more' if more > 0 else ''}"
            )
        elif counts.get("by") == "listing":
            parts.append(
                f"{split}: its image files differ (names, sizes or modification times; read "
                "with data.cache=off, their content was not recorded)"
            )
        elif counts["added"] is None:
            parts.append(f"{split}: its samples differ")
        else:
            parts.append(f"{split}: {counts['added']} sample(s) added, {counts['removed']} removed")
    return "; ".join(parts)


def checked(stored: Any, source: Any) -> dict | None:
    """A checkpoint's ``provenance`` (untrusted): None when it predates the record; else its
    shape checked (types, sizes, hash strings) or one line naming what is wrong."""
    if stored is None:
        return None

    def bad(what: str) -> UserError:
        return UserError(
            f"{source}: its provenance record {what} (was it edited?); "
            "use init_from=... to start from its weights"
        )

    if not isinstance(stored, dict) or not isinstance(stored.get("data"), dict):
        raise bad("is not what torchloom writes")
    if not plain_data(json_part(stored)):  # all but the sample hashes: JSON's kinds, bounded
        raise bad("holds something other than plain data (or is over its size bound)")
    if not isinstance(stored.get("attempts"), list) or len(stored["attempts"]) > 100_000:
        raise bad("has no list of attempts")
    if not all(isinstance(entry, dict) for entry in stored["attempts"]):
        raise bad("has an attempt that is not a mapping")
    for key in ("command", "code", "packages", "machine"):
        if not isinstance(stored.get(key, {}), dict):
            raise bad(f"has a {key} that is not a mapping")
    data = stored["data"]
    splits, samples = data.get("splits"), data.get("samples", {})
    if not isinstance(splits, dict) or not isinstance(samples, dict):
        raise bad("has no data splits")
    for name, split in splits.items():
        ok = isinstance(split, dict) and isinstance(split.get("sha256"), str)
        if not ok or len(split["sha256"]) != SHA256_HEX or not isinstance(split.get("count"), int):
            raise bad(f"has a malformed split {shown(name)}")
    listings = data.get("listings", {})
    if not isinstance(listings, dict) or not all(
        isinstance(sha, str) and len(sha) == SHA256_HEX for sha in listings.values()
    ):
        raise bad("has malformed file listings")
    for name, hashes in samples.items():
        ok = isinstance(hashes, torch.Tensor) and hashes.dtype == torch.int64
        if not ok or hashes.dim() != 1 or len(hashes) > MAX_SAMPLES:
            raise bad(f"has malformed sample hashes for {shown(name)}")
    return stored


def json_part(record: dict) -> dict:
    """The record as provenance.json holds it: without the per-sample hashes."""
    data = {key: value for key, value in record["data"].items() if key != "samples"}
    return {**record, "data": data}


def recorded(cfg: Any, data: Any, run: Any, processes: Any, out: Any) -> Any:
    """``run.record`` with the run's provenance (:func:`record_at_start`), which is also
    written to ``runs/<run>/provenance.json`` by the process that writes."""
    record = record_at_start(cfg, data, run, processes)
    out.write_json("provenance.json", json_part(record))
    return run.record.with_provenance(record)


def split_check(checkpoint: dict, path: Any, data: Any, split: str) -> dict[str, Any]:
    """Whether ``split`` of ``data`` is the split training held out (the same samples; for
    shards, objects), and how many of its samples the checkpoint was trained on: for
    evaluate.py's metrics.json, said in a line (null, null: a record that predates it)."""
    stored = checked(checkpoint.get("provenance"), path)
    if stored is None or split not in data.splits or data.splits[split] is None:
        log.info("%s split: the checkpoint records no data fingerprint to compare it with", split)
        return {"split_matches_training": None, "overlap_with_training": None}
    hashes = data.split_hashes(split, decode=True)
    if hashes is None:  # shards: compared by what their objects are, not read again
        listed = (stored["data"].get("listings") or {}).get(split)
        matches = listed is not None and listed == data.listings.get(split)
        level, same = (logging.INFO, "") if matches else (logging.WARNING, "not ")
        log.log(level, "%s split: %sthe same objects and row groups as training's", split, same)
        return {"split_matches_training": matches, "overlap_with_training": None}
    held_out = stored["data"]["splits"].get(split, {}).get("sha256")
    matches = held_out == membership(hashes)
    trained = stored["data"]["samples"].get("train")
    overlapping = None if trained is None else overlap(hashes, trained)
    same = "the same" if matches else "not the same"
    trained_on = f"; {overlapping} of its {len(hashes)} samples were trained on" * bool(overlapping)
    level = logging.INFO if matches and (split == "train" or not overlapping) else logging.WARNING
    log.log(
        level,
        "%s%s split: %s samples as training's %s split%s",
        "warning: " if level == logging.WARNING else "",
        split,
        same,
        split,
        trained_on,
    )
    return {"split_matches_training": matches, "overlap_with_training": overlapping}


def prediction_record(checkpoint: Path, source: Path, inputs: torch.Tensor) -> dict[str, Any]:
    """What predict.py's output was made from, for ``<out>.provenance.json``: the checkpoint
    (its file's sha256, and the commit and data fingerprint it records) and the inputs (their
    count and the sha256 of their decoded content)."""
    stored = {}
    if checkpoint.suffix != ".safetensors":
        stored = checked(load_checkpoint(checkpoint).get("provenance"), checkpoint) or {}
    data = stored.get("data", {})
    hashes = sample_hashes(inputs, torch.zeros(len(inputs), dtype=torch.int64))
    return {
        "checkpoint": {
            "path": str(checkpoint),
            "sha256": file_sha256(checkpoint),
            "code": _short(stored.get("code", {})) if stored else None,
            "data": {"sources": data.get("sources"), "splits": data.get("splits")}
            if data
            else None,
        },
        "inputs": {"path": str(source), "count": len(inputs), "content_sha256": membership(hashes)},
    }
