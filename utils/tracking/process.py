"""A tracker backend in a process of its own, beside the training (``own_process``: MLflow).

MLflow's import and its store's start-up check take seconds of CPU; in the training process
they came before the first step, and cost the digits job 70% of its wall time. Forked when the
run starts, the backend's process imports and connects on the other core while the data loads
and the model is built; the training process never imports it.

Every call is answered before the training process goes on (a checkpoint's points are in
the store before the next step, as before), and waits so that a stop request ends the wait
within seconds (exit code 3). What the backend logs comes back with each answer and is
logged by the training process, so its log and console say it. The backend's process ignores
stop signals (the training process decides when the run stops) and ends when the training
process closes the backend, or when its pipe closes (the training process ended, a kill
included).

    start_early(sys.argv)       # train.py's first line: logger=...mlflow... forks one now
    backend = in_own_process(Mlflow(...), runs_root)   # that one (or one forked now) takes it
    backend.open(run, stored, step)                    # answered from the other process

A command line that names ``logger=...mlflow...`` forks the process at train.py's very start,
before torch is imported, so MLflow's import runs beside torch's; a config that turns out to
use no such backend lets it go (:func:`let_early_go`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.system.claim import forget_claims
from utils.system.signals import STOP_SIGNALS, Interrupted, StopGrace, kill_children_at_exit
from utils.tracking.local import Backend

log = logging.getLogger("torchloom")


EARLY = re.compile(r"\+{0,2}logger=.*\bmlflow\b.*")  # a command line that will track in MLflow
WARMED = ("mlflow", "mlflow.store.tracking.sqlalchemy_store")  # what the early process imports
_early: list[tuple[Any, Any]] = []  # (process, pipe) forked by start_early, not yet taken


def forks() -> bool:
    """Linux forks safely after torch's import (macOS's frameworks may not survive a fork)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def start_early(argv: Sequence[str]) -> None:
    """Fork the tracker's process now when the command line names MLflow: it imports MLflow
    while this process imports torch, then waits for the backend it is to serve."""
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 alone tracks
        return
    if not forks() or _early or not any(EARLY.fullmatch(arg) for arg in argv[1:]):
        return
    context = multiprocessing.get_context("fork")
    pipe, theirs = context.Pipe()
    process = context.Process(
        target=in_child, args=(pipe, serve_early, theirs), daemon=True, name="torchloom tracker"
    )
    kill_children_at_exit()  # it ignores stop signals: ended at exit if still alive
    process.start()
    theirs.close()
    _early.append((process, pipe))


def let_early_go() -> None:
    """The command is over: an early process no backend took ends (its pipe closes)."""
    while _early:
        process, pipe = _early.pop()
        pipe.close()
        process.kill()  # it may still be importing: nothing of it is wanted
        process.join()


def in_own_process(backend: Backend, runs_root: Path) -> Backend:
    """``backend`` in a process of its own when it asks for one and this system forks (the
    early one when there is one); else ``backend`` itself, prepared here."""
    if not (getattr(backend, "own_process", False) and forks()):
        backend.prepare(runs_root)
        return backend
    if _early:
        process, pipe = _early.pop()
        pipe.send((backend, runs_root))
        return InChildProcess(backend, process, pipe)
    context = multiprocessing.get_context("fork")
    pipe, theirs = context.Pipe()
    process = context.Process(
        target=in_child,
        args=(pipe, serve, backend, runs_root, theirs),
        daemon=True,
        name=f"torchloom {backend.name}",
    )
    kill_children_at_exit()  # it ignores stop signals: ended at exit if still alive
    process.start()
    theirs.close()
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
            if not self.process.is_alive():
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
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class _Kept(logging.Handler):
    """The backend's log records of one call, handed back with its answer."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


def in_child(ours: Any, function: Callable, *args: Any) -> None:
    """In the forked process: first close the training process's end of the pipe (the fork
    copied it), so that the pipe ends when the training process does, even by SIGKILL, and
    this process with it; then ``function(*args)``."""
    ours.close()
    function(*args)


def serve_early(pipe: Any) -> None:
    """An early process: MLflow imported, then the backend to serve, once the config says."""
    ignore_stops()
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
    ignore_stops()
    forget_claims()  # the run's folders stay claimed by the training process alone
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
