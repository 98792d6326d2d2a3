"""Stopping cleanly on SIGTERM, SIGUSR1/SIGUSR2 (cluster pre-emption) and SIGINT (Ctrl-C).

The handlers only set a flag; the training loop reads it after each optimizer step, writes
``last.pt`` with the exact data position, and exits with :data:`EXIT_INTERRUPTED`. A second
signal of the same kind (a second Ctrl-C, a second SIGTERM) exits at once, whatever is running.
Under SLURM's submitit launcher, whose handler for the time-limit signal
(SIGUSR2) requeues the job, that handler is called once ``last.pt`` is written.
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing

# Imported now, so that multiprocessing's exit handler is registered before
# kill_children_at_exit's, which must run first.
import multiprocessing.util
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

EXIT_INTERRUPTED = 3  # stopped by a signal; last.pt resumes the run exactly
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


_early: list[int] = []  # stop signals that arrived before a StopRequest was entered
_before_early: dict[int, object] = {}  # the handlers catch_early_signals replaced


log = logging.getLogger("torchloom")
T = TypeVar("T")


def catch_early_signals() -> None:
    """Hold SIGTERM/SIGUSR1/SIGUSR2 that arrive while the process is still starting (importing
    torch takes seconds), so they are acted on once training is set up: ``last.pt`` and exit
    code 3, as at any other moment. Ctrl-C keeps interrupting start-up at once."""
    for signum in STOP_SIGNALS:
        if signum != signal.SIGINT:
            _before_early[signum] = signal.signal(signum, _hold)


def _hold(signum: int, frame: FrameType | None) -> None:
    _early.append(signum)


def say(message: str) -> None:
    """A stop's line, at once on stderr (from a signal handler: no logging lock is taken for
    the console) and in the run's log file (``train.log`` tells the whole story)."""
    try:
        sys.stderr.write(f"\n{message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # no one reads stderr any more
    record = logging.LogRecord("torchloom", logging.WARNING, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


class Interrupted(Exception):
    """Raised by ``train()`` once a stop signal's ``last.pt`` is written; ``main()`` exits with
    :data:`EXIT_INTERRUPTED`."""


class StopRequest:
    def __init__(self) -> None:
        self.signal: int | None = None
        self.stepping = False  # the loop has begun its steps (utils/fit/loop.py)
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == self.signal:  # the same signal again: whatever is running does not end
            what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            say(f"second {what}: exiting now, without a checkpoint")
            raise SystemExit(128 + signum)
        self.signal = signum
        say(self._received())

    def _received(self) -> str:
        """What the signal received does now: in the loop, it finishes the step; before it
        (set-up), it stops at set-up's next safe point (a cache build ends keeping nothing; a
        set-up that ends saves the start), where no step ran to finish."""
        if self.stepping:
            return f"{self.name} received: finishing this step, then saving last.pt"
        return (
            f"{self.name} received during set-up, before any step: stopping at its next safe point"
        )

    def hand_on(self) -> None:
        """Call the handler that was installed for the received signal before ours (a job
        scheduler's requeue), now that the checkpoint is safe."""
        previous = self._previous.get(self.signal)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(self.signal, None)

    def __enter__(self) -> StopRequest:
        _active.append(self)
        for signum in STOP_SIGNALS:
            previous = signal.signal(signum, self._handle)
            # Once training is over, a signal acts as it did before start-up (by default it
            # ends the process), not held for a loop that no longer reads it.
            self._previous[signum] = _before_early.get(signum) if previous is _hold else previous
        if _early:
            self.signal = _early[0]
            say(self._received())
        return self

    def __exit__(self, *exc: object) -> None:
        _active.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


_active: list[StopRequest] = []  # the StopRequest a run is inside, for phases outside the loop


def stop_requested() -> str | None:
    """The name of the stop signal the running command received, if any: a long phase before
    the loop (building an image cache) checks it and stops, raising :class:`Interrupted`."""
    if not _active or not _active[-1].requested:
        return None
    return _active[-1].name


STOP_GRACE_SECONDS = 2.0  # how long a wait may go on once a stop is requested


class StopGrace:
    """How long a wait on something outside (a tracker) may go on: until
    :data:`STOP_GRACE_SECONDS` after a stop request. :meth:`over` is asked between polls, and
    says so in one warning naming ``what`` was waited for."""

    def __init__(self, what: str) -> None:
        self.what, self.stopped_at = what, None

    def over(self) -> bool:
        if self.stopped_at is None and stop_requested():
            self.stopped_at = time.monotonic()
        if self.stopped_at is None or time.monotonic() - self.stopped_at <= STOP_GRACE_SECONDS:
            return False
        log.warning(
            "%s received while waiting for %s; stopping without it", stop_requested(), self.what
        )
        return True


def until_stopped(call: Callable[[], T], what: str) -> T:
    """``call()``'s result, waited for in a thread so that a stop request ends the wait within
    :data:`STOP_GRACE_SECONDS` (raising :class:`Interrupted`) however long ``call`` blocks: a
    tracker's server that accepts and never answers cannot hold a stopped run. ``what``
    names the wait in the line that says so. Its exception, if it raised, is raised here."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the waiting thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"torchloom: {what}", daemon=True)
    thread.start()
    grace = StopGrace(what)
    while thread.is_alive():
        thread.join(0.1)
        if thread.is_alive() and grace.over():
            raise Interrupted
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def continue_command(
    overrides: list[str], checkpoint: object, processes, parent: str | None = None
) -> str:
    """The command that continues a stopped run from ``checkpoint``, with the same launcher; a
    part of the run ``parent`` (a cv fold, a refit) by continuing that run whole."""
    if parent is not None:  # resume=auto skips what it finished and resumes the part stopped
        overrides = [o for o in overrides if not o.startswith("run_name=")]
        overrides, checkpoint = [*overrides, f"run_name={parent}"], "auto"
    launcher = "python"
    if processes.enabled:
        launcher = f"torchrun --nproc_per_node={processes.local_world_size}"
    command = [*shlex.split(launcher), "train.py", *overrides, f"resume={checkpoint}"]
    return shlex.join(command)  # pasted into a shell, each override stays one word


def continue_sweep_command(run_name: str, argv: list[str]) -> str:
    """The command that continues a sweep one of whose jobs was stopped: the same sweep under
    its run name, which skips the finished jobs, resumes the stopped one from its last.pt and
    runs the rest (a job started alone would be a new run outside the sweep). ``argv``: the
    command line as it may be written down (credentials redacted)."""
    if Path(argv[0]).name != "train.py":  # a launcher's worker process: no command line
        return f"the sweep's command again, with run_name={shlex.quote(run_name)}"
    given = [a for a in argv[1:] if not a.startswith(("run_name=", "resume="))]
    multirun = [] if {"-m", "--multirun"} & set(given) else ["-m"]
    return shlex.join(["python", "train.py", *multirun, *given, f"run_name={run_name}"])


@functools.cache
def kill_children_at_exit() -> None:
    """Once a process has daemon children that ignore stop signals (decoding workers, a
    tracker's own process): at exit, kill those still alive. multiprocessing's own exit
    handler sends them SIGTERM, which they ignore, and then waits for them: without this, a
    command that ends on an error while one lives would wait for ever."""
    atexit.register(_kill_daemon_children)


def _kill_daemon_children() -> None:
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children:  # torch's SIGCHLD handler would report each killed worker as a failure
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()
        child.join(timeout=5)
