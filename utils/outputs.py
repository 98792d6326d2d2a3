"""Who writes what, decided once for a run of ``train.py`` or ``evaluate.py``.

- Rank 0 prints (the console of other ranks is quiet) and writes ``metrics.json`` and tables.
- Rank 0 of a run that writes outputs also writes TensorBoard events and the hparams record;
  ``trainer.write_outputs=false`` (``debug=fast_dev_run``) and other ranks get a writer that
  does nothing.

What the files hold is formatted in :mod:`utils.report`; this module only decides where it goes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from utils import report
from utils.distributed import NullWriter
from utils.errors import UserError


class Outputs:
    def __init__(self, run_dir: Path, is_main: bool, events: bool) -> None:
        self.run_dir = run_dir
        self.is_main = is_main  # prints, metrics.json, tables
        self.writes_events = is_main and events  # TensorBoard and hparams
        self.console = Console(quiet=not is_main)
        self.writer: Any = NullWriter()

    def open_events(self, purge_after: int | None = None) -> None:
        """Start the TensorBoard writer. A resumed run passes the step it resumed at: points
        the interrupted run logged after its checkpoint are dropped."""
        if not self.writes_events:
            return
        from torch.utils.tensorboard import SummaryWriter  # slow import; only once it is used

        purge = None if purge_after is None else purge_after + 1
        self.writer = SummaryWriter(self.run_dir, purge_step=purge)

    def print(self, *renderables: Any) -> None:
        self.console.print(*renderables)

    def scalars(self, prefix: str, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def write_json(self, name: str, data: Mapping) -> None:
        if self.is_main:
            report.write_json(data, self.run_dir / name)

    def write_text(self, name: str, text: str) -> None:
        if self.is_main:
            (self.run_dir / name).write_text(text)

    def finish(self, metrics: Mapping[str, Any], config: Mapping, final: Mapping) -> None:
        """A finished training run: ``metrics.json``, the hparams record of the config with
        the ``final`` train/val/test metrics, and the final table."""
        self.write_json("metrics.json", metrics)
        if self.writes_events:
            report.write_hparams(self.writer, config, final)
        self.close()
        self.print(report.metrics_table(metrics))

    def close(self) -> None:
        self.writer.close()


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
        same = given.resolve() == target or (path.exists() and given.exists()
                                             and os.path.samefile(given, path))  # fmt: skip
        if same:
            raise UserError(f"{key}={path} is this command's own input ({given}); writing there "
                            "would replace it: choose another file")  # fmt: skip
