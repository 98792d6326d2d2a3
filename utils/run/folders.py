"""Where a run writes: its run dir is checked and claimed before Hydra writes into it (a Hydra
callback), and its checkpoint folder sits at the same place under ``paths.checkpoints``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from utils.config.resolvers import check_run_name
from utils.errors import EXIT_USER_ERROR, UserError, print_error, user_error_in
from utils.system.claim import RunClaim, release_claims


def check_writable(path: Path, what: str) -> None:
    """``path`` can be created: its nearest existing ancestor is a writable folder."""
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {what} to {path}: {ancestor} is not a writable folder")


class CheckOutputDir(Callback):
    """Hydra creates the run dir before our code runs; check it first, so an unwritable
    ``paths.runs`` is one line naming the path, not a traceback; then claim it (utils/system/claim.py),
    before Hydra writes the run's ``.hydra/`` files into it: a run's folder, or a sweep's for
    the whole sweep (its jobs' folders are inside)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir", "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir", "sweep")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claims()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claims()

    @staticmethod
    def _check(config: DictConfig, key: str, what: str) -> None:
        try:
            directory = OmegaConf.select(config, key)  # resolving it checks run_name
            check_writable(Path(directory), "the run")
            if os.environ.get("RANK", "0") == "0":  # torchrun's other ranks are the same run
                RunClaim.take(Path(directory), what)
        except Exception as error:
            cause = user_error_in(error)
            if cause is None:
                raise
            print_error(cause)
            sys.exit(EXIT_USER_ERROR)


def output_dirs(cfg: DictConfig, run_dir: Path) -> tuple[Path, Path]:
    """The run dir Hydra made, and its checkpoint folder at the same place under
    ``paths.checkpoints`` (``<run_name>/`` for a run, ``<run_name>/<job>/`` in a sweep)."""
    try:
        relative = run_dir.resolve().relative_to(Path(cfg.paths.runs).resolve())
    except ValueError:  # hydra.run.dir was pointed outside paths.runs
        relative = Path(check_run_name(cfg.run_name))
    check_run_name(relative.as_posix())
    return run_dir, Path(cfg.paths.checkpoints) / relative
