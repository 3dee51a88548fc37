"""Which text a store can hold (no pydantic here: the light read path of `jobq list` checks its
filters with it; `jobq.bounds` builds the edge's `Text` type on it)."""

from __future__ import annotations


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as text, or None when it can."""
    if "\x00" in value:
        return "contains a NUL character (U+0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (U+D800..U+DFFF), which is not valid Unicode text"
    return None
