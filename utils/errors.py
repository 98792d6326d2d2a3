"""The one exception type for mistakes a user can make and fix."""


class UserError(Exception):
    """Bad input from the user: a config value, a missing file, a label out of range.

    The entry points print its message as one line and exit non-zero; no traceback, because
    the bug is in the input, not in our code. The message names the key, value or path and
    the fix.
    """


EXIT_USER_ERROR = 2
