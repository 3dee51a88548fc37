"""Instants: the range jobq accepts at its edge, and a formatting of any instant that never fails.

Times are integer milliseconds since the epoch (UTC). What a user may submit is bounded to
`MIN_INSTANT_MS .. MAX_INSTANT_MS` (1970-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z): the
years an ISO 8601 date writes with four digits, and the ones Python's `datetime` represents.

A store may still hold an instant outside that range (a row written by an older version or by
hand, such as the 2^62 due time older versions parked a paused job's runs at), so `to_iso` is
total: it formats every integer, writing years outside 0000..9999 in ISO 8601's expanded form (a
sign and at least six digits, as JavaScript's `Date.toISOString` does), e.g.
`+033658-09-27T01:46:40.000Z`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

MIN_INSTANT_MS = 0  # 1970-01-01T00:00:00.000Z
MAX_INSTANT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The Gregorian calendar repeats every 400 years, which are exactly 146,097 days: shifting an
# instant by whole cycles moves its year by multiples of 400 and leaves the rest of its date alone.
_CYCLE_MS = 146_097 * 86_400_000
_CYCLE_YEARS = 400


def in_range(ms: int) -> bool:
    """Whether `ms` is an instant jobq accepts from users."""
    return MIN_INSTANT_MS <= ms <= MAX_INSTANT_MS


def describe_range() -> str:
    return f"{to_iso(MIN_INSTANT_MS)} to {to_iso(MAX_INSTANT_MS)}"


def to_iso(ms: int) -> str:
    """`2026-10-01T06:00:00.000Z`; defined for every integer (see the module docstring)."""
    cycles, rest = divmod(ms, _CYCLE_MS)  # rest lies in 1970 .. 2369, which datetime represents
    moment = _EPOCH + timedelta(milliseconds=rest)
    year = moment.year + cycles * _CYCLE_YEARS
    year_text = f"{year:04d}" if 0 <= year <= 9999 else f"{'+' if year > 0 else '-'}{abs(year):06d}"
    return f"{year_text}{moment.strftime('-%m-%dT%H:%M:%S.')}{ms % 1000:03d}Z"
