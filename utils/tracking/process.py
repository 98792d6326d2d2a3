"""A tracker backend in a process of its own, beside the training (``own_process``: MLflow).

MLflow's import and its store's start-up check take seconds of CPU; in the training process
they came before the first step, and cost the digits job 70% of its wall time. Started when
the run starts, the backend's process imports and connects on the other core while the data
loads and the model is built; the training process never imports it.

The process is a fresh interpreter, never a fork: a fork copies whatever the training
process's other threads (a plot library's warm-up, a sweep's heartbeat, a logger's writer)
were half-way through making, and the copy's garbage collector crashed on it. The fresh one
gets the training process's ``sys.path`` and environment, and its backend through the pipe.

Every call is answered before the training process goes on (a checkpoint's points are in
the store before the next step, as before), and waits so that a stop request ends the wait
within seconds (exit code 3). What the backend logs comes back with each answer and is
logged by the training process, so its log and console say it. The backend's process ignores
stop signals and runs in a session of its own, away from the terminal's Ctrl-C (the training
process decides when the run stops); it ends when the training process closes the backend,
or when its pipe closes (the training process ended, a kill included).

    start_early(sys.argv)       # train.py's first lines: logger=...mlflow... starts one now
    backend = in_own_process(Mlflow(...), runs_root)   # that one (or one started now) takes it
    backend.open(run, stored, step)                    # answered from the other process

A command line that names ``logger=...mlflow...`` starts the process at train.py's very start,
so MLflow's import runs beside torch's; a config that turns out to use no such backend lets it
go (:func:`let_early_go`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.system.signals import STOP_SIGNALS, Interrupted, StopGrace
from utils.tracking.local import Backend

log = logging.getLogger("torchloom")


EARLY = re.compile(r"\+{0,2}logger=.*\bmlflow\b.*")  # a command line that will track in MLflow
WARMED = ("mlflow", "mlflow.store.tracking.sqlalchemy_store")  # what the process imports first
# The backend's process: the training process's sys.path, then child() on the inherited pipe.
CHILD = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
    "from utils.tracking.process import child; child(int(sys.argv[1]))"
)
_early: list[tuple[subprocess.Popen, Connection]] = []  # started by start_early, not yet taken
_started: list[subprocess.Popen] = []  # backend processes started, killed at exit if alive


def start_early(argv: list[str]) -> None:
    """Start the tracker's process now when the command line names MLflow: it imports MLflow
    while this process imports torch, then waits for the backend it is to serve."""
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 alone tracks
        return
    if _early or not any(EARLY.fullmatch(arg) for arg in argv[1:]):
        return
    _early.append(start())


def start() -> tuple[subprocess.Popen, Connection]:
    """A fresh interpreter that imports :data:`WARMED`, then serves the backend it is sent."""
    ours, theirs = multiprocessing.Pipe()
    _started[:] = [process for process in _started if process.poll() is None]  # a sweep's ended
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(theirs.fileno()), json.dumps(sys.path)],
        pass_fds=(theirs.fileno(),),
        start_new_session=True,  # the terminal's Ctrl-C reaches the training process alone
    )
    theirs.close()  # its copy is the child's now: the pipe ends when either process does
    _started.append(process)
    return process, ours


def kill_left() -> None:
    """At exit: a backend's process still alive (its command ended on an error) is ended now
    rather than left to notice the pipe's end."""
    for process in _started:
        if process.poll() is None:
            process.kill()
            process.wait()


atexit.register(kill_left)


def let_early_go() -> None:
    """The command is over: an early process no backend took ends."""
    while _early:
        process, pipe = _early.pop()
        pipe.close()
        process.kill()  # it may still be importing: nothing of it is wanted
        process.wait()


def in_own_process(backend: Backend, runs_root: Path) -> Backend:
    """``backend`` in a process of its own when it asks for one (the early one when there is
    one); else ``backend`` itself, prepared here."""
    if not getattr(backend, "own_process", False):
        backend.prepare(runs_root)
        return backend
    process, pipe = _early.pop() if _early else start()
    pipe.send((backend, runs_root))
    return InChildProcess(backend, process, pipe)


class InChildProcess(Backend):
    def __init__(self, backend: Backend, process: Any, pipe: Any) -> None:
        self.name, self.holds = backend.name, backend.holds
        self.process, self.pipe = process, pipe
        self.ended = False

    def call(self, method: str, *args: Any) -> Any:
        """``backend.method(*args)`` in its process: its answer, or its exception raised here."""
        if self.ended:
            raise RuntimeError(f"logger.{self.name}'s process has ended")
        self.pipe.send((method, args))
        grace = StopGrace(f"logger.{self.name}")
        while not self.pipe.poll(0.1):
            if self.process.poll() is not None:
                self._end()
                raise RuntimeError(f"logger.{self.name}'s process ended unexpectedly")
            if grace.over():
                self._end()
                raise Interrupted
        try:
            ok, value, records = self.pipe.recv()
        except (EOFError, OSError):  # it ended as it answered: killed
            self._end()
            raise RuntimeError(f"logger.{self.name}'s process ended unexpectedly") from None
        for level, message in records:
            log.log(level, "%s", message)
        if not ok:
            raise value
        return value

    def open(self, run: Any, stored: dict | None, step: int | None) -> None:
        self.call("open", run, stored, step)

    def send(self, points: list) -> None:
        self.call("send", points)

    def missing(self, points: list) -> list:
        return self.call("missing", points)

    def unconfirmed(self) -> list:
        return self.call("unconfirmed")

    def position(self) -> dict:
        return self.call("position")

    def summary(self, config: Any, final: Any, metrics: Any) -> None:
        self.call("summary", config, final, metrics)

    def close(self, status: str) -> None:
        if self.ended:
            return
        try:
            self.call("close", status)
        finally:
            self._end()

    def _end(self) -> None:
        """The backend's process told to end (it does once its pipe closes), else killed."""
        self.ended = True
        self.pipe.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Kept(logging.Handler):
    """The backend's log records of one call, handed back with its answer."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


def child(fd: int) -> None:
    """The backend's process: stop signals ignored, :data:`WARMED` imported, then the backend
    it is sent served on the pipe ``fd``; it ends at once if none comes (the pipe closed)."""
    ignore_stops()
    pipe = Connection(fd)
    for name in WARMED:
        with contextlib.suppress(Exception):  # an import that fails fails again, and says so
            importlib.import_module(name)
    try:
        backend, runs_root = pipe.recv()
    except (EOFError, OSError):  # the config chose no such backend
        return
    serve(backend, runs_root, pipe)


def ignore_stops() -> None:
    for signum in STOP_SIGNALS:  # the training process decides when the run stops
        signal.signal(signum, signal.SIG_IGN)


def serve(backend: Backend, runs_root: Path, pipe: Any) -> None:
    """The backend's process: prepared at once, then each call answered in turn."""
    kept = _Kept()
    logger = logging.getLogger("torchloom")
    logger.handlers, logger.propagate = [kept], False
    try:
        backend.prepare(runs_root)
        failed = None
    except BaseException as error:  # answered to the first call: open, at the run's start
        failed = portable(error)
    while True:
        try:
            method, args = pipe.recv()
        except (EOFError, OSError):  # the training process is gone
            return
        try:
            if failed is not None:
                raise failed
            answer = (True, getattr(backend, method)(*args))
        except BaseException as error:
            answer = (False, portable(error))
        try:
            pipe.send((*answer, kept.records))
        except (OSError, ValueError):
            return
        kept.records = []
        if method == "close":
            return


def portable(error: BaseException) -> BaseException:
    """``error`` as the training process can receive it: bad input and stops as they are,
    anything else (a library's own exception type) as a RuntimeError with its first line."""
    if isinstance(error, UserError | Interrupted):
        return error
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:500]
    return RuntimeError(f"{type(error).__name__}: {first}")
