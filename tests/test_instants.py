"""Formatting an instant is total: any integer a store can hold renders, never a traceback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from jobq.instants import MAX_INSTANT_MS, MIN_INSTANT_MS, to_iso

_DATETIME_MIN_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z, the first instant datetime holds


@given(st.integers(min_value=_DATETIME_MIN_MS, max_value=MAX_INSTANT_MS))
def test_to_iso_is_the_calendar_date_for_every_year_datetime_can_hold(ms: int) -> None:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert to_iso(ms) == f"{moment.year:04d}" + moment.strftime("-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_to_iso_formats_every_64_bit_instant(ms: int) -> None:
    text = to_iso(ms)
    assert text.endswith(f".{ms % 1000:03d}Z")
    if MIN_INSTANT_MS <= ms <= MAX_INSTANT_MS:
        assert len(text) == len("2026-10-01T06:00:00.000Z")


def test_years_past_9999_are_written_in_the_expanded_iso_form() -> None:
    assert to_iso(10**15) == "+033658-09-27T01:46:40.000Z"  # as JavaScript's Date.toISOString
    assert to_iso(MAX_INSTANT_MS) == "9999-12-31T23:59:59.999Z"
    assert to_iso(MAX_INSTANT_MS + 1) == "+010000-01-01T00:00:00.000Z"
    assert to_iso(2**62) == "+146140482-04-24T15:36:27.904Z"  # where older versions parked a paused job's runs
    assert to_iso(_DATETIME_MIN_MS - 1) == "0000-12-31T23:59:59.999Z"
    assert to_iso(-(10**15)).startswith("-029719-")
