"""The one exception type for mistakes a user can make and fix."""

import errno
import re

from utils.text import brief, escaped, without_url_passwords


class UserError(Exception):
    """Bad input from the user: a config value, a missing file, a label out of range.

    The entry points print its message as one line and exit non-zero; no traceback, because
    the bug is in the input, not in our code. The message names the key, value or path and
    the fix.
    """


EXIT_USER_ERROR = 2
EXIT_FAILED = 1  # a run that failed: as Python exits on an uncaught error (a callback that raised)


# What the system says of a path a user can change (too long, through a file, full, read-only):
# one line naming the path and the fix, as for any bad input, instead of a traceback.
PATH_ERRORS = {
    errno.ENAMETOOLONG: "a part of it is longer than the file system allows (255 bytes); shorten it",
    errno.ENOTDIR: "a part of it is a file, not a folder; choose another path",
    errno.EISDIR: "it is a folder; name a file",
    errno.ENOSPC: "the disk is full; free space or write elsewhere",
    errno.EDQUOT: "the disk quota is used up; free space or write elsewhere",
    errno.EFBIG: "the file grew past what this file system (or ulimit -f) allows",
    errno.EACCES: "permission denied; choose a path you may use",
    errno.EROFS: "the file system is read-only; write elsewhere",
}


def path_error(error: OSError) -> UserError | None:
    """The one-line error for an OS error on a path a user can change; None for others."""
    if error.errno not in PATH_ERRORS:
        return None
    where = f"{error.filename}: " if error.filename else ""
    return UserError(f"{where}{error.strerror}: {PATH_ERRORS[error.errno]}")


MISSING = re.compile(r"Missing mandatory value: ([\w.\[\]-]+)")  # OmegaConf's, on a ??? value


def required(key: str) -> UserError:
    """A ``???`` value left unset, directly or read through an interpolation."""
    return UserError(f"{key} is required (it is ??? in the config); pass {key}=...")


def user_error_in(error: BaseException | None) -> UserError | None:
    """The UserError among the causes and contexts of ``error`` (a resolver's refusal that
    Hydra wrapped), if any; an OS error on a path (:data:`PATH_ERRORS`) counts as one, and so
    does OmegaConf's refusal to read a ``???`` value."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, UserError):
            return error
        if isinstance(error, OSError) and path_error(error) is not None:
            return path_error(error)
        missing = MISSING.search(str(error))
        if missing and type(error).__module__.startswith("omegaconf"):
            return required(missing[1])
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def print_error(cause: object) -> None:
    """Write ``error: <cause>`` to stderr as one line in one write, so that torchrun's ranks,
    which share one stderr, never interleave their lines (``print`` writes the newline apart,
    and an unbuffered stderr sends the two writes separately). Control characters (an
    exception's ANSI sequence, a line break in a message from elsewhere) are written as
    escapes: the line stays one line and never drives the terminal; a vast one (a value from
    an edited file) is cut to its start and end."""
    import sys

    sys.stderr.write(f"error: {brief(escaped(without_url_passwords(str(cause))))}\n")
    sys.stderr.flush()
