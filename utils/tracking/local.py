"""The backends that write a run's history into its own folder: TensorBoard (the default) and
a long-form CSV file. Both drop on resume what ran ahead of the checkpoint, so they get every
point at once (utils/tracking/tracker.py decides when; these only write). MLflow and W&B are in
utils/tracking/mlflow.py and utils/tracking/wandb.py.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from utils.config.build import flatten

log = logging.getLogger("torchloom")


class Backend:
    """What every backend answers; the defaults do nothing."""

    name = ""
    holds = False  # True: cannot drop points, so gets them only once a checkpoint holds them

    def prepare(self, runs_root: Path) -> None:
        """Start what takes long (a store's connection) while the run sets up, before
        :meth:`open`; ``runs_root`` is ``paths.runs``."""

    def open(self, run: Any, stored: dict | None, step: int | None) -> None:
        """Start writing for ``run`` (utils/tracking/tracker.py TrackedRun). A resume passes what
        the checkpoint recorded of this backend (``stored``) and its step."""

    def send(self, points: list) -> None: ...

    def missing(self, points: list) -> list:
        """Of points a resumed checkpoint holds, those this backend does not have yet."""
        return points

    def unconfirmed(self) -> list:
        """Points sent that the backend may still lose to a kill (it writes them later):
        every checkpoint carries them, and a resume sends them again."""
        return []

    def image(self, tag: str, image: Any, step: int) -> None: ...

    def text(self, tag: str, text: str, step: int) -> None: ...

    def flush(self) -> None: ...

    def position(self) -> dict:
        """What a checkpoint records of this backend (plain strings and integers)."""
        return {}

    def summary(self, config: Mapping, final: Mapping[str, float], metrics: Mapping) -> None:
        """A finished run's final metrics beside its config."""

    def close(self, status: str) -> None: ...


EVENT_FILE = re.compile(r"events\.out\.tfevents\.(\d+)\.")


def after_earlier_event_files(run_dir: Path) -> None:
    """Wait, if need be, for the clock's second to pass that of the run's newest event file.
    TensorBoard reads a folder's files in name order, and a name starts with its writer's
    start time in whole seconds (then host and process id): a resume within the second of the
    run it continues (a kill -9, then ``resume=auto`` at once) would otherwise sort first, and
    its purge step would drop the points it continues from."""
    seconds = [
        int(m.group(1))
        for p in run_dir.glob("events.out.tfevents.*")
        if (m := EVENT_FILE.match(p.name))
    ]
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(0.05)


class TensorBoard(Backend):
    """Event files in the run dir. A resume opens them with a purge step one past the
    checkpoint's, so TensorBoard drops what the interrupted run logged after it.

    The points of one step go into one event, written when a point of another step comes or
    at a flush (every checkpoint flushes first): ``add_scalar`` costs about 100 µs a point on
    a 2-core CPU, a tenth of the default job's step, and one event of four points about a
    quarter of that each."""

    name = "tensorboard"

    def __init__(self) -> None:
        self.writer: Any = None
        self.step: int | None = None
        self.values: list = []  # the step's points not written yet: (tag, value)

    def open(self, run: Any, stored: dict | None, step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow import; only once it is used

        if step is not None:
            after_earlier_event_files(Path(run.run_dir))
        self.writer = SummaryWriter(run.run_dir, purge_step=None if step is None else step + 1)

    def send(self, points: list) -> None:
        for point in points:
            if point.step != self.step:
                self.write_step()
                self.step = point.step
            self.values.append((point.tag, point.value))

    def write_step(self) -> None:
        """The step's points, as one event (what ``add_scalar`` writes, one value each)."""
        if not self.values:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=t, simple_value=v) for t, v in self.values])
        event = Event(wall_time=time.time(), step=self.step, summary=summary)
        self.writer._get_file_writer().add_event(event)
        self.values = []

    def image(self, tag: str, image: Any, step: int) -> None:
        self.write_step()
        self.writer.add_image(tag, image, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.write_step()
        self.writer.add_text(tag, text, step)

    def flush(self) -> None:
        self.write_step()
        self.writer.flush()

    def summary(self, config: Mapping, final: Mapping[str, float], metrics: Mapping) -> None:
        self.write_step()
        write_hparams(self.writer, config, final)

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.write_step()
            self.writer.close()


CSV_NAME = "metrics.csv"
CSV_HEADER = "step,epoch,tag,value\n"


class CsvLog(Backend):
    """``runs/<run>/metrics.csv``: one row per point (``step,epoch,tag,value``), so a tag
    that first appears mid-run is one more row, never a new column. Rows are only appended;
    the checkpoint records the file's length, and a resume cuts what was appended after it
    (the rows ahead of the checkpoint, which the resumed run logs again)."""

    name = "csv"

    def __init__(self) -> None:
        self.file: io.TextIOWrapper | None = None
        self.rows: Any = None

    def open(self, run: Any, stored: dict | None, step: int | None) -> None:
        path = Path(run.run_dir) / CSV_NAME
        if stored is not None and isinstance(stored.get("bytes"), int):
            cut_to(path, stored["bytes"])
        self.file = path.open("a", newline="", encoding="utf-8")
        if self.file.tell() == 0:
            self.file.write(CSV_HEADER)
        self.rows = csv.writer(self.file, lineterminator="\n")

    def send(self, points: list) -> None:
        self.rows.writerows([p.step, p.epoch, p.tag, repr(p.value)] for p in points)

    def flush(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def position(self) -> dict:
        return {"bytes": self.file.tell()} if self.file is not None else {}

    def close(self, status: str) -> None:
        if self.file is not None:
            self.file.close()


def cut_to(path: Path, length: int) -> None:
    """Drop what follows the first ``length`` bytes of ``path``: the rows written after the
    checkpoint that recorded that length. A file shorter than that (edited, or replaced) is
    left as it is, with one warning."""
    size = path.stat().st_size if path.exists() else 0
    if size > length >= 0:
        with path.open("r+b") as f:
            f.truncate(length)
        log.info(
            "%s: dropped the %d bytes written after the resumed checkpoint", path, size - length
        )
    elif size < length:
        log.warning(
            "warning: %s is shorter than when the checkpoint was written (%d < %d "
            "bytes); appending after its end",
            path,
            size,
            length,
        )


def write_hparams(writer, config: Mapping, metrics: Mapping[str, float]) -> None:
    """Record the flattened config with the final metrics in the run's own event file, so
    TensorBoard's HPARAMS tab compares runs side by side."""
    from torch.utils.tensorboard.summary import hparams  # here: MLflow's process never needs it

    final = {k: v for k, v in metrics.items() if isinstance(v, float) and math.isfinite(v)}
    experiment, session_start, session_end = hparams(flatten(config), final)
    file_writer = writer._get_file_writer()
    for summary in (experiment, session_start, session_end):
        file_writer.add_summary(summary)
