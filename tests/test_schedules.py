"""Specs for when jobs fire: cron parsing, jobq's DST rules, misfire planning and jitter.

Expected instants are written out by hand (or computed with `zoneinfo` from a wall time), never
taken from the code under test. The property tests compare `CronSchedule.next_after` with a
brute-force oracle that walks UTC instants one step at a time.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobq import schedules
from jobq.errors import InvalidCron, UnknownTimezone
from jobq.models import DstGap, DstOverlap, Job, MisfirePolicy, Schedule, ScheduleType, TaskTarget
from jobq.schedules import CronSchedule, jitter_ms, parse_cron, plan_fires, to_iso

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def utc_ms(text: str) -> int:
    """`2026-11-01T05:00Z` as epoch milliseconds."""
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None
    return int(moment.timestamp() * 1000)


def fires_between(schedule: CronSchedule, after_ms: int, until_ms: int) -> list[int]:
    """Every fire in (after_ms, until_ms]."""
    return list(itertools.takewhile(lambda ms: ms <= until_ms, schedule.iter_after(after_ms)))


def iso_list(instants: list[int]) -> list[str]:
    return [to_iso(ms) for ms in instants]


def local_walls(instants: list[int], tz_name: str) -> list[tuple[int, int]]:
    tz = ZoneInfo(tz_name)
    return [(m.hour, m.minute) for m in (datetime.fromtimestamp(ms / 1000, tz) for ms in instants)]


# --------------------------------------------------------------------------------------------
# DST: America/New_York, 2026-11-01 fall-back (02:00 EDT -> 01:00 EST at 06:00Z)
# --------------------------------------------------------------------------------------------

NY = "America/New_York"


def test_new_york_fall_back_fixed_time_job_fires_once_at_the_first_one_am() -> None:
    schedule = CronSchedule("0 1 * * *", NY)

    fires = fires_between(schedule, utc_ms("2026-10-31T12:00Z"), utc_ms("2026-11-02T12:00Z"))

    assert iso_list(fires) == ["2026-11-01T05:00:00.000Z", "2026-11-02T06:00:00.000Z"]


def test_new_york_fall_back_fixed_time_job_does_not_fire_at_one_am_est() -> None:
    schedule = CronSchedule("0 1 * * *", NY)

    # Asked from just after 01:00 EDT, the next fire is the next day, not 01:00 EST (06:00Z).
    assert schedule.next_after(utc_ms("2026-11-01T05:00Z")) == utc_ms("2026-11-02T06:00Z")


def test_new_york_fall_back_fixed_time_job_with_dst_overlap_twice_fires_in_both_passes() -> None:
    schedule = CronSchedule("0 1 * * *", NY, dst_overlap=DstOverlap.TWICE)

    fires = fires_between(schedule, utc_ms("2026-10-31T12:00Z"), utc_ms("2026-11-02T12:00Z"))

    assert iso_list(fires) == [
        "2026-11-01T05:00:00.000Z",
        "2026-11-01T06:00:00.000Z",
        "2026-11-02T06:00:00.000Z",
    ]


@pytest.mark.parametrize("overlap", list(DstOverlap))
def test_new_york_fall_back_wildcard_job_fires_at_every_real_matching_instant(overlap: DstOverlap) -> None:
    schedule = CronSchedule("*/30 * * * *", NY, dst_overlap=overlap)

    fires = fires_between(schedule, utc_ms("2026-11-01T04:59Z"), utc_ms("2026-11-01T07:00Z"))

    assert iso_list(fires) == [
        "2026-11-01T05:00:00.000Z",  # 01:00 EDT
        "2026-11-01T05:30:00.000Z",  # 01:30 EDT
        "2026-11-01T06:00:00.000Z",  # 01:00 EST
        "2026-11-01T06:30:00.000Z",  # 01:30 EST
        "2026-11-01T07:00:00.000Z",  # 02:00 EST
    ]


# --------------------------------------------------------------------------------------------
# DST: America/New_York, 2026-03-08 spring-forward (02:00 EST -> 03:00 EDT at 07:00Z)
# --------------------------------------------------------------------------------------------


def test_new_york_spring_forward_job_in_the_gap_is_skipped_that_day() -> None:
    schedule = CronSchedule("30 2 * * *", NY)

    fires = fires_between(schedule, utc_ms("2026-03-07T12:00Z"), utc_ms("2026-03-09T12:00Z"))

    assert iso_list(fires) == ["2026-03-09T06:30:00.000Z"]  # 02:30 EDT on 2026-03-09


def test_new_york_spring_forward_job_in_the_gap_with_dst_gap_shift_fires_once_at_three_am_edt() -> None:
    schedule = CronSchedule("30 2 * * *", NY, dst_gap=DstGap.SHIFT)

    fires = fires_between(schedule, utc_ms("2026-03-07T12:00Z"), utc_ms("2026-03-09T12:00Z"))

    assert iso_list(fires) == ["2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z"]


def test_new_york_spring_forward_wildcard_job_has_no_fires_in_the_gap() -> None:
    schedule = CronSchedule("*/30 * * * *", NY)

    fires = fires_between(schedule, utc_ms("2026-03-08T05:59Z"), utc_ms("2026-03-08T08:00Z"))

    assert iso_list(fires) == [
        "2026-03-08T06:00:00.000Z",  # 01:00 EST
        "2026-03-08T06:30:00.000Z",  # 01:30 EST
        "2026-03-08T07:00:00.000Z",  # 03:00 EDT
        "2026-03-08T07:30:00.000Z",  # 03:30 EDT
        "2026-03-08T08:00:00.000Z",  # 04:00 EDT
    ]
    assert all(hour != 2 for hour, _ in local_walls(fires, NY))


def test_spring_forward_wildcard_job_is_not_shifted_out_of_the_gap() -> None:
    """`dst_gap=shift` is for fixed-time jobs: a wildcard job simply has no occurrences in the gap."""
    schedule = CronSchedule("15 * * * *", NY, dst_gap=DstGap.SHIFT)

    fires = fires_between(schedule, utc_ms("2026-03-08T06:50Z"), utc_ms("2026-03-08T08:30Z"))

    assert iso_list(fires) == ["2026-03-08T07:15:00.000Z", "2026-03-08T08:15:00.000Z"]  # 03:15 and 04:15 EDT


# --------------------------------------------------------------------------------------------
# What croniter alone does on those days: the reason jobq wraps it
# --------------------------------------------------------------------------------------------


def croniter_fires(expression: str, tz_name: str, start: datetime, n: int) -> list[str]:
    it = croniter(expression, start.astimezone(ZoneInfo(tz_name)))
    return [it.get_next(datetime).astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ") for _ in range(n)]


def test_croniter_alone_fires_a_fixed_time_job_twice_on_the_fall_back_day() -> None:
    fires = croniter_fires("0 1 * * *", NY, datetime(2026, 10, 31, 16, tzinfo=UTC), 3)

    assert fires == ["2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-02T06:00Z"]
    jobq_fires = CronSchedule("0 1 * * *", NY).fire_times(utc_ms("2026-10-31T16:00Z"), 2)
    assert iso_list(jobq_fires) == ["2026-11-01T05:00:00.000Z", "2026-11-02T06:00:00.000Z"]


def test_croniter_alone_moves_a_job_in_the_spring_forward_gap_to_three_am() -> None:
    fires = croniter_fires("30 2 * * *", NY, datetime(2026, 3, 7, 17, tzinfo=UTC), 2)

    assert fires == ["2026-03-08T07:00Z", "2026-03-09T06:30Z"]
    jobq_fires = CronSchedule("30 2 * * *", NY).fire_times(utc_ms("2026-03-07T17:00Z"), 1)
    assert iso_list(jobq_fires) == ["2026-03-09T06:30:00.000Z"]


# --------------------------------------------------------------------------------------------
# DST: Europe/London 2026 (spring-forward 2026-03-29 01:00Z, fall-back 2026-10-25 01:00Z)
# --------------------------------------------------------------------------------------------

LONDON = "Europe/London"


def test_london_spring_forward_job_in_the_gap_is_skipped_that_day() -> None:
    schedule = CronSchedule("30 1 * * *", LONDON)

    fires = fires_between(schedule, utc_ms("2026-03-28T12:00Z"), utc_ms("2026-03-30T12:00Z"))

    assert iso_list(fires) == ["2026-03-30T00:30:00.000Z"]  # 01:30 BST on 2026-03-30


def test_london_spring_forward_job_in_the_gap_with_dst_gap_shift_fires_once_at_two_am_bst() -> None:
    schedule = CronSchedule("30 1 * * *", LONDON, dst_gap=DstGap.SHIFT)

    fires = fires_between(schedule, utc_ms("2026-03-28T12:00Z"), utc_ms("2026-03-30T12:00Z"))

    assert iso_list(fires) == ["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"]


def test_london_spring_forward_wildcard_job_has_no_fires_in_the_gap() -> None:
    schedule = CronSchedule("*/30 * * * *", LONDON)

    fires = fires_between(schedule, utc_ms("2026-03-28T23:59Z"), utc_ms("2026-03-29T02:00Z"))

    assert iso_list(fires) == [
        "2026-03-29T00:00:00.000Z",  # 00:00 GMT
        "2026-03-29T00:30:00.000Z",  # 00:30 GMT
        "2026-03-29T01:00:00.000Z",  # 02:00 BST
        "2026-03-29T01:30:00.000Z",  # 02:30 BST
        "2026-03-29T02:00:00.000Z",  # 03:00 BST
    ]
    assert all(hour != 1 for hour, _ in local_walls(fires, LONDON))


def test_london_fall_back_fixed_time_job_fires_once_at_the_first_occurrence() -> None:
    schedule = CronSchedule("30 1 * * *", LONDON)

    fires = fires_between(schedule, utc_ms("2026-10-24T12:00Z"), utc_ms("2026-10-26T12:00Z"))

    assert iso_list(fires) == ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]


def test_london_fall_back_fixed_time_job_with_dst_overlap_twice_fires_in_both_passes() -> None:
    schedule = CronSchedule("30 1 * * *", LONDON, dst_overlap=DstOverlap.TWICE)

    fires = fires_between(schedule, utc_ms("2026-10-24T12:00Z"), utc_ms("2026-10-26T12:00Z"))

    assert iso_list(fires) == [
        "2026-10-25T00:30:00.000Z",  # 01:30 BST
        "2026-10-25T01:30:00.000Z",  # 01:30 GMT
        "2026-10-26T01:30:00.000Z",
    ]


def test_london_fall_back_wildcard_job_fires_in_both_passes() -> None:
    schedule = CronSchedule("*/30 * * * *", LONDON)

    fires = fires_between(schedule, utc_ms("2026-10-24T23:59Z"), utc_ms("2026-10-25T02:00Z"))

    assert iso_list(fires) == [
        "2026-10-25T00:00:00.000Z",  # 01:00 BST
        "2026-10-25T00:30:00.000Z",  # 01:30 BST
        "2026-10-25T01:00:00.000Z",  # 01:00 GMT
        "2026-10-25T01:30:00.000Z",  # 01:30 GMT
        "2026-10-25T02:00:00.000Z",  # 02:00 GMT
    ]


# --------------------------------------------------------------------------------------------
# Expressions: fields, aliases, normalisation, day OR semantics, errors
# --------------------------------------------------------------------------------------------


def test_five_field_expression_has_minutes_first() -> None:
    schedule = CronSchedule("30 * * * *")

    assert not schedule.expr.has_seconds
    assert schedule.next_after(utc_ms("2026-06-01T10:00Z")) == utc_ms("2026-06-01T10:30Z")


def test_six_field_expression_has_seconds_first() -> None:
    schedule = CronSchedule("30 * * * * *")

    assert schedule.expr.has_seconds
    assert schedule.next_after(utc_ms("2026-06-01T10:00Z")) == utc_ms("2026-06-01T10:00:30Z")


def test_six_field_expression_fixes_second_minute_and_hour_in_that_order() -> None:
    schedule = CronSchedule("5 10 2 * * *", NY)

    assert schedule.fire_times(utc_ms("2026-06-01T00:00Z"), 2) == [
        utc_ms("2026-06-01T06:10:05Z"),  # 02:10:05 EDT
        utc_ms("2026-06-02T06:10:05Z"),
    ]


@pytest.mark.parametrize(
    ("alias", "expansion"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
    ],
)
def test_alias_is_normalised_to_its_five_field_expansion(alias: str, expansion: str) -> None:
    assert parse_cron(alias).expression == expansion
    assert parse_cron(alias.upper()).expression == expansion


@pytest.mark.parametrize(
    ("alias", "after", "expected"),
    [
        ("@hourly", "2026-06-03T10:15Z", "2026-06-03T11:00Z"),
        ("@daily", "2026-06-03T10:15Z", "2026-06-04T00:00Z"),
        ("@midnight", "2026-06-03T10:15Z", "2026-06-04T00:00Z"),
        ("@weekly", "2026-06-03T10:15Z", "2026-06-07T00:00Z"),  # 2026-06-07 is a Sunday
        ("@monthly", "2026-06-03T10:15Z", "2026-07-01T00:00Z"),
        ("@yearly", "2026-06-03T10:15Z", "2027-01-01T00:00Z"),
        ("@annually", "2026-06-03T10:15Z", "2027-01-01T00:00Z"),
    ],
)
def test_alias_fires_when_its_name_says(alias: str, after: str, expected: str) -> None:
    assert CronSchedule(alias).next_after(utc_ms(after)) == utc_ms(expected)


def test_expression_whitespace_is_collapsed_to_single_spaces() -> None:
    assert parse_cron("  */15 \t 9-17  *\n*   1-5 ").expression == "*/15 9-17 * * 1-5"


def test_expression_names_are_upper_cased() -> None:
    assert parse_cron("0 9 * jan,jul mon-fri").expression == "0 9 * JAN,JUL MON-FRI"


def test_day_of_month_and_day_of_week_both_restricted_fire_on_either() -> None:
    schedule = CronSchedule("0 0 13 * FRI")
    start = utc_ms("2026-04-01T00:00Z")

    fires = fires_between(schedule, start, utc_ms("2026-05-01T00:00Z") - 1)

    april = [date(2026, 4, day) for day in range(1, 31)]
    expected = [d for d in april if d.day == 13 or d.weekday() == 4]  # 13 April 2026 is a Monday
    assert [datetime.fromtimestamp(ms / 1000, UTC).date() for ms in fires] == expected
    assert len(expected) == 5


def test_day_of_month_restricted_and_day_of_week_star_fires_on_that_day_only() -> None:
    schedule = CronSchedule("0 0 13 * *")

    fires = schedule.fire_times(utc_ms("2026-04-01T00:00Z"), 2)

    assert fires == [utc_ms("2026-04-13T00:00Z"), utc_ms("2026-05-13T00:00Z")]


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("61 * * * *", "minute 61"),
        ("0 0 * *", "4 fields"),
        ("0 0 * * * * *", "7 fields"),
        ("@reboot", "unsupported alias"),
        ("0 0 30 2 *", "never fires"),
        ("not a cron expression at", "garbage"),
        ("0 0 * * MOO", "unknown day name"),
    ],
)
def test_invalid_expression_raises_invalid_cron_naming_it(expression: str, why: str) -> None:
    with pytest.raises(InvalidCron) as caught:
        parse_cron(expression)

    assert repr(expression) in str(caught.value), why
    assert caught.value.field == "cron_expression"


def test_expression_that_never_fires_says_so() -> None:
    with pytest.raises(InvalidCron, match="never fires"):
        CronSchedule("0 0 31 4 *")  # April has 30 days


@pytest.mark.parametrize("expression", ["", "   ", "\t\n"])
def test_empty_expression_raises_invalid_cron(expression: str) -> None:
    with pytest.raises(InvalidCron, match="empty"):
        parse_cron(expression)


def test_unknown_cron_dialect_raises_invalid_cron_naming_it() -> None:
    with pytest.raises(InvalidCron, match="'quartz'") as caught:
        CronSchedule("0 0 * * *", dialect="quartz")

    assert caught.value.field == "cron_dialect"


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "/etc/localtime", "America/New_York "])
def test_unknown_timezone_raises_unknown_timezone_naming_it(name: str) -> None:
    with pytest.raises(UnknownTimezone) as caught:
        CronSchedule("0 0 * * *", name)

    assert repr(name) in str(caught.value)
    assert caught.value.field == "timezone"


def test_design_example_monthly_billing_fires_at_two_am_new_york_on_the_first() -> None:
    schedule = CronSchedule("0 2 1 * *", NY)

    next_ms = schedule.next_after(utc_ms("2026-09-16T12:00Z"))

    assert next_ms is not None
    assert next_ms == 1_790_834_400_000
    assert next_ms == int(datetime(2026, 10, 1, 2, 0, tzinfo=ZoneInfo(NY)).timestamp() * 1000)
    assert to_iso(next_ms) == "2026-10-01T06:00:00.000Z"


def test_to_iso_keeps_milliseconds() -> None:
    assert to_iso(1_790_834_400_123) == "2026-10-01T06:00:00.123Z"


def test_next_after_is_strictly_after_a_fire_time() -> None:
    schedule = CronSchedule("0 * * * *")

    assert schedule.next_after(utc_ms("2026-06-01T10:00Z")) == utc_ms("2026-06-01T11:00Z")
    assert schedule.next_after(utc_ms("2026-06-01T10:00Z") - 1) == utc_ms("2026-06-01T10:00Z")


def test_fire_times_previews_the_next_n_fires_in_order() -> None:
    schedule = CronSchedule("0 9 * * MON-FRI", LONDON)

    fires = schedule.fire_times(utc_ms("2026-06-05T12:00Z"), 5)  # a Friday afternoon

    assert fires == [
        utc_ms("2026-06-08T08:00Z"),  # 09:00 BST, Monday
        utc_ms("2026-06-09T08:00Z"),
        utc_ms("2026-06-10T08:00Z"),
        utc_ms("2026-06-11T08:00Z"),
        utc_ms("2026-06-12T08:00Z"),
    ]


# --------------------------------------------------------------------------------------------
# Property: next_after equals a brute-force oracle, near the 2026 DST transitions
# --------------------------------------------------------------------------------------------

ORACLE_ZONES = (
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",  # 30-minute DST
    "America/Sao_Paulo",  # no DST since 2019
    "Asia/Kolkata",  # +05:30, no DST
    "UTC",
    "Pacific/Chatham",  # +12:45 / +13:45, transitions at 02:45 local
    "Europe/Dublin",  # winter time is "negative DST" in tzdata
)


def _offset_s(tz: ZoneInfo, instant_s: int) -> int:
    offset = datetime.fromtimestamp(instant_s, tz).utcoffset()
    assert offset is not None
    return int(offset.total_seconds())


@functools.cache
def transitions_2026(tz_name: str) -> tuple[int, ...]:
    """The zone's 2026 offset changes (first instant of the new offset, epoch seconds), found by
    probing every hour and then every minute: independent of jobq's own transition search."""
    tz = ZoneInfo(tz_name)
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())
    found: list[int] = []
    previous = _offset_s(tz, start)
    for hour in range(1, 365 * 24 + 1):
        probe = start + hour * 3600
        offset = _offset_s(tz, probe)
        if offset != previous:
            found.append(next(m for m in range(probe - 3600, probe + 1, 60) if _offset_s(tz, m) != previous))
            previous = offset
    return tuple(found)


ALL_TRANSITIONS = tuple(sorted({t for name in ORACLE_ZONES for t in transitions_2026(name)}))


def test_oracle_transition_search_finds_the_known_2026_transitions() -> None:
    assert transitions_2026(NY) == (utc_ms("2026-03-08T07:00Z") // 1000, utc_ms("2026-11-01T06:00Z") // 1000)
    assert transitions_2026(LONDON) == (utc_ms("2026-03-29T01:00Z") // 1000, utc_ms("2026-10-25T01:00Z") // 1000)
    assert transitions_2026("Australia/Lord_Howe") == (
        utc_ms("2026-04-04T15:00Z") // 1000,  # 02:00 +11 -> 01:30 +10:30
        utc_ms("2026-10-03T15:30Z") // 1000,  # 02:00 +10:30 -> 02:30 +11
    )
    assert transitions_2026("Asia/Kolkata") == ()


@dataclass(frozen=True)
class Field:
    text: str
    values: frozenset[int]

    @property
    def restricted(self) -> bool:
        return not self.text.startswith("*")


@dataclass(frozen=True)
class Spec:
    """A cron expression together with the value sets its fields stand for."""

    second: Field | None
    minute: Field
    hour: Field
    dom: Field
    month: Field
    dow: Field

    def __repr__(self) -> str:
        return f"Spec({self.expression!r})"

    @property
    def expression(self) -> str:
        fields = [self.minute, self.hour, self.dom, self.month, self.dow]
        if self.second is not None:
            fields.insert(0, self.second)
        return " ".join(f.text for f in fields)

    @property
    def wildcard(self) -> bool:
        return not (self.minute.restricted and self.hour.restricted)

    def date_matches(self, day: date) -> bool:
        """crontab(5): when both day fields are restricted, either may match; else both must."""
        if day.month not in self.month.values:
            return False
        in_dom = day.day in self.dom.values
        in_dow = (day.weekday() + 1) % 7 in self.dow.values
        if self.dom.restricted and self.dow.restricted:
            return in_dom or in_dow
        return in_dom and in_dow

    def matches(self, wall: datetime) -> bool:
        if self.second is not None and wall.second not in self.second.values:
            return False
        if self.second is None and wall.second != 0:
            return False
        return wall.minute in self.minute.values and wall.hour in self.hour.values and self.date_matches(wall.date())


def oracle_next_after(
    spec: Spec, tz_name: str, after_ms: int, *, gap: DstGap, overlap: DstOverlap, window_s: int
) -> int | None:
    """Walk UTC instants u > after_ms one step (minute or second) at a time for `window_s`."""
    tz = ZoneInfo(tz_name)
    step_s = 1 if spec.second is not None else 60
    u = after_ms // 1000 // step_s * step_s + step_s
    end = after_ms // 1000 + window_s
    previous_offset = _offset_s(tz, u - step_s)
    while u <= end:
        local = datetime.fromtimestamp(u, tz)
        wall = local.replace(tzinfo=None)
        utcoffset = local.utcoffset()
        assert utcoffset is not None
        offset = int(utcoffset.total_seconds())
        if spec.matches(wall) and (local.fold == 0 or spec.wildcard or overlap is DstOverlap.TWICE):
            return u * 1000
        if offset > previous_offset and gap is DstGap.SHIFT and not spec.wildcard:
            # u is the first instant after a spring-forward gap: the gap's wall times never happened.
            skipped = wall - timedelta(seconds=offset - previous_offset)
            while skipped < wall:
                if spec.matches(skipped):
                    return u * 1000
                skipped += timedelta(seconds=step_s)
        previous_offset = offset
        u += step_s
    return None


FIELD_KINDS = ("star", "star_step", "number", "range", "range_step", "list")
TIME_KINDS = ("number", "number", "number", "list", "range", "range_step", "star", "star_step")
DAY_KINDS = ("star", "star", "star", "number", "range", "list", "star_step")


@st.composite
def cron_field(draw: st.DrawFn, lo: int, hi: int, favoured: list[int], kinds: tuple[str, ...] = FIELD_KINDS) -> Field:
    anywhere = st.integers(lo, hi)
    number = st.one_of(*[st.sampled_from(favoured)] * 3, anywhere) if favoured else anywhere
    kind = draw(st.sampled_from(kinds))
    if kind == "star":
        return Field("*", frozenset(range(lo, hi + 1)))
    if kind == "star_step":
        step = draw(st.integers(2, max(2, (hi - lo + 1) // 2)))
        return Field(f"*/{step}", frozenset(range(lo, hi + 1, step)))
    if kind == "number":
        value = draw(number)
        return Field(str(value), frozenset({value}))
    if kind in ("range", "range_step"):
        a = draw(number)
        b = draw(st.integers(a, hi))  # `a-a` included: crontab(5) reads it as {a}
        if kind == "range":
            return Field(f"{a}-{b}", frozenset(range(a, b + 1)))
        step = draw(st.integers(2, max(2, b - a)))
        return Field(f"{a}-{b}/{step}", frozenset(range(a, b + 1, step)))
    values = draw(st.lists(number, min_size=2, max_size=4, unique=True))
    return Field(",".join(map(str, values)), frozenset(values))


def _cron_dow(day: date) -> int:
    return (day.weekday() + 1) % 7


@st.composite
def cron_case(draw: st.DrawFn, *, seconds: bool) -> tuple[Spec, str, int]:
    """A zone, a start instant near one of its 2026 transitions, and an expression biased towards
    the wall times around that start (so that most cases fire within the oracle's window)."""
    tz_name = draw(st.sampled_from(ORACLE_ZONES))
    tz = ZoneInfo(tz_name)
    anchor = draw(st.sampled_from(transitions_2026(tz_name) or ALL_TRANSITIONS))
    if seconds:
        start_s = anchor + draw(st.integers(-5400, 600))
    else:
        near, far = st.integers(-2 * 3600, 5400), st.integers(-2 * 86_400, 4 * 3600)
        start_s = anchor + draw(st.one_of(near, near, far))
    start_ms = start_s * 1000 + draw(st.sampled_from([0, 0, 1, 999]) | st.integers(0, 59_999))
    # Every wall hour from an hour before the transition to an hour after, the gap's included.
    first_wall = datetime.fromtimestamp(anchor - 3600, tz).replace(tzinfo=None, minute=0)
    last_wall = datetime.fromtimestamp(anchor + 3600, tz).replace(tzinfo=None)
    hours = sorted(
        {(first_wall + timedelta(hours=n)).hour for n in range(int((last_wall - first_wall) / timedelta(hours=1)) + 1)}
    )
    days = sorted({datetime.fromtimestamp(start_s + d * 86_400, tz).date() for d in range(4)})
    second = draw(cron_field(0, 59, [0, 30, 59])) if seconds else None
    minute = draw(cron_field(0, 59, [0, 15, 30, 45, 59], TIME_KINDS))
    hour = draw(cron_field(0, 23, hours, TIME_KINDS))
    dom = draw(cron_field(1, 31, [d.day for d in days if d.day <= 28] or [1], DAY_KINDS))
    month = draw(cron_field(1, 12, [d.month for d in days], ("star", "star", "star", "number", "list")))
    dow = draw(cron_field(0, 6, [_cron_dow(d) for d in days], DAY_KINDS))
    return Spec(second, minute, hour, dom, month, dow), tz_name, start_ms


POLICIES = [(gap, overlap) for gap in DstGap for overlap in DstOverlap]


def _never_fires(spec: Spec) -> bool:
    """No date in a full leap cycle matches (times of day always have a match)."""
    first = date(2026, 1, 1)
    return not any(spec.date_matches(first + timedelta(days=n)) for n in range(4 * 366))


def check_against_oracle(
    spec: Spec, tz_name: str, start_ms: int, *, gap: DstGap, overlap: DstOverlap, window_s: int
) -> None:
    try:
        schedule = CronSchedule(spec.expression, tz_name, dst_gap=gap, dst_overlap=overlap)
    except InvalidCron:
        assert _never_fires(spec), f"{spec.expression!r} was refused but fires"
        return
    assert schedule.expr.wildcard == spec.wildcard
    actual = schedule.next_after(start_ms)
    expected = oracle_next_after(spec, tz_name, start_ms, gap=gap, overlap=overlap, window_s=window_s)
    context = f"{spec.expression!r} in {tz_name} after {to_iso(start_ms)} ({gap}, {overlap})"
    if expected is None:
        assert actual is None or actual > start_ms + window_s * 1000, f"{context}: fired at {to_iso(actual)}"
        return
    assert actual is not None, f"{context}: expected {to_iso(expected)}, got None"
    assert to_iso(actual) == to_iso(expected), context
    wall = datetime.fromtimestamp(expected / 1000, ZoneInfo(tz_name)).replace(tzinfo=None)
    if spec.matches(wall):  # the oracle's reading of the fields agrees with what jobq hands croniter
        day_or = spec.dom.restricted and spec.dow.restricted
        explicit = schedule.expr.croniter_expression
        assert croniter.match(explicit, wall, day_or=day_or, second_at_beginning=spec.second is not None)


@pytest.mark.parametrize(("gap", "overlap"), POLICIES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cron_case(seconds=False))
def test_next_after_matches_brute_force_oracle_for_five_field_expressions(
    case: tuple[Spec, str, int], gap: DstGap, overlap: DstOverlap
) -> None:
    spec, tz_name, start_ms = case
    check_against_oracle(spec, tz_name, start_ms, gap=gap, overlap=overlap, window_s=3 * 86_400)


@pytest.mark.parametrize(("gap", "overlap"), POLICIES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cron_case(seconds=True))
def test_next_after_matches_brute_force_oracle_for_six_field_expressions(
    case: tuple[Spec, str, int], gap: DstGap, overlap: DstOverlap
) -> None:
    spec, tz_name, start_ms = case
    check_against_oracle(spec, tz_name, start_ms, gap=gap, overlap=overlap, window_s=2 * 3600)


def test_day_fields_starting_with_star_are_unrestricted_as_in_crontab() -> None:
    """crontab(5): a day field is restricted only when it does not start with `*`, so
    `*/2` in day-of-month with a weekday means "odd days that are Mondays", not "either"."""
    schedule = CronSchedule("0 0 */2 * MON")

    fires = schedule.fire_times(utc_ms("2026-04-01T00:00Z"), 3)

    assert fires == [utc_ms("2026-04-13T00:00Z"), utc_ms("2026-04-27T00:00Z"), utc_ms("2026-05-11T00:00Z")]


# --------------------------------------------------------------------------------------------
# Misfire planning
# --------------------------------------------------------------------------------------------

NOW = utc_ms("2026-06-01T10:30Z")


def cron_job(
    cron: str = "0 * * * *",
    *,
    next_fire: str | int,
    policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE_NOW,
    catchup_window_s: int = 86_400,
) -> Job:
    return Job(
        job_id="job_hourly",
        name="reports.hourly",
        target=TaskTarget(task="reports.hourly"),
        schedule=Schedule(type=ScheduleType.CRON, cron=cron, timezone="UTC"),
        misfire_policy=policy,
        catchup_window_s=catchup_window_s,
        next_fire_ms=next_fire if isinstance(next_fire, int) else utc_ms(next_fire),
        created_ms=utc_ms("2026-01-01T00:00Z"),
        updated_ms=utc_ms("2026-01-01T00:00Z"),
    )


def hours(*texts: str) -> list[int]:
    return [utc_ms(f"2026-06-01T{text}Z") for text in texts]


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_on_time_job_plans_its_fires_up_to_now_plus_horizon(policy: MisfirePolicy) -> None:
    job = cron_job(next_fire="2026-06-01T11:00Z", policy=policy)

    plan = plan_fires(job, NOW, 2 * HOUR_MS)

    assert plan.fires == hours("11:00", "12:00")
    assert plan.missed == 0
    assert plan.next_fire_ms == utc_ms("2026-06-01T13:00Z")
    assert plan.collapsed_into is None


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_fire_late_by_less_than_the_threshold_is_not_a_misfire(policy: MisfirePolicy) -> None:
    job = cron_job(next_fire="2026-06-01T10:30Z", cron="*/30 * * * *", policy=policy)

    plan = plan_fires(job, NOW + 59_000, 0)

    assert plan.fires == hours("10:30")
    assert plan.missed == 0


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_fire_late_by_more_than_the_threshold_is_a_misfire(policy: MisfirePolicy) -> None:
    job = cron_job(next_fire="2026-06-01T10:30Z", cron="*/30 * * * *", policy=policy)

    plan = plan_fires(job, NOW + 61_000, 0)

    # skip drops it (counted here); fire_once_now and fire_all give it a late run (the scanner counts it).
    assert (plan.fires, plan.missed) == (([], 1) if policy is MisfirePolicy.SKIP else (hours("10:30"), 0))
    assert plan.next_fire_ms == utc_ms("2026-06-01T11:00Z")


def test_fire_once_now_collapses_the_misses_into_one_run_and_counts_the_misfire() -> None:
    job = cron_job(next_fire="2026-06-01T06:00Z", policy=MisfirePolicy.FIRE_ONCE_NOW)

    plan = plan_fires(job, NOW, HOUR_MS)

    assert plan.collapsed_into == utc_ms("2026-06-01T10:00Z"), "the newest missed fire stands for the misses"
    assert plan.fires == [plan.collapsed_into, utc_ms("2026-06-01T11:00Z")]
    assert plan.missed == 4, "the four fires it stands for; the scanner counts its own late run"
    assert plan.next_fire_ms == utc_ms("2026-06-01T12:00Z")


def test_skip_drops_the_misses_and_resumes_at_the_next_fire() -> None:
    job = cron_job(next_fire="2026-06-01T06:00Z", policy=MisfirePolicy.SKIP)

    plan = plan_fires(job, NOW, HOUR_MS)

    assert plan.fires == hours("11:00")
    assert plan.missed == 5
    assert plan.collapsed_into is None
    assert plan.next_fire_ms == utc_ms("2026-06-01T12:00Z")


def test_fire_all_keeps_every_miss_inside_the_catch_up_window() -> None:
    job = cron_job(next_fire="2026-06-01T06:00Z", policy=MisfirePolicy.FIRE_ALL)

    plan = plan_fires(job, NOW, HOUR_MS)

    assert plan.fires == hours("06:00", "07:00", "08:00", "09:00", "10:00", "11:00")
    assert plan.missed == 0, "every miss gets a run: the scanner counts each when it runs it late"
    assert plan.next_fire_ms == utc_ms("2026-06-01T12:00Z")


def test_fire_all_caps_a_pass_at_the_limit_and_resumes_where_it_stopped() -> None:
    job = cron_job(next_fire="2026-06-01T06:00Z", policy=MisfirePolicy.FIRE_ALL)
    planned: list[int] = []
    passes = 0

    while passes < 10:
        plan = plan_fires(job, NOW, HOUR_MS, limit=2)
        passes += 1
        assert len(plan.fires) <= 2
        planned.extend(plan.fires)
        if plan.next_fire_ms == job.next_fire_ms or plan.next_fire_ms is None or plan.next_fire_ms > NOW + HOUR_MS:
            break
        job = job.model_copy(update={"next_fire_ms": plan.next_fire_ms})

    assert planned == hours("06:00", "07:00", "08:00", "09:00", "10:00", "11:00")
    assert passes == 3


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_misses_older_than_the_catch_up_window_are_dropped(policy: MisfirePolicy) -> None:
    job = cron_job(next_fire="2026-05-30T00:00Z", policy=policy, catchup_window_s=3 * 3600)
    window_start = NOW - 3 * HOUR_MS

    plan = plan_fires(job, NOW, 0)

    assert all(fire >= window_start for fire in plan.fires)
    assert plan.next_fire_ms == utc_ms("2026-06-01T11:00Z")
    expected = {
        MisfirePolicy.FIRE_ALL: hours("08:00", "09:00", "10:00"),
        MisfirePolicy.SKIP: [],
    }
    if policy is MisfirePolicy.FIRE_ONCE_NOW:
        assert plan.fires == hours("10:00")
    else:
        assert plan.fires == expected[policy]
    dropped = 24 + 24 + 8  # every hour of 05-30 and 05-31, and 06-01 before 08:00: older than the window
    assert (
        plan.missed
        == dropped + {MisfirePolicy.FIRE_ALL: 0, MisfirePolicy.SKIP: 3, MisfirePolicy.FIRE_ONCE_NOW: 2}[policy]
    )


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_misses_that_are_all_older_than_the_catch_up_window_produce_no_run(policy: MisfirePolicy) -> None:
    job = cron_job("0 3 * * *", next_fire="2026-05-30T03:00Z", policy=policy, catchup_window_s=3600)

    plan = plan_fires(job, NOW, HOUR_MS)

    assert plan.fires == []
    assert plan.missed >= 1
    assert plan.next_fire_ms == utc_ms("2026-06-02T03:00Z")


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_per_second_job_down_for_a_day_is_planned_without_walking_every_miss(
    policy: MisfirePolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    original = CronSchedule.next_after

    def counting(self: CronSchedule, after_ms: int) -> int | None:
        nonlocal calls
        calls += 1
        return original(self, after_ms)

    monkeypatch.setattr(CronSchedule, "next_after", counting)
    job = cron_job("* * * * * *", next_fire=NOW - DAY_MS, policy=policy)

    plan = plan_fires(job, NOW, 5_000, limit=50)

    assert calls <= 200
    assert 1 <= len(plan.fires) <= 50
    if policy is not MisfirePolicy.FIRE_ALL:  # fire_all keeps the misses: the scanner counts those
        assert plan.missed >= 86_300, "every missed fire counted, the long tail extrapolated exactly"
    assert all(fire >= NOW - DAY_MS for fire in plan.fires)


def test_plan_fires_counts_calls_through_the_class_method(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the counting test above: the patched method is the one plan_fires reaches."""
    calls = 0
    original = CronSchedule.next_after

    def counting(self: CronSchedule, after_ms: int) -> int | None:
        nonlocal calls
        calls += 1
        return original(self, after_ms)

    monkeypatch.setattr(CronSchedule, "next_after", counting)

    plan_fires(cron_job("* * * * * *", next_fire=NOW), NOW, 10_000)

    assert calls >= 10


# --------------------------------------------------------------------------------------------
# Jitter
# --------------------------------------------------------------------------------------------


@given(job_id=st.text(min_size=1, max_size=40), nominal_ms=st.integers(0, 2**45), jitter_s=st.integers(1, 3600))
def test_jitter_is_within_zero_and_jitter_seconds(job_id: str, nominal_ms: int, jitter_s: int) -> None:
    assert 0 <= jitter_ms(job_id, nominal_ms, jitter_s) <= jitter_s * 1000


@given(job_id=st.text(min_size=1, max_size=40), nominal_ms=st.integers(0, 2**45), jitter_s=st.integers(0, 3600))
def test_jitter_is_deterministic_for_the_same_job_and_fire(job_id: str, nominal_ms: int, jitter_s: int) -> None:
    assert jitter_ms(job_id, nominal_ms, jitter_s) == jitter_ms(job_id, nominal_ms, jitter_s)


@given(job_id=st.text(max_size=40), nominal_ms=st.integers(0, 2**45))
def test_jitter_is_zero_when_jitter_s_is_zero(job_id: str, nominal_ms: int) -> None:
    assert jitter_ms(job_id, nominal_ms, 0) == 0


def test_jitter_spreads_top_of_hour_fires_of_many_jobs() -> None:
    top_of_hour = utc_ms("2026-06-01T10:00Z")

    offsets = [jitter_ms(f"job_{n}", top_of_hour, 60) for n in range(200)]

    assert len(set(offsets)) > 150
    assert min(offsets) < 10_000
    assert max(offsets) > 50_000


def test_jitter_differs_between_fires_of_one_job() -> None:
    offsets = {jitter_ms("job_1", utc_ms("2026-06-01T10:00Z") + n * HOUR_MS, 300) for n in range(24)}

    assert len(offsets) > 20


def test_schedules_module_exposes_the_misfire_threshold_of_the_design() -> None:
    assert schedules.MISFIRE_THRESHOLD_MS == 60_000
