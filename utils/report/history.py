"""A finished run's history read back from its own folder, as the report draws it: each tag's
(step, value) points in order. TensorBoard's event files (the default logger) are read the way
TensorBoard reads them, so the points a resume purged (those logged after the checkpoint it
continued from) are left out; without event files, the CSV logger's ``metrics.csv``. A run
tracked only by MLflow or W&B has neither: its report says so and draws no curves."""

from __future__ import annotations

import csv
import itertools
import logging
import math
from pathlib import Path

from utils import plots
from utils.tracking.local import CSV_NAME

log = logging.getLogger("torchloom")
Points = dict[str, list[tuple[int, float]]]


def read_history(run_dir: Path) -> tuple[Points, str]:
    """(tag → [(step, value)], where they were read: ``TensorBoard events``, ``metrics.csv``
    or ``""`` when the folder holds neither)."""
    if any(run_dir.glob("events.out.tfevents.*")):
        return _events(run_dir), "TensorBoard events"
    if (run_dir / CSV_NAME).is_file():
        return _csv(run_dir / CSV_NAME), CSV_NAME
    return {}, ""


def _events(run_dir: Path) -> Points:
    """The scalars of the folder's event files, read as TensorBoard reads them: the files in
    name order (their writers' start times), and a session's start at step S (a resume's
    purge step) drops every point already read at step S or later."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    points: Points = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in LegacyEventFileLoader(str(path)).Load():
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                for tag, series in points.items():
                    points[tag] = [point for point in series if point[0] < event.step]
            elif event.HasField("summary"):
                for value in event.summary.value:
                    if value.WhichOneof("value") == "simple_value":
                        points.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {tag: series for tag, series in points.items() if series}


def _csv(path: Path) -> Points:
    """``step,epoch,tag,value`` rows; a row that does not parse (a file edited by hand) is
    skipped with one warning naming the file."""
    points: Points = {}
    skipped = 0
    with path.open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            try:
                step, value = int(row["step"]), float(row["value"])
            except (KeyError, TypeError, ValueError):
                skipped += 1
                continue
            points.setdefault(str(row["tag"]), []).append((step, value))
    if skipped:
        log.warning("warning: %s: %d rows that do not parse left out of the report", path, skipped)
    return points


def repeated_steps(points: Points) -> dict[str, list[int]]:
    """Each tag's steps that occur more than once or out of order (a history a resume did not
    cut): none in a run torchloom wrote, whatever killed and resumed it."""
    found = {}
    for tag, series in points.items():
        steps = [step for step, _ in series]
        bad = [b for a, b in itertools.pairwise(steps) if b <= a]
        if bad:
            found[tag] = bad
    return found


def finite(series: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The points with a finite value (a NaN loss is said in the report, not drawn)."""
    return [(step, value) for step, value in series if math.isfinite(value)]


COMPARED = ("train/loss", "val/loss", "train/lr")


def compared_curves(first: Path, second: Path) -> bytes | None:
    """Two run folders' curves on common axes (compare.py): the losses, the learning rate and
    each run's monitored metric where both logged it; None when either has no history."""
    histories = [read_history(folder)[0] for folder in (first, second)]
    if not all(histories):
        return None
    shared = [tag for tag in histories[0] if tag in histories[1]]
    tags = [t for t in COMPARED if t in shared] + [
        t for t in shared if t.startswith("val/") and t not in COMPARED
    ][:3]
    labels = (first.name, second.name) if first.name != second.name else (str(first), str(second))
    panels = {
        tag: {label: finite(history[tag]) for label, history in zip(labels, histories, strict=True)}
        for tag in tags
    }
    return plots.curves(panels) if panels else None
