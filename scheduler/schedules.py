"""When jobs fire: cron in an IANA timezone with jobq's DST rules, one-offs, misfire planning.

What an expression means is `jobq.crondialect`'s: it validates the text and hands croniter the
fields as explicit values.

croniter iterates *wall-clock* time only (naive datetimes, pure calendar arithmetic). Turning
wall-clock matches into instants is ours, done segment by segment between the zone's UTC
offset changes, so that the DST rules hold exactly:

* spring-forward gap: a wall time that does not exist is skipped; with `dst_gap=shift` the
  job fires once at the first valid instant after the gap.
* fall-back overlap: a repeated wall time fires once, at its first occurrence; with
  `dst_overlap=twice` it fires at both. Wildcard jobs (minute or hour field starting with
  `*`, as in Vixie cron) fire at every real instant whose wall time matches, in both passes.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterBadDateError

from jobq.crondialect import ALIASES, DIALECTS, CronExpr, parse_cron
from jobq.errors import InvalidCron, UnknownTimezone
from jobq.instants import to_iso as _format_instant
from jobq.models import DstGap, DstOverlap, Job, MisfirePolicy, Schedule, ScheduleType

__all__ = [  # the dialect's names are re-exported: callers know schedules, not the dialect module
    "ALIASES",
    "DIALECTS",
    "MISFIRE_THRESHOLD_MS",
    "CronExpr",
    "CronSchedule",
    "FirePlan",
    "count_fires",
    "last_fire_before",
    "Transition",
    "cron_for",
    "jitter_ms",
    "next_fire",
    "next_fire_times",
    "parse_cron",
    "plan_fires",
    "to_iso",
    "transitions_between",
    "zone",
]

MISFIRE_THRESHOLD_MS = 60_000
_EPOCH = datetime(1970, 1, 1)
_SECOND = 1000
_HOUR = 3_600_000
_PROBE_MS = 6 * _HOUR  # no zone changes its offset twice within six hours


@functools.lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The IANA zone, or `UnknownTimezone` naming it."""
    try:
        if not name or name != name.strip() or ".." in name or name.startswith("/"):
            raise ValueError
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise UnknownTimezone(
            f"unknown timezone {name!r}; use an IANA name such as 'America/New_York'", field="timezone"
        ) from None


def _offset_ms(tz: ZoneInfo, instant_ms: int) -> int:
    offset = datetime.fromtimestamp(instant_ms / 1000, tz).utcoffset()
    assert offset is not None
    return offset // timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class Transition:
    at_ms: int  # first instant with the new offset
    before_ms: int
    after_ms: int


@functools.lru_cache(maxsize=4096)
def _transitions_in_year(tz: ZoneInfo, year: int) -> tuple[Transition, ...]:
    """The zone's offset changes during the UTC year, found by probing then bisecting to the second."""
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp()) * 1000
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp()) * 1000
    found: list[Transition] = []
    lo, lo_offset = start, _offset_ms(tz, start)
    while lo < end:
        hi = min(lo + _PROBE_MS, end)
        hi_offset = _offset_ms(tz, hi)
        if hi_offset != lo_offset:
            a, b = lo, hi  # offset(a) == lo_offset, offset(b) != lo_offset
            while b - a > _SECOND:
                mid = (a + b) // 2 // _SECOND * _SECOND
                if mid <= a:
                    mid = a + _SECOND
                if _offset_ms(tz, mid) == lo_offset:
                    a = mid
                else:
                    b = mid
            found.append(Transition(b, lo_offset, _offset_ms(tz, b)))
        lo, lo_offset = hi, hi_offset
    return tuple(found)


def _next_transition(tz: ZoneInfo, after_ms: int, until_ms: int) -> Transition | None:
    """The first offset change at an instant in (after_ms, until_ms]."""
    year = datetime.fromtimestamp(after_ms / 1000, UTC).year
    last_year = datetime.fromtimestamp(until_ms / 1000, UTC).year
    while year <= last_year:
        for t in _transitions_in_year(tz, year):
            if t.at_ms > until_ms:
                return None
            if t.at_ms > after_ms:
                return t
        year += 1
    return None


def transitions_between(tz: ZoneInfo, after_ms: int, until_ms: int) -> list[Transition]:
    """The zone's offset changes at instants in (after_ms, until_ms], in order."""
    found: list[Transition] = []
    cursor = after_ms
    while (change := _next_transition(tz, cursor, until_ms)) is not None:
        found.append(change)
        cursor = change.at_ms
    return found


class CronSchedule:
    """A cron expression in a timezone, with jobq's DST rules. Thread-safe."""

    def __init__(
        self,
        expression: str,
        timezone: str = "UTC",
        *,
        dialect: str = "unix",
        dst_gap: DstGap = DstGap.SKIP,
        dst_overlap: DstOverlap = DstOverlap.ONCE,
    ) -> None:
        self.expr = parse_cron(expression, dialect)
        self.tz = zone(timezone)
        self.dst_gap = dst_gap
        self.dst_overlap = dst_overlap
        self._iter = croniter(
            self.expr.croniter_expression,
            datetime(2026, 1, 1),
            day_or=self.expr.day_or,
            second_at_beginning=self.expr.has_seconds,
        )
        self._lock = threading.Lock()

    @property
    def expression(self) -> str:
        return self.expr.expression

    def _wall_next(self, wall_ms: int, *, inclusive: bool) -> int | None:
        """The first wall-clock match after (or at, when inclusive) `wall_ms`, as naive ms."""
        start = _EPOCH + timedelta(milliseconds=wall_ms - (1 if inclusive else 0))
        with self._lock:
            self._iter.set_current(start, force=True)
            try:
                found: datetime = self._iter.get_next(datetime)
            except CroniterBadDateError:
                return None
        return (found - _EPOCH) // timedelta(milliseconds=1)

    def wall_matches(self, from_wall_ms: int, until_wall_ms: int, limit: int) -> list[int]:
        """Wall-clock matches (naive ms) in [from_wall_ms, until_wall_ms), at most `limit` of them."""
        found: list[int] = []
        wall = self._wall_next(from_wall_ms, inclusive=True)
        while wall is not None and wall < until_wall_ms and len(found) < limit:
            found.append(wall)
            wall = self._wall_next(wall, inclusive=False)
        return found

    def _fires_in_second_pass(self, instant_ms: int) -> bool:
        if self.expr.wildcard or self.dst_overlap is DstOverlap.TWICE:
            return True
        return datetime.fromtimestamp(instant_ms / 1000, self.tz).fold == 0

    def next_after(self, after_ms: int) -> int | None:
        """The first fire instant strictly after `after_ms`, or None if it never fires again."""
        start, inclusive = after_ms, False
        for _ in range(10_000):
            offset = _offset_ms(self.tz, start)
            wall = self._wall_next(start + offset, inclusive=inclusive)
            if wall is None:
                return None
            instant = wall - offset
            change = _next_transition(self.tz, start, instant)
            if change is None:
                if self._fires_in_second_pass(instant):
                    return instant
                start, inclusive = instant, False
                continue
            # Only fixed-time jobs shift out of a gap; wildcard jobs just have no occurrences in it.
            if change.after_ms > change.before_ms and self.dst_gap is DstGap.SHIFT and not self.expr.wildcard:
                gap_start, gap_end = change.at_ms + change.before_ms, change.at_ms + change.after_ms
                in_gap = self._wall_next(gap_start, inclusive=True)
                if in_gap is not None and in_gap < gap_end and change.at_ms > after_ms:
                    return change.at_ms
            start, inclusive = change.at_ms, True
        raise InvalidCron(f"cron expression {self.expression!r} did not resolve to a fire time")

    def iter_after(self, after_ms: int) -> Iterator[int]:
        current: int | None = after_ms
        while True:
            assert current is not None
            current = self.next_after(current)
            if current is None:
                return
            yield current

    def fire_times(self, after_ms: int, n: int) -> list[int]:
        out: list[int] = []
        for instant in self.iter_after(after_ms):
            if len(out) >= n:
                break
            out.append(instant)
        return out


@functools.lru_cache(maxsize=10_000)
def cron_for(schedule: Schedule) -> CronSchedule:
    """The (cached) cron schedule of a CRON `Schedule`."""
    assert schedule.cron is not None
    return CronSchedule(schedule.cron, schedule.timezone, dst_gap=schedule.dst_gap, dst_overlap=schedule.dst_overlap)


def next_fire(schedule: Schedule, after_ms: int) -> int | None:
    """The schedule's first nominal fire strictly after `after_ms` (one-offs: their instant)."""
    if schedule.type is ScheduleType.CRON:
        return cron_for(schedule).next_after(after_ms)
    assert schedule.at_ms is not None
    return schedule.at_ms if schedule.at_ms > after_ms else None


def next_fire_times(schedule: Schedule, after_ms: int, n: int = 5) -> list[int]:
    """A preview of the next `n` nominal fire times."""
    if schedule.type is ScheduleType.CRON:
        return cron_for(schedule).fire_times(after_ms, n)
    assert schedule.at_ms is not None
    return [schedule.at_ms][:n]


def jitter_ms(job_id: str, nominal_ms: int, jitter_s: int) -> int:
    """A deterministic offset in [0, jitter_s] seconds, the same for the same job and fire."""
    if jitter_s <= 0:
        return 0
    digest = hashlib.blake2b(f"{job_id}:{nominal_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (jitter_s * 1000 + 1)


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What beat materialises for a job in one pass."""

    fires: list[int]  # nominal times to create runs for, in order
    missed: int  # late fires beat does not turn into runs (the scanner counts the late runs it handles)
    next_fire_ms: int | None  # where the job's schedule resumes (None: exhausted)
    collapsed_into: int | None = None  # fire_once_now: the newest missed fire, which stands for the misses


EXACT_COUNT = 64  # missed fires counted one by one; beyond, the count is extrapolated from their spacing


def count_fires(schedule: CronSchedule, start_ms: int, end_ms: int) -> int:
    """How many fires fall in [start_ms, end_ms). Exact up to `EXACT_COUNT`; beyond that the rest
    are extrapolated from the mean spacing of those (exact for evenly spaced schedules such as
    `*/5 * * * * *`), so a per-second job down for a day costs a few dozen steps, not 86,400."""
    first = schedule.next_after(start_ms - 1)
    cursor = first
    n = 0
    while cursor is not None and cursor < end_ms:
        n += 1
        if n == EXACT_COUNT and first is not None and cursor > first:
            spacing = (cursor - first) / (n - 1)
            return n + int((end_ms - 1 - cursor) // spacing)
        cursor = schedule.next_after(cursor)
    return n


def last_fire_before(schedule: CronSchedule, before_ms: int, not_before_ms: int) -> int | None:
    """The newest fire in [not_before_ms, before_ms), found by looking back twice as far each time."""
    reach = _SECOND
    while True:
        start = max(not_before_ms, before_ms - reach)
        found = schedule.next_after(start - 1)
        if found is not None and found < before_ms:
            while (following := schedule.next_after(found)) is not None and following < before_ms:
                found = following
            return found
        if start == not_before_ms:
            return None
        reach *= 2


def plan_fires(
    job: Job,
    now_ms: int,
    horizon_ms: int,
    *,
    limit: int = 1000,
    misfire_threshold_ms: int = MISFIRE_THRESHOLD_MS,
) -> FirePlan:
    """The recurring job's fires from `job.next_fire_ms` up to `now_ms + horizon_ms`, after the
    misfire policy. Fires late by more than the threshold are missed: those older than the catch-up
    window are dropped under every policy; the rest are dropped (`skip`), collapsed into the newest
    missed fire (`fire_once_now`, the same run the scanner keeps when it was the one that was down)
    or all kept (`fire_all`). Each missed fire is counted once: here when it gets no run, by the
    scanner when it handles its run late."""
    assert job.next_fire_ms is not None
    schedule = cron_for(job.schedule)
    start = job.next_fire_ms
    first: int | None = start
    late_before = now_ms - misfire_threshold_ms
    fires: list[int] = []
    missed = 0
    collapsed: int | None = None
    if start < late_before:
        window_start = now_ms - job.catchup_window_s * 1000
        first = schedule.next_after(late_before - 1)
        kept_from = start if start >= window_start else schedule.next_after(window_start - 1)
        if kept_from is not None and kept_from >= late_before:
            kept_from = None  # every miss is older than the window
        missed = count_fires(schedule, start, kept_from if kept_from is not None else late_before)
        if kept_from is not None:
            if job.misfire_policy is MisfirePolicy.FIRE_ALL:
                cursor: int | None = kept_from
                while cursor is not None and cursor < late_before and len(fires) < limit:
                    fires.append(cursor)
                    cursor = schedule.next_after(cursor)
                if cursor is not None and cursor < late_before:  # more misses than one pass takes
                    return FirePlan(fires, missed, cursor)
            elif job.misfire_policy is MisfirePolicy.FIRE_ONCE_NOW:
                collapsed = last_fire_before(schedule, late_before, kept_from)
                assert collapsed is not None  # kept_from itself is one
                missed += count_fires(schedule, kept_from, collapsed)
                fires.append(collapsed)
            else:
                missed += count_fires(schedule, kept_from, late_before)
    end = now_ms + horizon_ms
    cursor = first
    while cursor is not None and cursor <= end and len(fires) < limit:
        fires.append(cursor)
        cursor = schedule.next_after(cursor)
    return FirePlan(fires, missed, cursor, collapsed)


def to_iso(ms: int) -> str:
    """`2026-10-01T06:00:00.000Z`; total, as `jobq.instants.to_iso` (instants past year 9999 included)."""
    return _format_instant(ms)
