"""Where a run's history goes, and how far it may run ahead of the checkpoint: the one owner.

The loop, validation and the test send their points (``scalar``), images and text here; the
backends ``logger=`` chooses (conf/logger/: tensorboard, csv, mlflow, wandb, or several with
``logger=[tensorboard,mlflow]``) receive them. What every backend shows never runs past what
``last.pt`` can continue, so after a kill anywhere and ``resume=auto`` each one holds the same
steps as a run never interrupted: no duplicates, no gaps.

- A backend that can drop what ran ahead (TensorBoard's purge step; the CSV file, truncated to
  the length the checkpoint recorded) gets each point at once, and is flushed before each
  checkpoint is written, so the checkpoint never claims points that are not on disk.
- A backend that cannot (MLflow, W&B) gets a checkpoint's points only once the checkpoint is
  written. They travel inside the checkpoint too (``tracking.pending``), so a resume sends any
  the kill kept from being sent; the backend skips those it already holds (MLflow: its metric
  history; W&B: its rule that a step is logged once). W&B writes what it is sent only when
  its run finishes, so the checkpoint also carries what it was sent (``unconfirmed``).
- The final test's points (``test/...``) go to every backend when the run finishes, with its
  summary: a run resumed after its last checkpoint logs them once.

Each checkpoint records each backend's run (the MLflow run id, the W&B run id), so a resumed
run continues the same tracked run; a run that ends by an error or a stop is marked failed or
killed, a finished one finished. Only the process that writes the run's files tracks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from utils.config.build import build
from utils.errors import UserError
from utils.files import write_json
from utils.system.signals import Interrupted
from utils.tracking.process import in_own_process

log = logging.getLogger("torchloom")
FINAL = "test/"  # points of the final test: sent when the run finishes, with its summary
TOKEN = re.compile(r"[0-9a-f]{32}")
SIDECAR = ".tracking.json"  # the step each tracked run was last committed at, in the run dir
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"


class Point(NamedTuple):
    step: int
    epoch: int
    tag: str
    value: float


@dataclass(frozen=True)
class TrackedRun:
    """What a backend needs to name and describe the run it tracks."""

    name: str  # run_name; in a sweep, the sweep's (jobs are grouped by it)
    job: str | None  # a sweep job's number, else None
    run_dir: Path
    config: dict  # the resolved config
    runs_root: Path  # paths.runs (where a local MLflow store lives)
    token: str = ""  # names this run's tracked runs from its first checkpoint on (a resume
    # finds an MLflow run by it even if the kill came before a checkpoint recorded its id)

    @property
    def display_name(self) -> str:
        return self.name if self.job is None else f"{self.name}/{self.job}"

    @property
    def experiment(self) -> str:
        """The run name's first part (``cifar/resnet-lr0.1`` → ``cifar``), else torchloom."""
        return self.name.split("/", 1)[0] if "/" in self.name else "torchloom"


def provenance_tags(run_dir: Path) -> dict[str, str]:
    """What a tracked run is tagged with from the run's provenance.json (utils/run/
    provenance.py, written before tracking starts): the git commit as MLflow names it, the
    dirty flag and the data fingerprint. Never the diff; {} when the record is absent."""
    try:
        record = json.loads((run_dir / "provenance.json").read_text())
        code, sources = record.get("code") or {}, record["data"].get("sources") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    contents = " ".join(
        str(s.get("content_sha256")) for s in sources.values() if isinstance(s, dict)
    )
    tags = {
        "torchloom.git_dirty": str(code.get("dirty")).lower(),
        "torchloom.data_fingerprint": hashlib.sha256(contents.encode()).hexdigest(),
    }
    if isinstance(code.get("commit"), str):
        tags["mlflow.source.git.commit"] = code["commit"]
    return tags


def require(module: str, extra: str, what: str) -> None:
    """One line naming the extra when an optional backend's package is missing."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        found = False
    if not found:
        raise UserError(f'{what} needs the {module} package: pip install -e ".[{extra}]"')


class Tracker:
    """The backends of one run and the points a checkpoint has not yet covered."""

    def __init__(self, backends: list[Any], writes: bool | None = None) -> None:
        """``writes``: whether this process writes the run's files (with ``logger=[]`` too);
        by default, whether it has backends."""
        self.backends = backends
        self.writes = bool(backends) if writes is None else writes
        self.live = [b for b in backends if not b.holds]  # get points at once; drop on resume
        self.held = [b for b in backends if b.holds]  # get points once a checkpoint has them
        self.pending: list[Point] = []  # for ``held``: logged since the last checkpoint
        self.final: list[Point] = []  # the test split's, sent by :meth:`finish`
        self.state: Any = None  # the TrainState: each point's epoch
        self.run: TrackedRun | None = None
        self.ended = False

    @classmethod
    def of(cls, logger: Any, writes: bool, runs_root: Path | None = None) -> Tracker:
        """The backends of the ``logger`` node (one entry per chosen backend); none where
        this process does not write the run's files. Every process checks that the chosen
        packages import, so a missing one ends every rank with the same line. With
        ``runs_root`` (``paths.runs``) each backend starts connecting now, while the run sets
        up (:meth:`Backend.prepare`)."""

        nodes = dict(logger or {})
        for name in nodes:
            if name not in BACKENDS:
                raise UserError(
                    f"logger.{name}: no such logger; choose from "
                    f"{', '.join(BACKENDS)} (logger=[tensorboard,mlflow])"
                )
            module, extra = BACKENDS[name]
            if module:
                require(module, extra, f"logger={name}")
        backends = [build(node) for node in nodes.values()] if writes else []
        if runs_root is not None:  # each starts now; MLflow in a process of its own
            backends = [in_own_process(backend, runs_root) for backend in backends]
        return cls(backends, writes)

    # --- Opening ------------------------------------------------------------------------

    def open(self, run: TrackedRun, state: Any, resumed: dict | None) -> None:
        """Open each backend for ``run`` at the state's position. ``resumed`` is the
        checkpoint's tracking record when the run continues one: live backends drop what ran
        ahead of it, held ones reattach to their run and are sent the points the checkpoint
        holds that they lack."""
        record = None if resumed is None else checked_record(resumed or empty_record())
        step = None if state is None or record is None else state.global_step
        if record is not None and self.held and tracked_past(run.run_dir, step):
            log.warning(
                "warning: this checkpoint (step %d) is older than the last one the run "
                "tracked; its history continues in a new MLflow/W&B run",
                step,
            )
            live = {b.name for b in self.live}  # TensorBoard and the CSV still drop what is later
            kept = {name: p for name, p in record["backends"].items() if name in live}
            record = {**empty_record(), "backends": kept}
        token = (record or {}).get("token") or uuid.uuid4().hex
        self.run, self.state = replace(run, token=token), state
        run = self.run
        for backend in self.backends:
            stored = None if record is None else record["backends"].get(backend.name, {})
            backend.open(run, stored, step)
        if record is not None:
            pending = [Point(*p) for p in record["pending"]]
            for backend in self.held:
                sent = [Point(*p) for p in record["unconfirmed"].get(backend.name, [])]
                backend.send(backend.missing(sent + pending))

    # --- What the loop, validation and the test send ------------------------------------

    def scalar(self, tag: str, value: float, step: int) -> None:
        if not self.backends:
            return
        state = self.state
        epoch = 0 if state is None else state.epoch + (1 if state.batch_in_epoch else 0)
        point = Point(int(step), int(epoch), tag, float(value))
        if tag.startswith(FINAL):  # the figures of the end: sent with the summary
            self.final.append(point)
            return
        for backend in self.live:
            backend.send([point])
        if self.held:
            self.pending.append(point)

    def scalars(self, prefix: str, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.scalar(f"{prefix}/{name}", value, step)

    def image(self, tag: str, image: Any, step: int) -> None:
        """An image ``[3, H, W]`` in [0, 1], where the backend shows images."""
        for backend in self.backends:
            backend.image(tag, image, step)

    def text(self, tag: str, text: str, step: int) -> None:
        for backend in self.backends:
            backend.text(tag, text, step)

    # --- Checkpoints: the commit points -------------------------------------------------

    def checkpoint_record(self) -> dict:
        """What a checkpoint about to be written records: each backend's run and position,
        and the points held for the backends that get them only after it is written. The
        live backends are flushed first: the checkpoint never claims a point not on disk."""
        for backend in self.live:
            backend.flush()
        return {
            "token": self.run.token if self.run else "",
            "pending": [list(point) for point in self.pending],
            "backends": {b.name: b.position() for b in self.backends},
            "unconfirmed": {b.name: [list(p) for p in b.unconfirmed()] for b in self.held},
        }

    def checkpoint_written(self, step: int) -> None:
        """The checkpoint holding ``pending`` is complete: send it on, and note the step."""
        points, self.pending = self.pending, []
        for backend in self.held:
            try:
                backend.send(points)
            except Interrupted:  # a stop while waiting on the tracker: exit 3, as any stop
                raise
            except Exception as error:  # the points are in last.pt: a resume sends them
                first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
                raise UserError(
                    f"logger.{backend.name} could not take the history ({first}); "
                    "the checkpoint holds it: continue with resume=auto once it is "
                    "reachable"
                ) from None
        if self.held and self.run is not None:
            runs = {b.name: b.position() for b in self.held}
            write_json({"step": step, "runs": runs}, self.run.run_dir / SIDECAR)

    # --- The end ------------------------------------------------------------------------

    def finish(self, config: Mapping, final: Mapping[str, float], metrics: Mapping) -> None:
        """A finished run: the test points, the final metrics beside the config (TensorBoard's
        hparams, MLflow's run), marked finished."""
        self.checkpoint_written(self.state.global_step if self.state else 0)
        for backend in self.backends:
            backend.send(self.final)
        for backend in self.backends:
            backend.summary(config, final, metrics)
        self.end(FINISHED)

    def end(self, status: str) -> None:
        """Close every backend once, marking its run ``status``; points after the last
        checkpoint are not sent (a resume logs them again)."""
        if self.ended:
            return
        self.ended = True
        for backend in self.backends:
            try:
                backend.close(status)
            except Exception as error:  # closing never hides why the run ended
                log.warning("warning: logger.%s could not close its run: %s", backend.name, error)

    @contextmanager
    def tracking(self) -> Iterator[Tracker]:
        """Marks the run killed (a stop: exit code 3), failed (an error) or, once
        :meth:`finish` ran, finished."""
        try:
            yield self
        except Interrupted:
            self.end(KILLED)
            raise
        except BaseException:
            self.end(FAILED)
            raise
        self.end(FINISHED)


def empty_record() -> dict:
    """The record of a checkpoint written before tracking was (or saved without a tracker)."""
    return {"token": "", "pending": [], "backends": {}, "unconfirmed": {}}


def checked_record(record: Any) -> dict:
    """The tracking record of a checkpoint, which is untrusted input: anything but what
    torchloom writes is dropped with one warning (the run's history then starts anew)."""
    fresh = empty_record()
    if not isinstance(record, dict):
        return _dropped(fresh)
    pending, backends = record.get("pending"), record.get("backends")
    token, unconfirmed = record.get("token", ""), record.get("unconfirmed", {})
    if not isinstance(pending, list) or not isinstance(backends, dict):
        return _dropped(fresh)
    if not isinstance(token, str) or not (token == "" or TOKEN.fullmatch(token)):
        return _dropped(fresh)
    if not isinstance(unconfirmed, dict) or not all(
        isinstance(k, str) and isinstance(v, list) for k, v in unconfirmed.items()
    ):
        return _dropped(fresh)
    if not all(is_point(p) for p in pending + [p for v in unconfirmed.values() for p in v]):
        return _dropped(fresh)
    for name, position in backends.items():
        plain = isinstance(position, dict) and all(
            isinstance(k, str) and (isinstance(v, str) or (type(v) is int and 0 <= v <= MAX_STEP))
            for k, v in position.items()
        )
        if not isinstance(name, str) or not plain:
            return _dropped(fresh)
    return {"token": token, "pending": pending, "backends": backends, "unconfirmed": unconfirmed}


# What a point of torchloom's holds: a step and an epoch no checkpoint counter exceeds, and a
# tag every backend accepts (MLflow's rule is the narrowest); an edited record may hold others.
MAX_STEP = 2**53
TAG = re.compile(r"[/\w.\- :]{1,250}")


def is_point(point: Any) -> bool:
    return (
        isinstance(point, (list, tuple))
        and len(point) == 4
        and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP for v in point[:2]
        )
        and isinstance(point[2], str)
        and TAG.fullmatch(point[2]) is not None
        and isinstance(point[3], float)
    )


def _dropped(fresh: dict) -> dict:
    log.warning(
        "warning: the checkpoint's tracking record is not what torchloom writes; "
        "ignoring it: the tracked history starts anew from here"
    )
    return fresh


def tracked_past(run_dir: Path, step: int | None) -> bool:
    """Whether the run's held backends were committed at a later step than ``step`` (the
    resumed checkpoint is an older one: best.pt, a top-k copy), as the run dir notes it."""
    try:
        noted = json.loads((run_dir / SIDECAR).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(noted, int) and step is not None and noted > step


# logger name → (the package it needs, the extra that installs it)
BACKENDS = {
    "tensorboard": ("", ""),
    "csv": ("", ""),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}
