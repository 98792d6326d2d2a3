"""Who writes what, decided once for a run of ``train.py`` or ``evaluate.py``.

- Rank 0 prints (the console of other ranks is quiet) and writes ``metrics.json`` and tables.
- Rank 0 of a run that writes outputs also writes the history (``logger=``: TensorBoard
  events by default, utils/tracking/tracker.py); ``trainer.write_outputs=false``
  (``debug=fast_dev_run``) and other ranks get a tracker without backends.

What the files hold is formatted in :mod:`utils.run.report`; this module only decides where it goes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.files import write_file, write_json
from utils.report.evidence import keep_evidence
from utils.report.run import write_run_report
from utils.run import report
from utils.text import console
from utils.tracking.tracker import FINISHED, TrackedRun, Tracker

log = logging.getLogger("torchloom")


class Outputs:
    def __init__(self, run_dir: Path, is_main: bool, tracker: Tracker | None = None) -> None:
        """``tracker``: where the history goes (utils/tracking/tracker.py); it has backends only in
        the process that writes the run's files."""
        self.run_dir = run_dir
        self.is_main = is_main  # prints, metrics.json, tables
        self.console = console(quiet=not is_main)
        self.tracker = tracker if tracker is not None else Tracker([])

    @property
    def writes_events(self) -> bool:
        """Whether this process writes the run's files (the history, tune='s curve)."""
        return self.tracker.writes

    def track(
        self, run: TrackedRun | None = None, state: Any = None, resumed: dict | None = None
    ) -> Tracker:
        """Open the history of ``run`` (a resumed run passes its checkpoint's tracking
        record); without one, of the run dir alone (evaluate.py, tune=)."""
        if run is None:
            run = TrackedRun(self.run_dir.name, None, self.run_dir, {}, self.run_dir.parent)
        self.tracker.open(run, state, resumed)
        return self.tracker

    def print(self, *renderables: Any) -> None:
        """Print what is given (None: nothing to show, so nothing is printed)."""
        shown = [renderable for renderable in renderables if renderable is not None]
        if shown:
            self.console.print(*shown)

    def scalars(self, prefix: str, metrics: Mapping[str, float], step: int) -> None:
        self.tracker.scalars(prefix, metrics, step)

    def write_json(self, name: str, data: Mapping) -> None:
        if self.is_main:
            write_json(data, self.run_dir / name)

    def write_text(self, name: str, text: str) -> None:
        if self.is_main:
            (self.run_dir / name).write_text(text)

    def write_bytes(self, name: str, data: bytes) -> None:
        """A file in the run dir (a picture's PNG), written whole or not at all."""
        if self.is_main:
            write_file(self.run_dir / name, data, "choose a folder this user can write")

    def finish(self, metrics: Mapping[str, Any], config: Mapping, final: Mapping) -> None:
        """A finished training run: ``metrics.json``, the final ``train/val/test`` metrics
        beside the config in the history (marked finished), and the final table."""
        self.write_json("metrics.json", metrics)
        self.tracker.finish(config, final, metrics)
        self.print(report.metrics_table(metrics))

    def report(self, write: Callable[[], Path]) -> None:
        """Write a ``report.html`` by ``write`` (utils/report/), once what it describes is on
        disk: rank 0 of a run that writes outputs alone (:func:`report_safely`)."""
        if self.is_main and self.writes_events:
            report_safely(write)

    def report_run(self, evidence: dict | None, data: Any, names: list[str]) -> None:
        """A training run's report, with its test split's ``evidence`` kept beside it."""

        def write() -> Path:
            keep_evidence(self.run_dir, evidence, data.splits.get(data.test_split), data, names)
            return write_run_report(self.run_dir)

        self.report(write)

    def close(self) -> None:
        self.tracker.end(FINISHED)


def report_safely(write: Callable[[], Path]) -> None:
    """``write()`` a report; drawing that fails is one warning: the run, its checkpoints and
    metrics stand."""
    try:
        written = write()
    except Exception as error:
        log.warning("warning: report.html not written: %s", error)
        log.debug("report failure", exc_info=True)
        return
    log.info("report: %s", written)


def read_metrics(run_dir: Path) -> dict | None:
    """The ``metrics.json`` a run wrote in ``run_dir``; None when it is missing, unreadable or
    not an object (a run still going, or a file edited by hand)."""
    try:
        metrics = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return metrics if isinstance(metrics, dict) else None


def check_output(path: Path, key: str, inputs: Sequence[Path], suffixes: Sequence[str]) -> None:
    """``key=path`` is a file this command may write: one of ``suffixes``, not a folder, and
    none of the command's ``inputs`` (its checkpoint, its table or image folder), so an output
    never replaces what it was made from."""
    if path.suffix.lower() not in suffixes:
        raise UserError(f"{key}={path}: name a {' or a '.join(suffixes)} file")
    if path.is_dir():
        raise UserError(f"{key}={path} is a folder; name a file in it")
    target = path.resolve()
    for given in inputs:
        same = given.resolve() == target or (
            path.exists() and given.exists() and os.path.samefile(given, path)
        )
        if same:
            raise UserError(
                f"{key}={path} is this command's own input ({given}); writing there "
                "would replace it: choose another file"
            )
