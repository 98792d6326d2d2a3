"""Where a run writes: its run dir is checked and claimed before Hydra writes into it (a Hydra
callback), and its checkpoint folder sits at the same place under ``paths.checkpoints``. A run
that fails at start-up on bad input leaves neither behind when it made them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from utils.config.resolvers import check_run_name
from utils.errors import EXIT_USER_ERROR, UserError, print_error, user_error_in
from utils.run.study import shares_its_folder
from utils.system.claim import CLAIM_FILE, RunClaim, release_claims

# What a run's start writes before its data and model are built: Hydra's files, the log, claims.
START_FILES = {CLAIM_FILE, "train.log", ".hydra/config.yaml", ".hydra/hydra.yaml"}
START_FILES |= {".hydra/overrides.yaml"}
# What a dry run (trainer.write_outputs=false, debug=fast_dev_run) writes besides: its figures
# were printed, and nothing of it is kept.
DRY_RUN_FILES = START_FILES | {"metrics.json", "provenance.json"}
_created: set[Path] = set()  # the folders this process made for its run
_created_above: set[Path] = set()  # and the folders above them it made (runs/, checkpoints/)

# A run's own parts, folders in its run and checkpoint folders: its refit (utils/run/refit.py)
# and its cv folds (utils/run/cross_validation.py). A run that replaces it replaces them too;
# so that they are the run's alone, no run of the user's takes such a name (check_part_name).
REFIT_FOLDER = "refit"  # runs/<run>/refit/ and checkpoints/<run>/refit/
FOLD = re.compile(r"fold-(\d+)")
PART_NAMES = re.compile(f"{re.escape(REFIT_FOLDER)}|{FOLD.pattern}")


def fold_folder(fold: int) -> str:
    """Fold ``fold``'s folder name in its cv run's folders (:data:`FOLD` reads it back)."""
    return f"fold-{fold}"


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and the folders above it that do not exist yet, nearest first."""
    missing, path = [], folder.resolve()
    while not path.exists():
        missing.append(path)
        path = path.parent
    return missing


def claim_new(folder: Path, what: str, made: list[Path] | None = None) -> RunClaim:
    """Claim ``folder``, noting which folders this process made for it (``made``, from
    :func:`missing_folders` before they were made; None: those missing now, made by the
    claim) for :func:`remove_unused`."""
    made = missing_folders(folder) if made is None else made
    if made:
        _created.add(made[0])
        _created_above.update(made[1:])
    return RunClaim.take(folder, what)


def remove_unused(folders: list[Path], expected: set[str] = START_FILES) -> list[Path]:
    """A run that failed at start-up leaves no empty folder behind: each of ``folders`` that
    this process made and that holds only the ``expected`` files (:data:`START_FILES`; a dry
    run's :data:`DRY_RUN_FILES`) is removed (anything else in it, a checkpoint or a history,
    keeps it), and so are the folders above it that this process made for it and that are
    empty then (``runs/`` of a first command with a typo). Returns the folders removed."""
    removed = []
    for folder in folders:
        if folder.resolve() not in _created or not folder.is_dir():
            continue
        files = [path for path in folder.rglob("*") if not path.is_dir()]
        if any(path.relative_to(folder).as_posix() not in expected for path in files):
            continue
        for path in files:
            path.unlink(missing_ok=True)
        for path in sorted(folder.rglob("*"), reverse=True):  # the emptied .hydra/
            path.rmdir()
        folder.rmdir()
        _created.discard(folder.resolve())
        removed.append(folder)
        for above in folder.resolve().parents:  # runs/ made for it, if nothing else is there
            if above not in _created_above:
                break
            try:
                above.rmdir()
            except OSError:
                break
            _created_above.discard(above)
    return removed


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
        # A study's workers share its folder: the study hands each its own trials (search.py)
        self._check(config, "hydra.sweep.dir", "sweep", claim=not shares_its_folder(config))

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claims()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claims()

    @staticmethod
    def _check(config: DictConfig, key: str, what: str, claim: bool = True) -> None:
        try:
            directory = OmegaConf.select(config, key)  # resolving it checks run_name
            check_writable(Path(directory), "the run")
            if claim and os.environ.get("RANK", "0") == "0":  # torchrun's others: the same run
                claim_new(Path(directory), what)  # before Hydra makes it
        except Exception as error:
            cause = user_error_in(error)
            if cause is None:
                raise
            print_error(cause)
            sys.exit(EXIT_USER_ERROR)


def run_folders(cfg: DictConfig) -> list[Path]:
    """This job's run dir and checkpoint folder, as Hydra and :func:`output_dirs` place them."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(output_dirs(cfg, Path(HydraConfig.get().runtime.output_dir)))
    except (UserError, ValueError):  # a run name too bad to place, or no Hydra: nothing made
        return []


def output_dirs(cfg: DictConfig, run_dir: Path) -> tuple[Path, Path]:
    """The run dir Hydra made, and its checkpoint folder at the same place under
    ``paths.checkpoints`` (``<run_name>/`` for a run, ``<run_name>/<job>/`` in a sweep)."""
    try:
        relative = run_dir.resolve().relative_to(Path(cfg.paths.runs).resolve())
    except ValueError:  # hydra.run.dir was pointed outside paths.runs
        relative = Path(check_run_name(cfg.run_name))
    check_run_name(relative.as_posix())
    return run_dir, Path(cfg.paths.checkpoints) / relative


def earlier_parts(run_dir: Path, checkpoint_dir: Path, folds: int = 0) -> list[Path]:
    """The part folders (:data:`PART_NAMES`) in a run's folders, but folds 0 to ``folds`` − 1."""
    found = []
    for folder in (run_dir, checkpoint_dir):
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            fold = FOLD.fullmatch(path.name)
            kept = fold is not None and int(fold[1]) < folds
            if PART_NAMES.fullmatch(path.name) and path.is_dir() and not kept:
                found.append(path)
    return found


def part_of(run_name: str) -> tuple[str, str] | None:
    """``(run, part)`` when ``run_name`` names a run's part (``<run>/refit``,
    ``<run>/fold-<k>``; ``run`` is empty for a bare part name), else None."""
    run, _, part = str(run_name).rpartition("/")
    return (run, part) if PART_NAMES.fullmatch(part) else None


def check_part_name(run_name: str) -> None:
    """A run of the user's is not named as a run's part: the run of the name before it would
    take it for its own, and replace it with itself."""
    if (named := part_of(run_name)) is not None:
        raise UserError(
            f"run_name={run_name!r}: {named[1]!r} names a run's part (its refit, its cv folds), "
            "which a run of the name before it would replace; choose another run_name"
        )


def not_continued(parts: list[Path], folds: int) -> str:
    """Why resume=auto (of a cv of ``folds`` when not 0) does not continue the earlier run,
    whose ``parts`` are found, and what does."""
    if folds:
        return f"cv={folds} resume=auto continues a cv's folds, and it has none"
    if any(FOLD.fullmatch(part.name) for part in parts):
        return "it is a cv run: continue it with cv=K resume=auto, K its number of folds"
    return "resume=auto finds no checkpoint of it to continue"
