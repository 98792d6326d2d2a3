"""The resolvers the YAML files use (``${run_timestamp:...}``, ``${resumed_run_name:...}``,
``${fresh_folder:...}``, ``${checked_run_name:...}``, ``${default_monitor:...}``,
``${monitor_mode:...}``), and whether this command is one job of a sweep. Importing this module
registers them with OmegaConf.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from utils.config.monitor import default_monitor, monitor_mode
from utils.errors import UserError
from utils.files import sharded_folder


def resumed_run_name(resume: str | None, checkpoints_root: str, fresh: str) -> str:
    """``run_name`` when it is not given: resuming ``checkpoints/<name>/last.pt`` continues run
    ``<name>`` (same run dir, same checkpoint folder); otherwise ``fresh`` (a timestamp)."""
    if resume and resume != "auto":
        path = Path(resume).resolve()
        # a sharded checkpoint (last/, best/) lives in its run's folder, as a file does
        folder = path if path.is_dir() and not sharded_folder(path) else path.parent
        try:
            return str(folder.relative_to(Path(checkpoints_root).resolve()))
        except ValueError:
            pass
    return fresh


OmegaConf.register_new_resolver("resumed_run_name", resumed_run_name, replace=True)

# Set by a sweep for its jobs (utils/run/sweep.py), which may compose their config in other
# processes and at other times, so that they all share one run name.
RUN_TIMESTAMP_ENV = "TORCHLOOM_RUN_TIMESTAMP"


def run_timestamp(pattern: str) -> str:
    """The run's start time, shared by every process of one run: a sweep's jobs take it from
    the environment; torchrun's ranks on one machine from their launcher's start time;
    ranks of a multi-machine run use the rendezvous id (``--rdzv-id``) when one was given."""
    if os.environ.get(RUN_TIMESTAMP_ENV):
        return os.environ[RUN_TIMESTAMP_ENV]
    if "LOCAL_RANK" in os.environ:  # under torchrun
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        machines = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        if machines > 1 and run_id != "none":
            return run_id
        started = _process_start_time(os.getppid())
        if started is not None:
            return datetime.fromtimestamp(started).strftime(pattern)
    return datetime.now().strftime(pattern)


def _process_start_time(pid: int) -> float | None:
    """Seconds since the epoch at which process ``pid`` started (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


OmegaConf.register_new_resolver("run_timestamp", run_timestamp, use_cache=True, replace=True)


_fresh_folders: dict[str, str] = {}  # this command's folder, however often Hydra resolves it


def fresh_folder(parent: str, name: str) -> str:
    """``<parent>/<name>``, or ``<name>_2``, ``_3``, ... : a folder this process created itself
    (an exclusive ``mkdir``), so two evaluate.py or predict.py started in the same second never
    share one. torchrun's ranks share their launcher's (one rank's folder for the run)."""
    key = f"{parent}/{name}"
    if "LOCAL_RANK" in os.environ or key in _fresh_folders:
        return _fresh_folders.get(key, key)
    for attempt in range(1, 10_000):
        folder = Path(parent) / (name if attempt == 1 else f"{name}_{attempt}")
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError:
            break  # an unwritable parent: Hydra's own mkdir names it
        _fresh_folders[key] = str(folder)
        return str(folder)
    return key


def forget_fresh_folders() -> None:
    """The command has ended (an in-process caller may run another one)."""
    _fresh_folders.clear()


OmegaConf.register_new_resolver("fresh_folder", fresh_folder, replace=True)
OmegaConf.register_new_resolver("default_monitor", default_monitor, replace=True)


def check_run_name(name: str) -> str:
    """A run name is a relative path of plain segments (``exp1``, ``grid/3``): the run dir and
    the checkpoint folder stay inside ``paths.runs`` and ``paths.checkpoints``."""
    segments = str(name).split("/")
    if (
        not str(name)
        or any(segment in ("", ".", "..") for segment in segments)
        or any(bad in str(name) for bad in ("\\", "\0"))
    ):
        raise UserError(
            f"run_name={name!r} must be a relative path of plain names (like exp1 or grid/3), "
            "with no '..', '.', empty or absolute part; choose another run_name"
        )
    return str(name)


OmegaConf.register_new_resolver("checked_run_name", check_run_name, replace=True)
OmegaConf.register_new_resolver(
    "monitor_mode", lambda monitor, mode: monitor_mode(monitor, mode), replace=True
)


def in_sweep() -> bool:
    """This command is one job of a sweep (``-m``)."""
    return HydraConfig.get().mode == RunMode.MULTIRUN
