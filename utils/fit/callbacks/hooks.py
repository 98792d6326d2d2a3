"""Your own step logic, named in the config: ``callbacks.<name>`` entries, checked before any
data is read, built once by train.py, called at the loop's events, their state saved under
their names in every checkpoint (docs/callbacks.md).

An entry is a ``_target_`` (any class: it defines the hooks it needs, nothing else), its
constructor's arguments, and the reserved keys of :data:`RESERVED`. The name is the callback's
identity: its state's key in a checkpoint and its name in every message.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from utils.checkpoint.format import MAX_REASON
from utils.config.arguments import check_node
from utils.config.trust import MAX_PLAIN_SIZE, plain_data
from utils.errors import UserError, print_error
from utils.system import distributed
from utils.system.signals import Interrupted

log = logging.getLogger("torchloom")

# Read-only hooks see what the loop already has; on_log and on_validation_end may return a
# reason (a string) to stop the run. The step hooks change things, once per optimizer step,
# only for an entry with mutable: true.
READ_HOOKS = (
    "on_fit_start",
    "on_epoch_start",
    "on_log",
    "on_validation_end",
    "on_checkpoint",
    "on_fit_end",
    "on_exception",
)
STEP_HOOKS = ("on_after_backward", "on_before_optimizer_step", "on_after_optimizer_step")
STOPPING_HOOKS = ("on_log", "on_validation_end")
# The keys of an entry that are not constructor arguments: (their types, default).
RESERVED = {
    "order": (int, 0),  # called in ascending order; entries of one order as declared
    "mutable": (bool, False),  # gets the step hooks (and with them the model and optimizer)
    "all_ranks": (bool, False),  # under torchrun: called in every process, not rank 0 only
    "on_error": (str, "raise"),  # raise: a hook that raises ends the run | warn: go on
}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


class CallbackFailed(Exception):
    """A callback's hook raised: the run ends with this one line, as a failed run (exit 1)."""

    def report(self) -> None:
        """The one line on stderr; the traceback of the callback's own error in the log file."""
        print_error(self)
        cause = self.__cause__
        if cause is None:
            return
        record = log.makeRecord(log.name, logging.ERROR, __file__, 0, str(self), (), None)
        record.exc_info = (type(cause), cause, cause.__traceback__)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)


@dataclass(frozen=True)
class Entry:
    """One checked ``callbacks.<name>`` entry."""

    name: str
    target: type
    arguments: dict
    order: int = 0
    mutable: bool = False
    all_ranks: bool = False
    on_error: str = "raise"


@dataclass(frozen=True)
class FitInfo:
    """What ``on_fit_start`` sees: a copy of the run's config, its folders, the split sizes."""

    config: dict
    run_dir: Path
    checkpoint_dir: Path
    dataset_sizes: dict
    world_size: int
    rank: int
    resumed: bool


@dataclass(frozen=True)
class StepView:
    """What the step hooks of a ``mutable`` entry get: the unwrapped model, the optimizer and
    the loss scaler to change, and the optimizer step (1-based, as the history numbers it)."""

    model: Any
    optimizer: Any
    scaler: Any
    global_step: int
    epoch: int


def entries_of(config: Any, world_size: int = 1) -> list[Entry]:
    """The checked entries of the ``callbacks`` node, in calling order. An entry without
    ``_target_``, another ``_key_``, a target that does not import, arguments that do not bind
    or a hook its settings never call: one line naming the entry."""
    from hydra._internal.utils import _locate

    node = (
        OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config
    )
    entries = []
    for name, entry in (node or {}).items():
        where = f"callbacks.{name}"
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise UserError(f"{where}: a callback's name is letters, digits, _ and - (64 at most)")
        if not isinstance(entry, dict):
            raise UserError(f"{where}={entry!r} is not an entry; give it +{where}._target_=...")
        _check_keys(where, entry)
        try:
            target = _locate(entry["_target_"])
        except Exception:
            raise UserError(
                f"{where}._target_={entry['_target_']!r} cannot be imported; check its module "
                "and class name (is its folder on PYTHONPATH?)"
            ) from None
        if not isinstance(target, type):
            raise UserError(f"{where}._target_={entry['_target_']!r} is not a class")
        settings = {key: entry.get(key, default) for key, (_, default) in RESERVED.items()}
        arguments = {k: v for k, v in entry.items() if k not in RESERVED and k != "_target_"}
        checked = Entry(name, target, arguments, **settings)
        _check_hooks(where, checked, world_size)
        check_node(where, {"_target_": entry["_target_"], **arguments}, target)
        entries.append(checked)
    return sorted(entries, key=lambda e: e.order)  # a stable sort: declaration order within


def _check_keys(where: str, entry: dict) -> None:
    special = [key for key in entry if str(key).startswith("_") and key != "_target_"]
    if special:
        guess = difflib.get_close_matches(str(special[0]), ["_target_"], n=1)
        hint = "did you mean _target_? " if guess else ""
        raise UserError(
            f"{where}.{special[0]} is not a key of a callback entry; {hint}an entry takes "
            f"_target_, {', '.join(RESERVED)} and its class's arguments"
        )
    if "_target_" not in entry:
        raise UserError(
            f"{where} has no _target_; name its class: +{where}._target_=my_pkg.MyCallback"
        )
    for key, (kind, _) in RESERVED.items():
        value = entry.get(key, RESERVED[key][1])
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UserError(f"{where}.{key}={value!r} must be a {kind.__name__}")
    if entry.get("on_error", "raise") not in ("raise", "warn"):
        raise UserError(f"{where}.on_error={entry['on_error']!r} must be raise or warn")


def _check_hooks(where: str, entry: Entry, world_size: int) -> None:
    target = entry.target
    defined = [hook for hook in (*READ_HOOKS, *STEP_HOOKS) if callable(getattr(target, hook, None))]
    step_hooks = [hook for hook in defined if hook in STEP_HOOKS]
    if not defined:
        raise UserError(
            f"{where}: {target.__qualname__} defines none of the hooks ({', '.join(READ_HOOKS)}, "
            f"{', '.join(STEP_HOOKS)}); docs/callbacks.md shows them"
        )
    if step_hooks and not entry.mutable:
        raise UserError(
            f"{where}: {step_hooks[0]} is called only for an entry that may change the model; "
            f"set {where}.mutable=true"
        )
    if entry.mutable and world_size > 1 and not entry.all_ranks:
        raise UserError(
            f"{where} changes the model, which every process must do alike; set "
            f"{where}.all_ranks=true"
        )
    saves, loads = hasattr(target, "state_dict"), hasattr(target, "load_state_dict")
    if saves != loads:
        raise UserError(
            f"{where}: {target.__qualname__} defines "
            f"{'state_dict' if saves else 'load_state_dict'} without "
            f"{'load_state_dict' if saves else 'state_dict'}; define both for its state to resume"
        )


class Callbacks:
    """The built callbacks of this process, and the calls the loop makes into them."""

    def __init__(self, entries: list[Entry], is_main: bool = True) -> None:
        self.entries = entries
        self.built: dict[str, Any] = {}  # name → instance, in calling order
        self.settings = {entry.name: entry for entry in entries}
        for entry in entries:
            if entry.all_ranks or is_main:
                self.built[entry.name] = self._guarded(entry.name, "__init__", entry.target)(
                    **entry.arguments
                )
        # the hooks of every process's entries: collectives run where any process calls one
        self.anywhere = {
            hook for entry in entries for hook in STOPPING_HOOKS if hasattr(entry.target, hook)
        }
        self.mutating = any(hasattr(self.built.get(e.name), h) for e in entries for h in STEP_HOOKS)
        self.unscaled = any(hasattr(c, "on_before_optimizer_step") for c in self._mutable())

    @classmethod
    def build(cls, config: Any, processes: Any) -> Callbacks:
        """The ``callbacks`` node's entries, built in this process (``processes``: its rank)."""
        return cls(entries_of(config, processes.world_size), processes.is_main)

    def _mutable(self) -> list[Any]:
        return [self.built[e.name] for e in self.entries if e.mutable and e.name in self.built]

    # --- Calling -------------------------------------------------------------------------------

    def _guarded(self, name: str, hook: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except UserError:  # a ready-made callback's one line about its own arguments
                raise
            # sys.exit() in a hook is a failing callback too, not the run's own end: it would
            # end the run with exit 0, no checkpoint and no metrics.json.
            except (Exception, SystemExit) as error:
                message = f"callback {name}.{hook} raised {type(error).__name__}: {error}"
                entry = self.settings.get(name)
                if entry is None or entry.on_error == "raise" or hook == "__init__":
                    raise CallbackFailed(message) from error
                log.warning("warning: %s; going on (on_error: warn)", message)
                return None

        return call

    def _call(self, hook: str, *args: Any) -> list[tuple[str, Any]]:
        """Each built callback's ``hook`` that it defines, in order: (name, what it returned)."""
        answers = []
        for name, callback in self.built.items():
            method = getattr(callback, hook, None)
            if method is not None and (hook not in STEP_HOOKS or self.settings[name].mutable):
                answers.append((name, self._guarded(name, hook, method)(*args)))
        return answers

    def _stop_asked(self, hook: str, answers: list, epoch: int, step: int) -> dict | None:
        """The first stop a callback asked in any process (agreed by all), as ``stopped_by``."""
        asked = None
        for name, answer in answers:
            if answer is not None and not (isinstance(answer, str) and answer):
                raise CallbackFailed(
                    f"callback {name}.{hook} returned {answer!r}; return a reason (a string) "
                    "to stop the run, or None"
                )
            if answer and asked is None:
                reason = answer[:MAX_REASON]
                asked = {"callback": name, "reason": reason, "epoch": epoch, "step": step}
        if hook in self.anywhere and distributed.is_distributed():
            asked = distributed.first_of(asked)
        return asked

    def fit_start(self, run: Any, sizes: dict, processes: Any) -> None:
        info = FitInfo(
            config=OmegaConf.to_container(OmegaConf.create(run.record.resolved)),
            run_dir=Path(run.run_dir),
            checkpoint_dir=Path(run.checkpoint_dir),
            dataset_sizes=dict(sizes),
            world_size=processes.world_size,
            rank=processes.rank,
            resumed=bool(run.resumed),
        )
        self._call("on_fit_start", info)

    def epoch_start(self, epoch: int) -> None:
        self._call("on_epoch_start", epoch)

    def log(self, state: Any, metrics: dict) -> None:
        """Training points of the history at ``state.global_step``; a stop asked is put in
        ``state.stopped_by`` (the loop ends at this step, with a checkpoint)."""
        if not self.entries:
            return
        answers = self._call("on_log", state.global_step, dict(metrics))
        self._stop(state, self._stop_asked("on_log", answers, state.epoch + 1, state.global_step))

    def validation_end(self, state: Any) -> None:
        """After a validation (before its checkpoint, so that a stop asked is saved with it)."""
        if not self.entries:
            return
        answers = self._call("on_validation_end", state.epoch, dict(state.metrics))
        self._stop(
            state, self._stop_asked("on_validation_end", answers, state.epoch, state.global_step)
        )

    def _stop(self, state: Any, asked: dict | None) -> None:
        if asked and not state.stopped_by:
            state.stopped_by = asked
            log.info("stopped by callback %s: %s", asked["callback"], asked["reason"])

    def checkpoint(self, path: Path, kind: str) -> None:
        self._call("on_checkpoint", path, kind)

    def fit_end(self, status: str, metrics: dict) -> None:
        self._call("on_fit_end", status, dict(metrics))

    def step(self, hook: str, view: StepView) -> None:
        """A step hook of the mutable entries (``hook``: one of :data:`STEP_HOOKS`)."""
        self._call(hook, view)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """A run that fails inside: each callback's ``on_exception`` (whose own failures are
        warnings: they never hide the run's), then the failure goes on."""
        try:
            yield
        except Interrupted:
            raise
        except Exception as error:
            for name, callback in self.built.items():
                if hasattr(callback, "on_exception"):
                    try:
                        callback.on_exception(error)
                    except Exception as own:
                        log.warning("warning: callback %s.on_exception raised %r", name, own)
            raise

    # --- State ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Each callback's state under its name, checked to be plain data."""
        states = {}
        for name, callback in self.built.items():
            if hasattr(callback, "state_dict"):
                state = self._guarded(name, "state_dict", callback.state_dict)()
                if not plain_data(state):
                    raise CallbackFailed(
                        f"callback {name}.state_dict returned {type(state).__name__} data that "
                        "is not plain (numbers, strings, lists and dicts with string keys) or "
                        f"is over {MAX_PLAIN_SIZE // 2**20} M characters"
                    )
                states[name] = state
        return states

    def load_state_dict(self, stored: Any, source: Path) -> None:
        """Give each callback its state saved under its name in ``source`` (untrusted: plain
        data only). A state nobody takes is one warning; a callback without one starts fresh."""
        if stored is None:
            stored = {}
        if not isinstance(stored, dict) or not plain_data(stored):
            raise UserError(
                f"cannot resume from {source}: its callbacks state is not plain data within "
                f"{MAX_PLAIN_SIZE // 2**20} M characters (was it edited?); use init_from=... "
                "to start from its weights"
            )
        for name, state in stored.items():
            callback = self.built.get(name)
            if callback is not None and hasattr(callback, "load_state_dict"):
                self._guarded(name, "load_state_dict", callback.load_state_dict)(state)
            elif name not in self.settings:
                log.warning(
                    "warning: %s holds the state of callback %r, which this command does not "
                    "declare; it is not carried on",
                    source,
                    name,
                )

    def honours(self, stopped_by: Any) -> bool:
        """Whether a stop a checkpoint recorded still applies: its callback is still declared."""
        name = stopped_by.get("callback") if isinstance(stopped_by, dict) else None
        if name in self.settings:
            return True
        log.info(
            "callback %r stopped the run, and this command does not declare it: it goes on", name
        )
        return False
