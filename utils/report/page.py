"""A report as one self-contained HTML file: its pictures embedded as base64 PNGs, no script,
no stylesheet or font fetched, every piece of text escaped (a class named ``<script>`` shows as
text). Written atomically, so a reader never finds half a page."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from utils.files import write_file

STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .6em;
text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}
p.note{background:#fff6dd;border-left:4px solid #e0a800;padding:.4em .8em}
p.win{background:#fde2e1;border-left:4px solid #c0392b;padding:.4em .8em}
img{max-width:100%;display:block;margin:.5em 0}pre{white-space:pre-wrap;background:#f6f6f6;
padding:.5em}figcaption{color:#555;font-size:.9em}"""


def number(value: Any) -> str:
    """A figure as the report prints it: a float to 4 decimals (large ones whole), NaN and
    infinities by name, anything else as its text."""
    if isinstance(value, bool) or not isinstance(value, float | int):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4f}"


class Page:
    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str, kind: str = "") -> None:
        """A paragraph; ``kind`` ``note`` (a warning) or ``win`` (a baseline beat the run)."""
        style = f' class="{kind}"' if kind else ""
        self.parts.append(f"<p{style}>{html.escape(text)}</p>")

    def preformatted(self, text: str) -> None:
        self.parts.append(f"<pre>{html.escape(text)}</pre>")

    def figures(self, figures: Mapping[str, Any], caption: str = "") -> None:
        """Name → value as a two-column table, each value cell tagged with its name
        (``data-metric``) so a script can read the figures back."""
        rows = "".join(
            f'<tr><td>{html.escape(name)}</td><td class="n" data-metric="{html.escape(name)}">'
            f"{html.escape(number(value))}</td></tr>"
            for name, value in figures.items()
        )
        self._table(f"<tr><th>metric</th><th>value</th></tr>{rows}", caption)

    def table(
        self, header: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = ""
    ) -> None:
        head = "".join(f"<th>{html.escape(str(cell))}</th>" for cell in header)
        head = f"<tr>{head}</tr>" if any(header) else ""
        body = "".join("<tr>" + "".join(_cell(cell) for cell in row) + "</tr>" for row in rows)
        self._table(head + body, caption)

    def _table(self, inner: str, caption: str) -> None:
        said = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        self.parts.append(f"<table>{said}{inner}</table>")

    def picture(self, image: bytes, caption: str) -> None:
        encoded = base64.b64encode(image).decode("ascii")
        said = html.escape(caption)
        self.parts.append(
            f'<figure><img alt="{said}" src="data:image/png;base64,{encoded}">'
            f"<figcaption>{said}</figcaption></figure>"
        )

    def html(self) -> str:
        title = html.escape(self.title)
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{title}</title><style>{STYLE}</style></head>\n<body><h1>{title}</h1>\n"
            + "\n".join(self.parts)
            + "\n</body></html>\n"
        )

    def write(self, path: Path) -> None:
        write_file(path, self.html().encode("utf-8"), "choose a folder this user can write")


def _cell(value: Any) -> str:
    numeric = isinstance(value, float | int) and not isinstance(value, bool)
    style = ' class="n"' if numeric else ""
    return f"<td{style}>{html.escape(number(value))}</td>"
