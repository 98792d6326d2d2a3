"""``logger=wandb``: the run in Weights & Biases. Offline (files under the run dir, uploaded
later with ``wandb sync``) unless an API key is set up or ``logger.wandb.mode=online``; it
never prompts, on any rank. A sweep's jobs are grouped by the sweep's run name, each its own
W&B run, finished before the next starts. The W&B run id goes into every checkpoint, and a
resume continues that run. W&B cannot drop points, so it gets a checkpoint's points once the
checkpoint is written (utils/tracking/tracker.py). W&B writes what it is sent only when the run
finishes, so each checkpoint also carries every point this process sent it (a kill -9 loses
them all), and a resume sends them again; W&B keeps the first row of each step (it drops a
resumed run's rows whose step is not past its last one), so none is logged twice.
"""

from __future__ import annotations

import logging
import netrc
import os
from collections.abc import Mapping
from typing import Any

from utils.errors import UserError
from utils.system.signals import Interrupted, stop_requested
from utils.tracking.local import Backend
from utils.tracking.tracker import FAILED, FINAL, KILLED, TrackedRun, provenance_tags

log = logging.getLogger("torchloom")
MODES = ("auto", "offline", "online")
EXIT_CODES = {"FINISHED": 0, FAILED: 2, KILLED: 3}  # as train.py's own exit codes


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


REFUSED_IN_PROJECT = ("/", "\\", "#", "?", "%", ":")  # W&B's rule for a project's name


class Wandb(Backend):
    name = "wandb"
    holds = True

    def __init__(
        self, project: str | None = None, entity: str | None = None, mode: str = "auto"
    ) -> None:
        if mode not in MODES:
            raise UserError(f"logger.wandb.mode={mode!r}: choose auto, offline or online")
        if mode == "online" and not has_api_key():
            raise UserError(
                "logger.wandb.mode=online needs an API key: set WANDB_API_KEY or run "
                "`wandb login` first (this run never prompts for one)"
            )
        self.project, self.entity = project, entity
        self.mode = mode if mode != "auto" else ("online" if has_api_key() else "offline")
        self.run_id: str | None = None
        self.run: Any = None
        self.tracked: TrackedRun | None = None
        self.sent: list = []  # since this process started the run: on disk only at its finish

    def open(self, run: TrackedRun, stored: dict | None, step: int | None) -> None:
        project = self.project or run.experiment  # checked now, not when W&B refuses it
        refused = [c for c in REFUSED_IN_PROJECT if c in project]
        if refused or len(project) > 128:
            source = "logger.wandb.project" if self.project else "run_name's first part"
            raise UserError(
                f"logger.wandb: the project {project!r} ({source}) "
                + (f"holds {refused[0]!r}" if refused else "is over 128 characters")
                + ", which W&B refuses; choose another run_name or set "
                "logger.wandb.project="
            )
        self.tracked = run
        # The W&B id is the run's token: a run killed before a checkpoint said its id is
        # continued too, and an edited id never points this run into another W&B run.
        stored_id = (stored or {}).get("id")
        if stored_id not in (None, run.token):
            log.warning(
                "warning: logger.wandb: the checkpoint's W&B id %r is not this run's; "
                "continuing W&B run %s",
                stored_id,
                run.token,
            )
        self.run_id = run.token

    def _start(self) -> None:
        import wandb

        run = self.tracked
        try:
            self.run = self._init(wandb, run)
        except Exception:
            if stop_requested():  # a stop during W&B's start (it waits on its server): exit 3
                raise Interrupted from None
            raise
        self.run_id = self.run.id
        log.info("logger.wandb: run %s (%s) in %s", self.run_id, self.mode, run.run_dir / "wandb")

    def _init(self, wandb: Any, run: TrackedRun) -> Any:
        return wandb.init(
            project=self.project or run.experiment,
            entity=self.entity,
            name=run.display_name,
            group=run.name if run.job is not None else None,
            id=self.run_id,
            resume="allow",
            dir=str(run.run_dir),
            mode=self.mode,
            config={**run.config, "provenance": provenance_tags(run.run_dir)},
            reinit="create_new",
            settings=wandb.Settings(
                silent=True, console="off", x_disable_stats=True, init_timeout=60
            ),
        )

    def send(self, points: list) -> None:
        if not points:
            return
        if self.run is None:
            self._start()
        self.sent += points
        rows: dict[int, dict[str, float]] = {}
        for point in points:
            if point.tag.startswith(FINAL):  # the test's figures: the run's summary, since W&B
                self.run.summary[point.tag] = point.value  # drops a resumed run's earlier steps
                continue
            rows.setdefault(point.step, {})[point.tag] = point.value
        for step in sorted(rows):
            self.run.log(rows[step], step=step)

    def position(self) -> dict:
        return {"id": self.run_id} if self.run_id else {}

    def unconfirmed(self) -> list:
        """W&B keeps what it is sent in memory until the run finishes (its offline file gets
        nothing before), so a kill -9 loses all of it: each checkpoint carries it again."""
        return self.sent

    def summary(self, config: Mapping, final: Mapping[str, float], metrics: Mapping) -> None:
        if self.run is None:
            self._start()
        self.run.summary.update(
            {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
            | {f"provenance/{k}": v for k, v in provenance_tags(self.tracked.run_dir).items()}
        )

    def close(self, status: str) -> None:
        if self.run is None and status == FAILED and self.tracked is not None:
            self._start()  # an attempt that failed before its first checkpoint
        if self.run is not None:
            self.run.finish(exit_code=EXIT_CODES.get(status, 1))
            self.run, self.sent = None, []
