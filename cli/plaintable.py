"""Tables drawn as plain text, the way rich draws them, without importing rich.

Importing rich costs about 30 ms, a fifth of `jobq list`'s start-up on the embedded default. A
table that fits the console is drawn here exactly as `rich.table.Table` draws it with our
console's settings: the heavy-headed box, one space of padding, every column as wide as its
widest cell, cells left-aligned, the header bold only on a terminal (tests/test_cli_startup.py
compares both drawings). A table wider than the console keeps the `whole` column (ids: they are
copied with a double click) and narrows the widest of the others, one character at a time, until
it fits; their cells wrap at spaces, and a word longer than its column folds. That is rich's
approach, though not always its line breaks.

`draw` answers None when it cannot vouch for the output (a character that is not printable ASCII,
whose width on screen rich measures with its own tables, or a console too narrow for the `whole`
column and one character of every other), and `layout` when rich's styling would not be the
plain one (an output encoding other than UTF-8, FORCE_COLOR, TTY_COMPATIBLE); the caller then
prints through rich.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

PIPED_WIDTH = 240  # piped output (scripts, logs) gets whole values: rich would assume 80 columns
_BOLD, _RESET = "\x1b[1m", "\x1b[0m"


def draw(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, width: int, bold: bool, whole: int | None = None
) -> str | None:
    """The table's lines (each ending in a newline), or None when only rich can draw it."""
    if not all(_one_cell_each(cell) for cell in (*headers, *(c for row in rows for c in row))):
        return None
    widths = _fitted([max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))], width, whole)
    if widths is None:
        return None

    def rule(left: str, line: str, cross: str, right: str) -> str:
        return left + cross.join(line * (w + 2) for w in widths) + right

    def row_lines(values: Sequence[str], edge: str, style: bool, bottom: bool) -> list[str]:
        cells = [_wrapped(v, w) for v, w in zip(values, widths, strict=True)]
        height = max(len(c) for c in cells)
        lines = []
        for n in range(height):
            padded = []
            for cell, w in zip(cells, widths, strict=True):
                at = n - (height - len(cell)) if bottom else n  # a header sits on the rule below it
                text = f" {(cell[at] if 0 <= at < len(cell) else '').ljust(w)} "
                padded.append(f"{_BOLD}{text}{_RESET}" if style else text)
            lines.append(edge + edge.join(padded) + edge)
        return lines

    lines = [
        rule("┏", "━", "┳", "┓"),
        *row_lines(headers, "┃", bold, True),
        rule("┡", "━", "╇", "┩"),
        *(line for row in rows for line in row_lines(row, "│", False, False)),
        rule("└", "─", "┴", "┘"),
    ]
    return "".join(line + "\n" for line in lines)


def _fitted(widths: list[int], width: int, whole: int | None) -> list[int] | None:
    """Column widths (text only) for a console `width` wide: as they are when they fit; else the
    widest column but `whole` narrowed by one, again and again. None when that cannot fit."""
    room = width - 3 * len(widths) - 1  # each cell is padded by a space each side, plus the borders
    fitted = list(widths)
    excess = sum(fitted) - room
    narrowable = [i for i in range(len(fitted)) if i != whole]
    while excess > 0:
        widest = max(narrowable, key=lambda i: fitted[i], default=None)
        if widest is None or fitted[widest] <= 1:
            return None
        fitted[widest] -= 1
        excess -= 1
    return fitted


def _wrapped(text: str, width: int) -> list[str]:
    """`text` on lines of at most `width` characters: whole when it fits, else broken at spaces,
    a longer word folded (a timestamp folds as rich folds it, not at its hyphens)."""
    if len(text) <= width:
        return [text]
    if " " not in text:  # one word (an id, a timestamp, a task name): folded, as textwrap would
        return [text[at : at + width] for at in range(0, len(text), width)]
    import textwrap

    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def _one_cell_each(text: str) -> bool:
    """Every character is printable ASCII: one cell wide on every terminal, measured alike by rich."""
    return text.isascii() and text.isprintable()


def layout(stream: TextIO) -> tuple[int, bool] | None:
    """(width, bold) as the console `jobq.cli.common` makes for `stream` would draw: on a terminal,
    COLUMNS or the terminal's width and a bold header (80 columns and no style if TERM is dumb);
    piped, 240 columns and no style. None when rich's choice hangs on more than that: an encoding
    other than UTF-8 (an ASCII box), FORCE_COLOR or TTY_COMPATIBLE (styles on a pipe)."""
    env = os.environ
    if not (getattr(stream, "encoding", None) or "").lower().startswith("utf") or (
        "FORCE_COLOR" in env or "TTY_COMPATIBLE" in env
    ):
        return None
    try:
        terminal = stream.isatty()
    except ValueError:  # a closed stream
        terminal = False
    if not terminal:
        return PIPED_WIDTH, False
    dumb = env.get("TERM", "").lower() in ("dumb", "unknown")
    columns = env.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns), not dumb
    return (80 if dumb else _terminal_width()), not dumb


def _terminal_width() -> int:
    for fd in (0, 1, 2):  # as rich asks: stdin, stdout, stderr
        try:
            return os.get_terminal_size(fd).columns or 80
        except (AttributeError, ValueError, OSError):
            continue
    return 80
