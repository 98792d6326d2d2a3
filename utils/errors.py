"""The one exception type for mistakes a user can make and fix."""


class UserError(Exception):
    """Bad input from the user: a config value, a missing file, a label out of range.

    The entry points print its message as one line and exit non-zero; no traceback, because
    the bug is in the input, not in our code. The message names the key, value or path and
    the fix.
    """


EXIT_USER_ERROR = 2


def user_error_in(error: BaseException | None) -> UserError | None:
    """The UserError among the causes and contexts of ``error`` (a resolver's refusal that
    Hydra wrapped), if any."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, UserError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None
