"""The command line's edge: ``run_cli`` runs a ``@hydra.main`` function so that a command line
Hydra cannot compose ends in one line naming the key and the fix (exit code 1), and a resolver's
refusal in its own one line (exit code 2), instead of Hydra's multi-line report."""

from __future__ import annotations

import os
import sys
from typing import Any

from hydra.errors import InstantiationException
from omegaconf import OmegaConf

from utils.config.build import flatten
from utils.config.familiar import flag_error, ours
from utils.config.resolvers import forget_fresh_folders
from utils.config.schema import CONF
from utils.errors import EXIT_USER_ERROR, print_error, user_error_in
from utils.system.claim import release_claims
from utils.system.cpu_math import same_bits_every_run
from utils.tracking.process import let_early_go


def one_line_errors(command: Any, cfg: Any) -> None:
    """Run ``command(cfg)``; bad input (a :class:`UserError`) ends as one ``error:`` line and
    exit code 2 (evaluate.py's and predict.py's ``main``; train.py's also handles sweeps)."""
    try:
        command(cfg)
    except Exception as error:
        cause = user_error_in(error)  # a UserError, or an OS error on a path the user gave
        if cause is None:
            raise
        print_error(cause)
        sys.exit(EXIT_USER_ERROR)


class ClosedPipeSafe:
    """stdout or stderr whose reader may go away (``train.py | tee log`` and Ctrl-C ends tee
    too): a write to a closed pipe is dropped, and so is everything after it, instead of a
    ``BrokenPipeError`` turning a clean stop into a crash. The file descriptor is pointed at
    /dev/null, so the interpreter's last flush at exit cannot fail either."""

    def __init__(self, stream: Any) -> None:
        self._stream, self._closed = stream, False

    def write(self, text: str) -> int:
        if not self._closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self._closed = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass  # not a real file (a test's StringIO)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self._stream, name)


def run_cli(main: Any, config_name: str) -> None:
    """Run a ``@hydra.main`` function, but a command line Hydra cannot compose (an unknown key
    or group option, a value of the wrong type, an override it cannot parse) ends with one
    line naming the key and the fix, and exit code 1, instead of Hydra's multi-line report.
    Output to a reader that went away is dropped (:class:`ClosedPipeSafe`)."""
    same_bits_every_run()  # before torch's first matrix product: a resumed run ends bit-equal
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ClosedPipeSafe(sys.stdout), ClosedPipeSafe(sys.stderr)
    try:
        flag = flag_error(sys.argv[1:])  # --lr 0.01: argparse's habit, not an override
        if flag:
            print_error(flag)
            sys.exit(1)
        _run(main, config_name)
    except Exception as error:
        cause = user_error_in(error)  # an OS error on a path: Hydra making the run dir
        if cause is None:
            raise
        print_error(cause)
        sys.exit(EXIT_USER_ERROR)
    finally:
        release_claims()  # a run's folder is free again however the run ended (utils/system/claim.py)
        forget_fresh_folders()
        let_early_go()  # a tracker's process forked early that no backend took
        sys.stdout, sys.stderr = streams


def _run(main: Any, config_name: str) -> None:
    if os.environ.get("HYDRA_FULL_ERROR"):  # the user asked for Hydra's full report
        main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing; we report
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        main()
    except (HydraException, OmegaConfBaseException, ValueError, TypeError) as error:
        cause = user_error_in(error)
        if cause is not None:  # a resolver refused a value (run_name, monitor_mode)
            print_error(cause)
            sys.exit(EXIT_USER_ERROR)
        if isinstance(error, InstantiationException) or not _raised_by_hydra(error):
            raise
        print_error(command_line_error(error, config_name))
        sys.exit(1)


def _raised_by_hydra(error: BaseException) -> bool:
    """Whether Hydra or OmegaConf raised ``error`` themselves (while composing the command
    line), rather than our code."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    innermost = frames[-1].filename if frames else ""
    return any(f"{os.sep}{name}{os.sep}" in innermost for name in ("hydra", "omegaconf"))


def command_line_error(error: Exception, config_name: str) -> str:
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = error.__cause__ or error.__context__ or error
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, MissingConfigException) and error.options is not None:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        return (
            f"{group}={option} is not an option; choose one of {', '.join(error.options)} "
            f"(conf/{group}/)"
        )
    if isinstance(error, ValueError) and "Config group override" in str(error):
        for override in sys.argv[1:]:
            key, _, value = override.lstrip("+~").partition("=")
            if (CONF / key).is_dir():
                options = sorted(p.stem for p in (CONF / key).glob("*.yaml"))
                if value not in options:
                    return f"{key}={value} is not an option; choose one of {', '.join(options)}"
    if isinstance(error, TypeError):  # a group given a number or a list of them (model=[8])
        given = [o for o in sys.argv[1:] if (CONF / o.lstrip("+~").partition("=")[0]).is_dir()]
        named = f" ({', '.join(given)})" if given else ""
        return (
            f"a config group's option is a name or a list of names (model=mlp, "
            f"logger=[tensorboard,csv]), not a number{named}; see conf/<group>/ for the names"
        )
    if isinstance(error, OverrideParseException):
        return f"cannot parse an override: {lines[0] if lines else error}; quote values with spaces or brackets"
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        key = cause.full_key
        guess = _closest_key(key, config_name)
        if guess == key:  # it exists, but not under the group option chosen on this line
            return f"{key} is not a key of the {key.split('.')[0]} option chosen; see its YAML"
        if ours(key):  # Lightning's or timm's name for one of ours
            return f"unknown key {key}; torchloom's is {ours(key)}"
        hint = f"did you mean {guess}? " if guess else ""
        group = key.split(".")[0]
        if (CONF / group).is_dir() and "." in key:  # a builder's key: its own argument
            return f"unknown key {key}; {hint}(+{key}=... adds an argument for its builder)"
        return f"unknown key {key}; {hint}conf/ shows every key that is read"
    full_key = getattr(cause, "full_key", None)
    if full_key:  # a value of the wrong type: OmegaConf's first line says which and why
        reason = str(cause).strip().splitlines()[0]
        return f"{full_key}: {reason}; pass a value of that type"
    if not lines:
        return type(error).__name__
    return lines[0] + (f"; {lines[-1].lstrip('0123456789. ')}" if len(lines) > 1 else "")


def _closest_key(key: str, config_name: str) -> str | None:
    """The known key nearest to a mistyped one, from the config as composed without overrides."""
    import difflib

    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            known = list(flatten(OmegaConf.to_container(compose(config_name), resolve=False)))
    except Exception:
        return None
    matches = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return matches[0] if matches else None
