"""Tables drawn as plain text, the way rich draws them, without importing rich.

Importing rich costs about 30 ms, a fifth of `jobq list`'s start-up on the embedded default. A
table that fits the console is drawn here exactly as `rich.table.Table` draws it with our
console's settings: the heavy-headed box, one space of padding, every column as wide as its
widest cell, cells left-aligned, the header bold only on a terminal. `draw` answers None whenever
it cannot vouch for rich's output (a table wider than the console, whose columns rich would fold;
a character that is not printable ASCII, whose width on screen rich measures with its own tables;
an output encoding other than UTF-8, where rich draws an ASCII box): the caller then prints through
rich, as before. tests/test_cli_startup.py compares both drawings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

PIPED_WIDTH = 240  # piped output (scripts, logs) gets whole values: rich would assume 80 columns
_BOLD, _RESET = "\x1b[1m", "\x1b[0m"


def draw(headers: Sequence[str], rows: Sequence[Sequence[str]], *, width: int, bold: bool) -> str | None:
    """The table's lines (each ending in a newline), or None when only rich can draw it."""
    if not all(_one_cell_each(cell) for cell in (*headers, *(c for row in rows for c in row))):
        return None
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    if sum(widths) + 3 * len(widths) + 1 > width:  # each cell is padded by a space each side
        return None

    def rule(left: str, line: str, cross: str, right: str) -> str:
        return left + cross.join(line * (w + 2) for w in widths) + right

    def cells(values: Sequence[str], style: bool = False) -> list[str]:
        padded = [f" {v.ljust(w)} " for v, w in zip(values, widths, strict=True)]
        return [f"{_BOLD}{p}{_RESET}" for p in padded] if style else padded

    lines = [
        rule("┏", "━", "┳", "┓"),
        "┃" + "┃".join(cells(headers, bold)) + "┃",
        rule("┡", "━", "╇", "┩"),
        *("│" + "│".join(cells(row)) + "│" for row in rows),
        rule("└", "─", "┴", "┘"),
    ]
    return "".join(line + "\n" for line in lines)


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
