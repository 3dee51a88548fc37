"""Specs for the schedule preview: `jobq cron`, `jobq schedule --dry-run` and what they mark.

The fires of a preview are the ones beat will create; the marks say which a DST rule moved,
and which wall times a DST rule dropped, and why.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobq.cli.main import cli
from jobq.cronpreview import PreviewSpec, preview, preview_document
from jobq.errors import InvalidCron, ScheduleError
from jobq.models import DstGap, DstOverlap
from jobq.schedules import CronSchedule, to_iso

NY = "America/New_York"


def utc_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def summary(expression: str, tz: str, after: str, count: int, **policy: object) -> list[tuple[str, str, str | None]]:
    """(kind, utc, dst) of each event."""
    schedule = CronSchedule(expression, tz, **policy)  # type: ignore[arg-type]
    return [(e.kind, to_iso(e.at_ms), e.dst) for e in preview(schedule, utc_ms(after), count)]


def test_a_fixed_time_job_in_the_spring_forward_gap_is_shown_as_skipped_with_the_reason() -> None:
    schedule = CronSchedule("30 2 * * *", NY)

    events = preview(schedule, utc_ms("2026-03-07T00:00Z"), 3)

    assert [(e.kind, to_iso(e.at_ms), e.dst) for e in events] == [
        ("fire", "2026-03-07T07:30:00.000Z", None),
        ("skipped", "2026-03-08T07:00:00.000Z", "gap"),
        ("fire", "2026-03-09T06:30:00.000Z", None),
        ("fire", "2026-03-10T06:30:00.000Z", None),
    ]
    skipped = events[1].resource(schedule)
    assert skipped["wall_times"] == ["2026-03-08T02:30"]
    assert skipped["reason"] is not None
    assert "02:30 did not happen" in skipped["reason"]
    assert "clocks jumped forward from 02:00 to 03:00 on 2026-03-08" in skipped["reason"]
    assert "dst_gap=skip" in skipped["reason"]


def test_with_dst_gap_shift_the_moved_fire_is_marked_shifted_with_the_wall_time_it_stands_for() -> None:
    schedule = CronSchedule("30 2 * * *", NY, dst_gap=DstGap.SHIFT)

    events = preview(schedule, utc_ms("2026-03-07T12:00Z"), 2)

    assert [(e.kind, to_iso(e.at_ms), e.dst) for e in events] == [
        ("fire", "2026-03-08T07:00:00.000Z", "shifted"),
        ("fire", "2026-03-09T06:30:00.000Z", None),
    ]
    moved = events[0].resource(schedule)
    assert moved["local"] == "2026-03-08T03:00:00-04:00" and moved["zone"] == "EDT"
    assert moved["wall_times"] == ["2026-03-08T02:30"]
    assert "dst_gap=shift" in moved["reason"]


def test_a_fixed_time_job_on_the_fall_back_day_shows_its_second_occurrence_skipped() -> None:
    assert summary("0 1 * * *", NY, "2026-10-31T12:00Z", 2) == [
        ("fire", "2026-11-01T05:00:00.000Z", None),
        ("skipped", "2026-11-01T06:00:00.000Z", "repeat"),
        ("fire", "2026-11-02T06:00:00.000Z", None),
    ]


def test_with_dst_overlap_twice_the_second_occurrence_is_a_fire_marked_second_pass() -> None:
    schedule = CronSchedule("0 1 * * *", NY, dst_overlap=DstOverlap.TWICE)

    events = preview(schedule, utc_ms("2026-10-31T12:00Z"), 3)

    assert [(e.kind, to_iso(e.at_ms), e.dst) for e in events] == [
        ("fire", "2026-11-01T05:00:00.000Z", None),
        ("fire", "2026-11-01T06:00:00.000Z", "second_pass"),
        ("fire", "2026-11-02T06:00:00.000Z", None),
    ]
    reason = events[1].reason or ""
    assert "clocks went back from 02:00 to 01:00 on 2026-11-01" in reason and "dst_overlap=twice" in reason


def test_a_wildcard_job_shows_both_passes_of_the_repeated_hour_and_its_empty_gap() -> None:
    assert summary("*/30 * * * *", NY, "2026-11-01T05:45Z", 3) == [
        ("fire", "2026-11-01T06:00:00.000Z", "second_pass"),
        ("fire", "2026-11-01T06:30:00.000Z", "second_pass"),
        ("fire", "2026-11-01T07:00:00.000Z", None),
    ]
    assert summary("*/30 * * * *", NY, "2026-03-08T06:45Z", 2) == [
        ("skipped", "2026-03-08T07:00:00.000Z", "gap"),
        ("fire", "2026-03-08T07:00:00.000Z", None),
        ("fire", "2026-03-08T07:30:00.000Z", None),
    ]


@pytest.mark.parametrize(
    ("expression", "tz", "after", "expected"),
    [
        # Lord Howe's 30-minute gap: 02:00 -> 02:30 on 2026-10-04
        (
            "15 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T00:00Z",
            [("skipped", "2026-10-03T15:30:00.000Z", "gap"), ("fire", "2026-10-04T15:15:00.000Z", None)],
        ),
        # Santiago's midnight does not exist on 2026-09-06
        (
            "0 0 * * *",
            "America/Santiago",
            "2026-09-05T12:00Z",
            [("skipped", "2026-09-06T04:00:00.000Z", "gap"), ("fire", "2026-09-07T03:00:00.000Z", None)],
        ),
        # Havana's midnight happens twice on 2026-11-01
        (
            "0 0 * * *",
            "America/Havana",
            "2026-10-31T12:00Z",
            [
                ("fire", "2026-11-01T04:00:00.000Z", None),
                ("skipped", "2026-11-01T05:00:00.000Z", "repeat"),
                ("fire", "2026-11-02T05:00:00.000Z", None),
            ],
        ),
    ],
)
def test_half_hour_and_midnight_transitions_are_marked(
    expression: str, tz: str, after: str, expected: list[tuple[str, str, str | None]]
) -> None:
    assert summary(expression, tz, after, sum(kind == "fire" for kind, _, _ in expected)) == expected


def test_the_preview_fires_are_exactly_the_fires_beat_computes() -> None:
    for expression, tz in [("*/20 1-3 * * *", NY), ("15 2 * * *", "Australia/Lord_Howe"), ("0 0 * * *", "UTC")]:
        schedule = CronSchedule(expression, tz)
        after = utc_ms("2026-03-01T00:00Z")

        shown = [e.at_ms for e in preview(schedule, after, 200) if e.kind == "fire"]

        assert shown == schedule.fire_times(after, 200)


def test_a_per_second_job_counts_its_skipped_wall_times_without_listing_them_all() -> None:
    schedule = CronSchedule("* * * * * *", NY)

    events = preview(schedule, utc_ms("2026-03-08T06:59:59Z"), 2)

    gap = next(e.resource(schedule) for e in events if e.kind == "skipped")
    assert gap["wall_times"][0] == "2026-03-08T02:00:00" and len(gap["wall_times"]) == 5
    assert gap["wall_time_count"] == 1000  # counted up to 1,000 (the gap has 3,600)
    assert "at least 995 more" in gap["reason"]


def test_a_preview_stops_ten_years_after_its_start() -> None:
    schedule = CronSchedule("0 0 29 2 *")  # leap days only

    events = preview(schedule, utc_ms("2026-06-01T00:00Z"), 500)

    assert [to_iso(e.at_ms)[:10] for e in events] == ["2028-02-29", "2032-02-29", "2036-02-29"]


def test_the_preview_document_resolves_h_for_the_given_job_id() -> None:
    spec = PreviewSpec(cron_expression="H H * * *", job_id="nightly-report", after="2026-06-01T00:00:00Z", count=2)

    doc = preview_document(spec, 0)

    assert (doc["cron_source"], doc["cron_expression"]) == ("H H * * *", "54 2 * * *")
    assert [e["utc"] for e in doc["events"]] == ["2026-06-01T02:54:00.000Z", "2026-06-02T02:54:00.000Z"]


def test_the_preview_document_refuses_h_without_a_job_id_and_a_bad_after() -> None:
    with pytest.raises(InvalidCron, match="H picks its value from the job's id"):
        preview_document(PreviewSpec(cron_expression="H * * * *"), 0)
    with pytest.raises(ScheduleError, match="after 'soon' is neither") as caught:
        preview_document(PreviewSpec(cron_expression="0 * * * *", after="soon"), 0)
    assert caught.value.field == "after"
    with pytest.raises(ScheduleError, match="beyond the year 9000"):
        preview_document(PreviewSpec(cron_expression="0 * * * *", after="9500-01-01T00:00:00Z"), 0)
    with pytest.raises(ScheduleError, match="outside the instants jobq accepts") as caught:  # past 9999: the edge bound
        preview_document(PreviewSpec(cron_expression="0 * * * *", after=10**15), 0)
    assert caught.value.field == "after"


def test_a_naive_after_is_read_in_the_preview_timezone() -> None:
    doc = preview_document(PreviewSpec(cron_expression="0 3 * * *", timezone=NY, after="2026-06-01T02:00"), 0)

    assert doc["after"] == "2026-06-01T06:00:00.000Z"
    assert doc["events"][0]["local"] == "2026-06-01T03:00:00-04:00"


# --------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env or {}, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_jobq_cron_prints_the_next_fires_in_local_time_and_utc_marking_the_skipped_day() -> None:
    code, out, _ = invoke("cron", "0 2 * * *", "--tz", NY, "--next", "10", "--after", "2026-03-05T00:00Z")

    assert code == 0
    assert out.count("-05:00 EST") == 3 and out.count("-04:00 EDT") == 7  # ten fires
    assert "2026-03-05T07:00:00.000Z" in out and "2026-03-09T06:00:00.000Z" in out
    assert "2026-03-08 02:00 skipped" in out
    assert "did not happen (clocks jumped forward from 02:00 to 03:00 on 2026-03-08)" in out


def test_jobq_cron_json_is_the_api_document() -> None:
    code, out, _ = invoke(
        "cron", "30 2 * * *", "--tz", NY, "--next", "2", "--after", "2026-03-07T12:00Z", "--dst-gap", "shift", "--json"
    )

    assert code == 0
    doc = json.loads(out)
    expected = preview_document(
        PreviewSpec(
            cron_expression="30 2 * * *", timezone=NY, count=2, after="2026-03-07T12:00Z", dst_gap=DstGap.SHIFT
        ),
        0,
    )
    assert doc == expected
    assert [e["dst"] for e in doc["events"]] == ["shifted", None]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["59-60 * * * *"], "minute field: 60 is out of range 0-59"),
        (["R * * * *"], "R (a random value) is refused"),
        (["H * * * *"], "give the job id to preview it"),
        (["0 0 * * *", "--tz", "Mars/Olympus"], "unknown timezone 'Mars/Olympus'"),
        (["0 0 * * *", "--after", "tomorrow"], "after 'tomorrow' is neither"),
        (["0 0 * * *", "--next", "0"], "Invalid value for '--next'"),
    ],
)
def test_jobq_cron_refuses_bad_input_on_stderr_with_exit_code_2(args: list[str], message: str) -> None:
    code, out, err = invoke("cron", *args)

    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


def test_schedule_dry_run_prints_the_preview_and_stores_nothing(tmp_path: Path) -> None:
    store = tmp_path / "jobq.db"
    env = {"JOBQ_STORE": f"sqlite:///{store}"}

    code, out, _ = invoke(
        "schedule", "t.echo", "--cron", "H 2 * * *", "--tz", NY, "--job-id", "nightly", "--dry-run", env=env
    )

    assert code == 0, out
    assert out.startswith("dry run, nothing stored")
    assert "(written H 2 * * *)" in out
    assert not store.exists()  # not even created


def test_schedule_dry_run_json_shows_the_resolved_expression_and_fires(tmp_path: Path) -> None:
    env = {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}"}

    code, out, _ = invoke(
        "schedule",
        "t.echo",
        "--cron",
        "H H * * *",
        "--job-id",
        "nightly-report",
        "--dry-run",
        "--next",
        "3",
        "--json",
        env=env,
    )

    assert code == 0, out
    doc = json.loads(out)
    assert doc["dry_run"] is True
    assert (doc["job"]["cron_expression"], doc["job"]["cron_source"]) == ("54 2 * * *", "H H * * *")
    assert [e["kind"] for e in doc["preview"]["events"]] == ["fire"] * 3
    assert not (tmp_path / "jobq.db").exists()


def test_schedule_dry_run_with_h_needs_the_job_id(tmp_path: Path) -> None:
    env = {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}"}

    code, _, err = invoke("schedule", "t.echo", "--cron", "H * * * *", "--dry-run", env=env)

    assert code == 2
    assert "H picks its value from the job's id" in err


def test_schedule_dry_run_of_a_one_off_prints_its_fire_time(tmp_path: Path) -> None:
    env = {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}"}

    code, out, _ = invoke("schedule", "t.echo", "--at", "2030-01-01T09:00:00Z", "--dry-run", env=env)

    assert code == 0
    assert "fires at 2030-01-01T09:00:00.000Z" in out
    assert not (tmp_path / "jobq.db").exists()
