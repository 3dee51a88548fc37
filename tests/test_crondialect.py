"""Specs for jobq's cron dialect: every row of the grammar, every refusal, `H`, and the DST table.

The tables are the contract of docs/scheduling.md: each expected fire time is written out by
hand (from the calendar and the zone's 2026 transitions), never taken from the code, so a
croniter upgrade that moves any fire time fails here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime

import pytest

from jobq.client import Client
from jobq.errors import InvalidCron
from jobq.models import DstGap, DstOverlap, Job, JobStatus, Schedule, ScheduleType, TaskTarget
from jobq.schedules import CronSchedule, parse_cron, to_iso
from jobq.settings import Settings
from jobq.wiring import connect


def utc_ms(text: str) -> int:
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None
    return int(moment.timestamp() * 1000)


def fires(expression: str, tz: str, after: str, n: int, **policy: object) -> list[str]:
    schedule = CronSchedule(expression, tz, **policy)  # type: ignore[arg-type]
    return [to_iso(ms)[:-5] + "Z" if ms % 1000 == 0 else to_iso(ms) for ms in schedule.fire_times(utc_ms(after), n)]


# --------------------------------------------------------------------------------------------
# The grammar, row by row (UTC; 2026-06-01 is a Monday)
# --------------------------------------------------------------------------------------------

JUNE = "2026-06-01T00:00Z"

GRAMMAR = [
    # (expression, canonical form, after, expected fires)
    ("*/20 * * * *", "*/20 * * * *", JUNE, ["2026-06-01T00:20:00Z", "2026-06-01T00:40:00Z", "2026-06-01T01:00:00Z"]),
    ("5 * * * *", "5 * * * *", JUNE, ["2026-06-01T00:05:00Z", "2026-06-01T01:05:00Z"]),
    (
        "10-12 * * * *",
        "10-12 * * * *",
        JUNE,
        ["2026-06-01T00:10:00Z", "2026-06-01T00:11:00Z", "2026-06-01T00:12:00Z", "2026-06-01T01:10:00Z"],
    ),
    (
        "10-30/10 * * * *",
        "10-30/10 * * * *",
        JUNE,
        ["2026-06-01T00:10:00Z", "2026-06-01T00:20:00Z", "2026-06-01T00:30:00Z", "2026-06-01T01:10:00Z"],
    ),
    ("0,30 9 * * *", "0,30 9 * * *", JUNE, ["2026-06-01T09:00:00Z", "2026-06-01T09:30:00Z", "2026-06-02T09:00:00Z"]),
    # a/n is a-<max>/n (as Quartz reads it), stored that way
    (
        "5/20 * * * *",
        "5-59/20 * * * *",
        JUNE,
        ["2026-06-01T00:05:00Z", "2026-06-01T00:25:00Z", "2026-06-01T00:45:00Z", "2026-06-01T01:05:00Z"],
    ),
    (
        "0 0 * JAN/5 *",
        "0 0 * JAN-DEC/5 *",
        JUNE,
        ["2026-06-02T00:00:00Z", "2026-06-03T00:00:00Z", "2026-06-04T00:00:00Z"],
    ),
    # a-a is {a}, as in crontab(5); croniter alone reads it as the whole field
    ("59-59 * * * *", "59 * * * *", JUNE, ["2026-06-01T00:59:00Z", "2026-06-01T01:59:00Z"]),
    ("0 3-3/2 * * *", "0 3 * * *", JUNE, ["2026-06-01T03:00:00Z", "2026-06-02T03:00:00Z"]),
    ("0 0 1 JAN-JAN *", "0 0 1 JAN *", JUNE, ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
    ("0 0 5-5 * *", "0 0 5 * *", JUNE, ["2026-06-05T00:00:00Z", "2026-07-05T00:00:00Z"]),
    ("0 12 * * SUN-SUN", "0 12 * * SUN", JUNE, ["2026-06-07T12:00:00Z", "2026-06-14T12:00:00Z"]),
    # names, upper-cased
    (
        "0 12 * * mon-wed",
        "0 12 * * MON-WED",
        JUNE,
        ["2026-06-01T12:00:00Z", "2026-06-02T12:00:00Z", "2026-06-03T12:00:00Z", "2026-06-08T12:00:00Z"],
    ),
    ("0 0 1 jul,DEC *", "0 0 1 JUL,DEC *", JUNE, ["2026-07-01T00:00:00Z", "2026-12-01T00:00:00Z"]),
    # day-of-week 7 is Sunday, as 0 is
    ("0 12 * * 7", "0 12 * * 7", JUNE, ["2026-06-07T12:00:00Z", "2026-06-14T12:00:00Z"]),
    (
        "0 12 * * 5-7",
        "0 12 * * 5-7",
        JUNE,
        ["2026-06-05T12:00:00Z", "2026-06-06T12:00:00Z", "2026-06-07T12:00:00Z", "2026-06-12T12:00:00Z"],
    ),
    # L: the month's last day
    ("0 0 L * *", "0 0 L * *", JUNE, ["2026-06-30T00:00:00Z", "2026-07-31T00:00:00Z", "2026-08-31T00:00:00Z"]),
    ("0 0 L 2 *", "0 0 L 2 *", JUNE, ["2027-02-28T00:00:00Z", "2028-02-29T00:00:00Z"]),
    (
        "0 0 1,15,L * *",
        "0 0 1,15,L * *",
        JUNE,
        ["2026-06-15T00:00:00Z", "2026-06-30T00:00:00Z", "2026-07-01T00:00:00Z"],
    ),
    # weekday#n and weekdayL: the n-th / last such weekday of the month
    ("0 9 * * MON#1", "0 9 * * MON#1", JUNE, ["2026-06-01T09:00:00Z", "2026-07-06T09:00:00Z", "2026-08-03T09:00:00Z"]),
    ("0 9 * * 5#3", "0 9 * * 5#3", JUNE, ["2026-06-19T09:00:00Z", "2026-07-17T09:00:00Z"]),
    ("0 9 * * FRIL", "0 9 * * FRIL", JUNE, ["2026-06-26T09:00:00Z", "2026-07-31T09:00:00Z", "2026-08-28T09:00:00Z"]),
    ("0 9 * * 5l", "0 9 * * 5L", JUNE, ["2026-06-26T09:00:00Z", "2026-07-31T09:00:00Z"]),
    (
        "0 9 * * MON#1,FRIL",
        "0 9 * * MON#1,FRIL",
        JUNE,
        ["2026-06-01T09:00:00Z", "2026-06-26T09:00:00Z", "2026-07-06T09:00:00Z", "2026-07-31T09:00:00Z"],
    ),
    # both day fields restricted: either matches (crontab(5)); one starting with '*': both must
    (
        "0 0 L * FRI",
        "0 0 L * FRI",
        JUNE,
        [
            "2026-06-05T00:00:00Z",
            "2026-06-12T00:00:00Z",
            "2026-06-19T00:00:00Z",
            "2026-06-26T00:00:00Z",
            "2026-06-30T00:00:00Z",
            "2026-07-03T00:00:00Z",
        ],
    ),
    ("0 0 13 * FRI", "0 0 13 * FRI", JUNE, ["2026-06-05T00:00:00Z", "2026-06-12T00:00:00Z", "2026-06-13T00:00:00Z"]),
    (
        "0 0 */2 * MON",
        "0 0 */2 * MON",
        JUNE,
        ["2026-06-15T00:00:00Z", "2026-06-29T00:00:00Z", "2026-07-13T00:00:00Z", "2026-07-27T00:00:00Z"],
    ),
    ("0 0 1-31 * MON", "0 0 1-31 * MON", JUNE, ["2026-06-02T00:00:00Z", "2026-06-03T00:00:00Z"]),
    # six fields: seconds first
    (
        "*/15 * * * * *",
        "*/15 * * * * *",
        JUNE,
        ["2026-06-01T00:00:15Z", "2026-06-01T00:00:30Z", "2026-06-01T00:00:45Z", "2026-06-01T00:01:00Z"],
    ),
    ("30 5 4 * * *", "30 5 4 * * *", JUNE, ["2026-06-01T04:05:30Z", "2026-06-02T04:05:30Z"]),
    # aliases
    ("@weekly", "0 0 * * 0", JUNE, ["2026-06-07T00:00:00Z", "2026-06-14T00:00:00Z"]),
    ("@HOURLY", "0 * * * *", JUNE, ["2026-06-01T01:00:00Z", "2026-06-01T02:00:00Z"]),
]


@pytest.mark.parametrize(("expression", "canonical", "after", "expected"), GRAMMAR, ids=[r[0] for r in GRAMMAR])
def test_each_grammar_row_is_stored_in_canonical_form_and_fires_as_documented(
    expression: str, canonical: str, after: str, expected: list[str]
) -> None:
    assert parse_cron(expression).expression == canonical
    assert fires(expression, "UTC", after, len(expected)) == expected


@pytest.mark.parametrize(("expression", "canonical", "after", "expected"), GRAMMAR, ids=[r[0] for r in GRAMMAR])
def test_the_canonical_form_reads_back_as_itself_and_fires_the_same(
    expression: str, canonical: str, after: str, expected: list[str]
) -> None:
    """Stored expressions are parsed again by every process: the canonical form must be a fixed point."""
    assert parse_cron(canonical).expression == canonical
    assert fires(canonical, "UTC", after, len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "hourly_fires"),
    [
        ("59-59 * * * *", 1),  # croniter alone: 60 an hour
        ("0-0 * * * *", 1),
        ("30-30/5 * * * *", 1),
        ("*/20 * * * *", 3),
        ("5-5,10-10 * * * *", 2),
    ],
)
def test_an_equal_bound_range_is_its_single_value_not_the_whole_field(expression: str, hourly_fires: int) -> None:
    schedule = CronSchedule(expression)
    start = utc_ms("2026-06-01T10:00Z") - 1

    in_one_hour = [ms for ms in schedule.fire_times(start, 100) if ms < start + 3_600_000]

    assert len(in_one_hour) == hourly_fires


def test_an_equal_bound_minute_range_counts_as_fixed_time_for_the_dst_rules() -> None:
    """`30-30 1 * * *` is a fixed-time job: it fires once on the New York fall-back day."""
    schedule = CronSchedule("30-30 1 * * *", "America/New_York")

    assert not schedule.expr.wildcard
    assert fires("30-30 1 * * *", "America/New_York", "2026-10-31T12:00Z", 2) == [
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    ]


# --------------------------------------------------------------------------------------------
# Refusals: jobq's words, naming the field
# --------------------------------------------------------------------------------------------

REFUSED = [
    ("61 * * * *", "minute field: 61 is out of range 0-59"),
    ("0 24 * * *", "hour field: 24 is out of range 0-23"),
    ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
    ("0 0 * 13 *", "month field: 13 is out of range 1-12"),
    ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7"),
    ("60 * * * * *", "second field: 60 is out of range 0-59"),
    ("*/61 * * * *", "minute field: step 61 is larger than the field (0-59, 60 values)"),
    ("0 */25 * * *", "hour field: step 25 is larger than the field (0-23, 24 values)"),
    ("0 0 * * */8", "day-of-week field: step 8 is larger than the field (0-6, 7 values)"),
    ("*/0 * * * *", "minute field: step 0 must be at least 1"),
    (
        "30-10 * * * *",
        "minute field: range 30-10 runs backwards (30 > 10); jobq does not wrap ranges around, write it as 30-59,0-10",
    ),
    (
        "0 0 * * FRI-MON",
        "day-of-week field: range FRI-MON runs backwards (5 > 1); jobq does not wrap ranges around, "
        "write it as FRI-SAT,SUN-MON",
    ),
    ("0 0 * NOV-FEB *", "month field: range NOV-FEB runs backwards"),
    ("R * * * *", "minute field: R (a random value) is refused"),
    ("R * * * * *", "second field: R (a random value) is refused"),
    ("0 0 ? * MON", "day-of-month field: ? is Quartz/EventBridge syntax"),
    ("0 0 * * ?", "day-of-week field: ? is Quartz/EventBridge syntax"),
    ("0 0 15W * *", "day-of-month field: W (nearest weekday) is not supported"),
    ("0 0 LW * *", "day-of-month field: W (nearest weekday) is not supported"),
    ("0 0 L-3 * *", "day-of-month field: L-3 is not supported; L alone is the month's last day"),
    ("0 0 * * L", "day-of-week field: L is not allowed here"),
    ("0 L * * *", "hour field: L is not allowed here"),
    ("0 0 * * MON#6", "day-of-week field: MON#6: the number after # is the week of the month, 1-5"),
    ("0 0 1#2 * *", "day-of-month field: 1#2 is not allowed here"),
    ("0 0 1 * MON#1", "day-of-week field: MON#1 (a weekday of the month) cannot be combined with day-of-month 1"),
    ("0 0 * * MON,FRI#2", "day-of-week field: MON,FRI#2 mixes plain weekdays with #/L weekdays"),
    ("0 0 * * MOO", "day-of-week field: 'MOO' is not a number or a name (SUN-SAT)"),
    ("0 0 * * FRI#3/2", "day-of-week field: FRI#3 takes no step"),
    ("0 JAN * * *", "hour field: 'JAN' is not a number"),
    ("1,,2 * * * *", "minute field: empty list item"),
    ("-5 * * * *", "minute field: a range needs a number on both sides"),
    ("1-2-3 * * * *", "minute field: 1-2-3 is not a range"),
    ("H(5) * * * *", "minute field: H(5) is not a valid H"),
    ("H(30-10) * * * *", "minute field: H(30-10): the range of H runs backwards (30 > 10)"),
    ("H/61 * * * *", "minute field: step 61 is larger than the field"),
    ("0 0 * *", "4 fields; use 5"),
    ("0 0 * * * * *", "7 fields; use 5"),
    ("@reboot", "unknown alias '@reboot'"),
    ("0 0 30 2 *", "it never fires"),
    ("0 0 31 4,6 *", "it never fires"),
    ("0 0 * * 1\u00a0", "only ASCII"),
]


@pytest.mark.parametrize(("expression", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_expression_raises_invalid_cron_in_jobqs_words_naming_the_field(
    expression: str, message: str
) -> None:
    with pytest.raises(InvalidCron) as caught:
        parse_cron(expression)

    assert message in str(caught.value)
    assert repr(expression) in str(caught.value)
    assert caught.value.field == "cron_expression"
    assert "croniter" not in str(caught.value).lower()


def test_the_random_r_is_refused_even_where_croniter_accepts_it() -> None:
    """croniter draws R once per iterator: two beats would disagree on the fire time."""
    for expression in ("R * * * *", "0 R * * *", "R(0-29) * * * *", "R/15 * * * *"):
        with pytest.raises(InvalidCron, match="R \\(a random value\\) is refused"):
            CronSchedule(expression)


# --------------------------------------------------------------------------------------------
# H: a value picked from the job id, the same in every process
# --------------------------------------------------------------------------------------------


def independent_h(job_id: str, field: str, index: int, modulus: int) -> int:
    """The documented algorithm, written again: blake2b-64 of job id, field and position."""
    key = f"{job_id}\x00{field}\x00{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, person=b"jobq-cron-H").digest(), "big") % modulus


def test_h_is_resolved_by_the_documented_hash_of_the_job_id() -> None:
    job_id = "nightly-report"
    minute, hour = independent_h(job_id, "minute", 0, 60), independent_h(job_id, "hour", 0, 24)

    assert parse_cron("H H * * *", job_id=job_id).expression == f"{minute} {hour} * * *"


@pytest.mark.parametrize(
    ("job_id", "expression", "resolved"),
    [  # pinned: changing the hash would move every job's H the next time it is submitted
        ("nightly-report", "H H * * *", "54 2 * * *"),
        ("nightly", "H H * * *", "28 7 * * *"),
        ("job_a", "H/15 * * * *", "3-59/15 * * * *"),
        ("job_a", "H(0-29)/10 H(9-17) * * H(MON-FRI)", "3-29/10 15 * * 2"),
        ("job_b", "0 0 H * *", "0 0 4 * *"),
    ],
)
def test_h_resolves_to_the_same_values_in_every_version(job_id: str, expression: str, resolved: str) -> None:
    assert parse_cron(expression, job_id=job_id).expression == resolved


def test_h_resolves_the_same_in_another_process_with_another_hash_seed() -> None:
    ids = [f"job_{n}" for n in range(20)]
    here = [parse_cron("H H * * H", job_id=i).expression for i in ids]
    code = (
        "import json, sys; from jobq.crondialect import parse_cron; "
        "print(json.dumps([parse_cron('H H * * H', job_id=i).expression for i in json.loads(sys.argv[1])]))"
    )

    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(ids)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(out.stdout) == here


def test_thousands_of_h_jobs_spread_over_the_hour() -> None:
    minutes = Counter(int(parse_cron("H * * * *", job_id=f"job_{n:05d}").expression.split()[0]) for n in range(6000))

    assert set(minutes) == set(range(60))  # every minute is used
    assert max(minutes.values()) < 2 * 6000 / 60  # no minute gets twice its share
    assert minutes[0] < 2 * 6000 / 60  # in particular not :00, where plain `0 * * * *` would put them all


def test_h_with_a_range_stays_in_it_and_h_with_a_step_keeps_the_step() -> None:
    for n in range(300):
        job_id = f"job_{n}"
        minute, hour, dom, _, dow = parse_cron("H(10-19) H(9-17) H * H(MON-FRI)", job_id=job_id).expression.split()
        assert 10 <= int(minute) <= 19 and 9 <= int(hour) <= 17
        assert 1 <= int(dom) <= 28  # a day every month has
        assert 1 <= int(dow) <= 5
        stepped = parse_cron("H/20 * * * *", job_id=job_id)
        start, rest = stepped.expression.split()[0].split("-")
        assert 0 <= int(start) < 20 and rest == "59/20"


def test_h_is_stable_per_job_and_differs_between_jobs() -> None:
    first = parse_cron("H H * * *", job_id="job_a").expression
    assert parse_cron("H H * * *", job_id="job_a").expression == first
    assert len({parse_cron("H H * * *", job_id=f"job_{n}").expression for n in range(50)}) > 40


def test_h_without_a_job_id_is_refused_saying_why() -> None:
    with pytest.raises(InvalidCron, match="minute field: H picks its value from the job's id"):
        parse_cron("H * * * *")


def test_the_source_text_is_kept_next_to_the_resolved_expression() -> None:
    parsed = parse_cron("  H  H(2-4)  * *   *", job_id="job_a")

    assert parsed.source == "H H(2-4) * * *"
    assert "H" not in parsed.expression


# --------------------------------------------------------------------------------------------
# The DST table (docs/scheduling.md): several zones, half-hour and midnight transitions
# --------------------------------------------------------------------------------------------

SKIP, SHIFT = {"dst_gap": DstGap.SKIP}, {"dst_gap": DstGap.SHIFT}
ONCE, TWICE = {"dst_overlap": DstOverlap.ONCE}, {"dst_overlap": DstOverlap.TWICE}

DST = [
    # New York 2026-03-08: 02:00 EST -> 03:00 EDT (07:00Z)
    ("30 2 * * *", "America/New_York", "2026-03-07T12:00Z", SKIP, ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]),
    ("30 2 * * *", "America/New_York", "2026-03-07T12:00Z", SHIFT, ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    ("30 30 2 * * *", "America/New_York", "2026-03-07T12:00Z", SKIP, ["2026-03-09T06:30:30Z"]),
    (
        "0 * * * *",
        "America/New_York",
        "2026-03-08T05:30Z",
        SHIFT,
        ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"],
    ),
    # New York 2026-11-01: 02:00 EDT -> 01:00 EST (06:00Z)
    ("0 1 * * *", "America/New_York", "2026-10-31T12:00Z", ONCE, ["2026-11-01T05:00:00Z", "2026-11-02T06:00:00Z"]),
    (
        "0 1 * * *",
        "America/New_York",
        "2026-10-31T12:00Z",
        TWICE,
        ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-02T06:00:00Z"],
    ),
    (
        "*/30 1 * * *",
        "America/New_York",
        "2026-11-01T04:59Z",
        ONCE,
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:00:00Z",
        ],
    ),
    # London 2026-03-29: 01:00 GMT -> 02:00 BST (01:00Z)
    ("30 1 * * *", "Europe/London", "2026-03-28T12:00Z", SKIP, ["2026-03-30T00:30:00Z"]),
    ("30 1 * * *", "Europe/London", "2026-03-28T12:00Z", SHIFT, ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
    # Lord Howe 2026-10-04: 02:00 +10:30 -> 02:30 +11 (a 30-minute gap, 15:30Z)
    ("15 2 * * *", "Australia/Lord_Howe", "2026-10-02T12:00Z", SKIP, ["2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"]),
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T12:00Z",
        SHIFT,
        ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
    ),
    ("45 2 * * *", "Australia/Lord_Howe", "2026-10-02T12:00Z", SKIP, ["2026-10-02T16:15:00Z", "2026-10-03T15:45:00Z"]),
    # Lord Howe 2026-04-05: 02:00 +11 -> 01:30 +10:30 (01:30-02:00 repeats, 15:00Z)
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T12:00Z",
        ONCE,
        ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
    ),
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T12:00Z",
        TWICE,
        ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z", "2026-04-05T15:15:00Z"],
    ),
    (
        "15 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T12:00Z",
        TWICE,
        ["2026-04-03T14:15:00Z", "2026-04-04T14:15:00Z", "2026-04-05T14:45:00Z"],
    ),
    # Chatham 2026-09-27: 02:45 +12:45 -> 03:45 +13:45 (14:00Z)
    ("0 3 * * *", "Pacific/Chatham", "2026-09-25T00:00Z", SKIP, ["2026-09-25T14:15:00Z", "2026-09-27T13:15:00Z"]),
    (
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-09-25T00:00Z",
        SHIFT,
        ["2026-09-25T14:15:00Z", "2026-09-26T14:00:00Z", "2026-09-27T13:15:00Z"],
    ),
    # Santiago 2026-09-06: midnight does not exist, 00:00 -04 -> 01:00 -03 (04:00Z)
    ("0 0 * * *", "America/Santiago", "2026-09-04T12:00Z", SKIP, ["2026-09-05T04:00:00Z", "2026-09-07T03:00:00Z"]),
    (
        "0 0 * * *",
        "America/Santiago",
        "2026-09-04T12:00Z",
        SHIFT,
        ["2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"],
    ),
    ("0 0 6 9 *", "America/Santiago", "2026-09-01T00:00Z", SKIP, ["2027-09-06T03:00:00Z"]),
    # Santiago 2026-04-05: 00:00 -03 -> 23:00 -04 the day before (03:00Z): 23:00-24:00 on the 4th repeats
    (
        "30 23 * * *",
        "America/Santiago",
        "2026-04-03T12:00Z",
        ONCE,
        ["2026-04-04T02:30:00Z", "2026-04-05T02:30:00Z", "2026-04-06T03:30:00Z"],
    ),
    (
        "30 23 * * *",
        "America/Santiago",
        "2026-04-03T12:00Z",
        TWICE,
        ["2026-04-04T02:30:00Z", "2026-04-05T02:30:00Z", "2026-04-05T03:30:00Z", "2026-04-06T03:30:00Z"],
    ),
    (
        "0 0 * * *",
        "America/Santiago",
        "2026-04-03T12:00Z",
        ONCE,
        ["2026-04-04T03:00:00Z", "2026-04-05T04:00:00Z", "2026-04-06T04:00:00Z"],
    ),
    # Havana 2026-03-08: midnight does not exist, 00:00 -05 -> 01:00 -04 (05:00Z)
    ("0 0 * * *", "America/Havana", "2026-03-06T12:00Z", SKIP, ["2026-03-07T05:00:00Z", "2026-03-09T04:00:00Z"]),
    (
        "0 0 * * *",
        "America/Havana",
        "2026-03-06T12:00Z",
        SHIFT,
        ["2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"],
    ),
    # Havana 2026-11-01: 01:00 -04 -> 00:00 -05 (05:00Z): midnight happens twice
    (
        "0 0 * * *",
        "America/Havana",
        "2026-10-31T00:00Z",
        ONCE,
        ["2026-10-31T04:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"],
    ),
    (
        "0 0 * * *",
        "America/Havana",
        "2026-10-31T00:00Z",
        TWICE,
        ["2026-10-31T04:00:00Z", "2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-02T05:00:00Z"],
    ),
    (
        "*/30 0 1 11 *",
        "America/Havana",
        "2026-10-31T00:00Z",
        ONCE,
        [
            "2026-11-01T04:00:00Z",
            "2026-11-01T04:30:00Z",
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:30:00Z",
            "2027-11-01T04:00:00Z",
        ],
    ),
]


@pytest.mark.parametrize(
    ("expression", "tz", "after", "policy", "expected"),
    DST,
    ids=[f"{r[0]}|{r[1]}|{r[2][:10]}|{next(iter(r[3].values()))}" for r in DST],
)
def test_the_dst_table_fires_as_documented(
    expression: str, tz: str, after: str, policy: dict[str, object], expected: list[str]
) -> None:
    assert fires(expression, tz, after, len(expected), **policy) == expected


def test_a_job_stored_before_the_dialect_refused_its_syntax_can_still_be_shown_and_cancelled() -> None:
    d = connect(Settings.load({"store": "memory://", "history_flush_s": 0}, env={}))
    try:
        now = d.clock.now_ms()
        legacy = Job(
            job_id="legacy",
            name="t.legacy",
            target=TaskTarget(task="t.legacy"),
            schedule=Schedule(type=ScheduleType.CRON, cron="R * * * *"),  # accepted by croniter, refused now
            next_fire_ms=now + 60_000,
            created_ms=now,
            updated_ms=now,
        )
        d.store.create_job(legacy, [])
        client = Client(d)

        assert client.get("legacy").next_fire_times == ()
        client.cancel("legacy")
        assert client.get("legacy").job.status is JobStatus.CANCELLED
    finally:
        d.close()
