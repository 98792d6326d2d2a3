"""Names that came from data are text, wherever they are shown or written.

Class names, labels, column names and file names come from folders, CSV cells and
checkpoints: from elsewhere. On a terminal, ``[/b]`` would be rich markup (and crash a table),
``[cat]`` would vanish, and an ANSI escape would reach the terminal itself; in a CSV opened in
a spreadsheet, ``=1+1`` or ``@cmd`` would be a live formula.

    shown(name)        # for the console: markup escaped, control characters as \\x1b
    brief(text)        # a long value's start and end, for a line that stays readable
    cell(name)         # for a CSV cell: a leading = + - @ tab or CR made text (OWASP's rule)
    console()          # the console they are shown on: a pipe or a log file is not cut at 80
    LogLines           # every log line, console and file: control characters as escapes,
                       # a URL's password redacted
    without_url_passwords(text)  # s3://KEY:SECRET@bucket -> s3://KEY:<redacted>@bucket
"""

from __future__ import annotations

import logging
import re
import sys
import unicodedata

from rich.console import Console
from rich.markup import escape

PIPED_WIDTH = 1000  # not a terminal (| tee, a job's log): lines whole, tables at their width


def console(stderr: bool = False, quiet: bool = False) -> Console:
    """A rich console: a terminal's own width, else :data:`PIPED_WIDTH`, so a piped table
    keeps its overrides whole and a line is never wrapped mid-phrase."""
    terminal = Console(stderr=stderr).is_terminal
    return Console(stderr=stderr, quiet=quiet, width=None if terminal else PIPED_WIDTH)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def shown(name: object) -> str:
    """``name`` as the console should print it: control and format characters written as
    escapes, and rich markup escaped, so what is printed is exactly the text."""
    return escape(escaped(str(name)))


def first_line(error: BaseException) -> str:
    """An exception's message as one line: its first, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def brief(text: str, limit: int = 2000) -> str:
    """``text``, or when longer than ``limit`` its start and end with the count left out
    between: a value from an edited file (a list of 100,000 layers) keeps a line readable."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]} ... ({len(text) - head - tail:,} characters left out) ... {text[-tail:]}"


def escaped(text: str, keep: str = "") -> str:
    """``text`` with its control and format characters (but those in ``keep``) as escapes."""
    return "".join(
        char.encode("unicode_escape").decode("ascii")
        if unicodedata.category(char) in ("Cc", "Cf") and char not in keep
        else char
        for char in text
    )


REDACTED = "<redacted>"
# A URL's user information, scheme://user:password@host: the password is what follows the
# first colon after the scheme, up to the @ before the host (utils/config/secrets.py records
# it nowhere; here, it is shown nowhere).
URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)([^\s/@]+)(@)")


def url_passwords(text: str) -> list[str]:
    """The passwords of the URLs in ``text``."""
    return [found[2] for found in URL_PASSWORD.finditer(text) if found[2] != REDACTED]


def without_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it redacted, and every password of a URL on
    this command line wherever it appears: a library's message quotes a URL without its
    scheme ('KEY:SECRET@bucket/set'), a path's normalisation makes ``s3:/KEY:SECRET@...``."""
    text = URL_PASSWORD.sub(rf"\1{REDACTED}\3", text)
    for password in url_passwords(" ".join(sys.argv)):
        text = text.replace(password, REDACTED)
    return text


class LogLines(logging.Formatter):
    """The log's formatter (conf/hydra/job_logging/torchloom.yaml): a line naming a column, a
    class or a file from the data never sends a control sequence to the terminal, nor a URL's
    password; the line breaks a message holds stay."""

    def format(self, record: logging.LogRecord) -> str:
        return without_url_passwords(escaped(super().format(record), keep="\n"))


def cell(name: object) -> str:
    """``name`` as a CSV cell a spreadsheet shows as text: one that would start a formula gets
    a leading apostrophe; a number (``-0.5``, ``+3``) stays a number."""
    text = str(name)
    return f"'{text}" if text.startswith(FORMULA_STARTS) and not _is_number(text) else text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip() == text
