"""The `jobq` command: what people and scripts see, and bad input answered with exit code 2."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from factories import make_job
from harness import Harness

from jobq.cli.main import cli
from jobq.clock import SYSTEM_CLOCK, ManualClock
from jobq.models import RunState, Schedule, ScheduleType
from jobq.ports import JobQuery


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness("sqlite", tmp_path, clock)

    @harness.app.task(name="t.echo")
    def echo(text: str = "") -> str:
        return text

    @harness.app.task(name="t.broken")
    def broken() -> None:
        raise RuntimeError("nope")

    harness.worker().start()  # registers the task names, as a running worker would
    yield harness
    harness.close()


@pytest.fixture
def run(h: Harness, tmp_path: Path) -> Iterator[object]:
    runner = CliRunner()
    store = f"sqlite:///{tmp_path / 'jobq.db'}"

    def invoke(*args: str) -> Result:
        return runner.invoke(cli, list(args), env={"JOBQ_STORE": store}, catch_exceptions=False)

    yield invoke


def cycle(h: Harness) -> None:
    """Run the daemons at the real time: the CLI stamps jobs with the system clock."""
    h.clock.set(SYSTEM_CLOCK.now_ms())
    h.cycle()


def _jobs(h: Harness) -> list[str]:
    return [j.job_id for j in h.client.list(JobQuery()).items]


def test_schedule_prints_the_job_and_its_next_fires(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    result = run("schedule", "t.echo", "--cron", "0 2 1 * *", "--tz", "America/New_York", "--priority", "high")
    assert result.exit_code == 0, result.output
    assert "scheduled job_" in result.output
    assert result.output.count("next: ") == 5
    [job_id] = _jobs(h)
    job = h.client.job(job_id)
    assert (job.schedule.cron, job.schedule.timezone, job.priority.value) == ("0 2 1 * *", "America/New_York", "HIGH")


def test_schedule_json_is_the_job_resource(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    before = SYSTEM_CLOCK.now_ms()
    result = run("schedule", "t.echo", "--in", "1h30m", "--kwargs", '{"text": "hi"}', "--json")
    after = SYSTEM_CLOCK.now_ms()
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schedule_type"] == "ONE_OFF"
    assert doc["payload"] == {"args": [], "kwargs": {"text": "hi"}}
    assert before + 90 * 60_000 <= doc["next_run_time_epoch_ms"] <= after + 90 * 60_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["t.echo", "--cron", "61 * * * *"], "invalid cron expression '61 * * * *'"),
        (["t.echo", "--cron", "* * * *"], "has 4 fields"),
        (["t.echo", "--cron", "0 1 * * *", "--tz", "Mars/Olympus"], "unknown timezone 'Mars/Olympus'"),
        (["t.echo", "--at", "2020-01-01T00:00:00Z"], "beyond the catch-up window"),
        (["t.echo", "--at", "2026-03-08T02:30", "--tz", "America/New_York"], "does not exist in America/New_York"),
        (["t.echo", "--at", "tomorrow"], "neither epoch milliseconds nor ISO 8601"),
        (["t.echo", "--in", "soon"], "is not a duration"),
        (["t.echo", "--args", "[1,"], "--args is not valid JSON"),
        (["t.echo", "--kwargs", "[1]"], "--kwargs must be a JSON object"),
        (["t.echo", "--cron", "* * * * *", "--in", "5m"], "only one of"),
        (["t.echo", "--job-id", "has spaces"], "--job-id"),
    ],
)
def test_bad_input_is_one_clear_line_exit_code_2_and_writes_nothing(run, h: Harness, args, message) -> None:  # type: ignore[no-untyped-def]
    result = run("schedule", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert _jobs(h) == []


def test_an_oversized_payload_is_refused(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    result = run("schedule", "t.echo", "--kwargs", json.dumps({"text": "x" * 300_000}))
    assert result.exit_code == 2
    assert "the limit is 262144" in result.output
    assert _jobs(h) == []


def test_status_shows_the_run_lease_and_fence(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    job_id = json.loads(run("schedule", "t.echo", "--now", "--json").output)["job_id"]
    cycle(h)
    human = run("status", job_id)
    assert human.exit_code == 0
    assert "SUCCEEDED attempt 1 fence 1" in human.output
    doc = json.loads(run("status", job_id, "--json").output)
    assert (doc["status"], doc["fencing_token"], doc["current_attempt"]) == ("SUCCEEDED", 1, 1)
    assert doc["run_counts"] == {"SUCCEEDED": 1}


def test_status_shows_the_values_h_picked_and_the_expression_as_written(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    scheduled = run("schedule", "t.echo", "--cron", "H H * * *", "--job-id", "nightly-report")
    assert scheduled.exit_code == 0, scheduled.output
    assert scheduled.output.count("T02:54:00.000Z") == 5  # the five next fires, at the picked 02:54
    human = run("status", "nightly-report")
    assert "cron_expression" in human.output and "54 2 * * *" in human.output
    assert "cron_source" in human.output and "H H * * *" in human.output
    assert h.client.job("nightly-report").schedule.cron == "54 2 * * *"


def test_status_of_an_unknown_job_is_exit_code_2(run) -> None:  # type: ignore[no-untyped-def]
    result = run("status", "job_missing")
    assert result.exit_code == 2
    assert "no job 'job_missing'" in result.output


def test_list_filters_and_prints_json_for_scripts(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    run("schedule", "t.echo", "--now", "--name", "billing.run")
    run("schedule", "t.echo", "--cron", "@hourly", "--name", "mail.send", "--priority", "LOW")
    doc = json.loads(run("list", "--name-prefix", "billing.", "--json").output)
    assert [j["job_name"] for j in doc["jobs"]] == ["billing.run"]
    low = json.loads(run("list", "--priority", "low", "--json").output)
    assert [j["job_name"] for j in low["jobs"]] == ["mail.send"]
    assert "mail.send" in run("list").output


def test_pause_resume_cancel_and_trigger(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    job_id = json.loads(run("schedule", "t.echo", "--cron", "0 0 1 1 *", "--json").output)["job_id"]
    assert "job PAUSED" in run("pause", job_id).output
    assert "job ACTIVE" in run("resume", job_id).output
    triggered = run("trigger", job_id)
    assert triggered.exit_code == 0 and "as run" in triggered.output
    cycle(h)
    assert json.loads(run("runs", job_id, "--json").output)["runs"][0]["state"] == "SUCCEEDED"
    assert "job CANCELLED" in run("cancel", job_id).output
    again = run("pause", job_id)
    assert again.exit_code == 2 and "is CANCELLED" in again.output


def test_dead_letters_can_be_listed_shown_redriven_and_purged(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    job_id = json.loads(run("schedule", "t.broken", "--now", "--max-retries", "0", "--json").output)["job_id"]
    cycle(h)
    [dead] = json.loads(run("dlq", "list", "--json").output)["runs"]
    assert dead["job_id"] == job_id and "RuntimeError: nope" in dead["last_error"]
    shown = json.loads(run("dlq", "show", dead["run_id"], "--json").output)
    assert [e["event"] for e in shown["history"]] == ["STARTED", "FAILED"]
    redriven = run("dlq", "redrive", dead["run_id"])
    assert "as attempt 2" in redriven.output
    assert json.loads(run("dlq", "list", "--json").output)["runs"] == []
    cycle(h)
    assert "purged 1 run(s)" in run("dlq", "purge", "--all").output
    assert json.loads(run("dlq", "list", "--json").output)["runs"] == []
    assert h.client.get(job_id).current_run.state is RunState.FAILED  # type: ignore[union-attr]
    assert run("dlq", "purge").exit_code == 2


def test_history_lists_each_attempt(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    job_id = json.loads(run("schedule", "t.echo", "--now", "--json").output)["job_id"]
    cycle(h)
    events = json.loads(run("history", job_id, "--json").output)["events"]
    assert [e["event"] for e in events] == ["STARTED", "SUCCEEDED"]


def test_a_bad_setting_names_the_key_and_value(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["list"], env={"JOBQ_STORE": "mysql://x", "JOBQ_LEASE_S": "0"})
    assert result.exit_code == 2
    assert "lease_s" in result.output


def test_an_unsupported_store_url_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["list", "--store", "mysql://db/jobs"])
    assert result.exit_code == 2
    assert "unsupported store URL" in result.output


def test_an_unknown_queue_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["worker", "-Q", "critical,urgent", "--store", f"sqlite:///{tmp_path}/j.db"])
    assert result.exit_code == 2
    assert "unknown queue(s) urgent" in result.output


def test_text_with_brackets_prints_as_it_is(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    @h.app.task(name="t.brackets")
    def brackets() -> None:
        raise KeyError("[bold]not markup[/]")

    h.worker().start()
    job_id = json.loads(run("schedule", "t.brackets", "--now", "--max-retries", "0", "--json").output)["job_id"]
    cycle(h)
    shown = run("status", job_id)
    assert "[bold]not markup[/]" in shown.output


def test_a_paused_cron_job_shows_paused_with_no_next_run_time(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    run("schedule", "t.echo", "--cron", "* * * * * *", "--job-id", "every-second")  # runs exist within the horizon
    assert run("pause", "every-second").exit_code == 0
    human = run("status", "every-second")
    assert human.exit_code == 0, human.output
    assert "PAUSED" in human.output and "next_run_time" not in human.output
    doc = json.loads(run("status", "every-second", "--json").output)
    assert (doc["job_status"], doc["status"]) == ("PAUSED", "PAUSED")
    assert (doc["next_run_time_epoch_ms"], doc["next_run_time_iso"], doc["next_fire_times"]) == (None, None, [])


def test_status_and_list_render_a_stored_instant_past_year_9999(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    # A row written before instants were bounded at the edge (or by hand): it must still display.
    year_33658 = 10**15
    old = make_job("from-an-older-version", schedule=Schedule(type=ScheduleType.ONE_OFF, at_ms=year_33658))
    h.d.store.create_job(old.model_copy(update={"next_fire_ms": year_33658}), [])
    status = run("status", "from-an-older-version")
    assert status.exit_code == 0, status.output
    assert "+033658-09-27T01:46:40.000Z" in status.output
    listed = run("list")
    assert listed.exit_code == 0 and "+033658-09-27T01:46:40.000Z" in listed.output


def test_a_config_error_never_prints_the_url_password() -> None:
    result = CliRunner().invoke(cli, ["list", "--store", "mysql://jobq:hunter2@db.internal/jobs"])
    assert result.exit_code == 2
    assert "hunter2" not in result.output and "mysql://jobq:***@db.internal/jobs" in result.output


# -- tenants and records that do not decode -------------------------------------------------------


def test_job_commands_take_a_tenant_or_a_tenant_prefixed_id(run, h: Harness) -> None:  # type: ignore[no-untyped-def]
    for tenant in ("acme", "globex"):
        result = run("schedule", "t.echo", "--cron", "0 2 1 * *", "--job-id", "nightly", "--tenant", tenant)
        assert result.exit_code == 0, result.output
        assert f"scheduled {tenant}/nightly " in result.output
    assert "nightly" in run("status", "nightly", "--tenant", "acme").output
    assert json.loads(run("status", "acme/nightly", "--json").output)["tenant_id"] == "acme"
    assert run("cancel", "acme/nightly").exit_code == 0
    assert json.loads(run("status", "nightly", "--tenant", "acme", "--json").output)["job_status"] == "CANCELLED"
    assert json.loads(run("status", "globex/nightly", "--json").output)["job_status"] == "ACTIVE"
    listed = run("list", "--json").output
    assert sorted((j["tenant_id"], j["job_status"]) for j in json.loads(listed)["jobs"]) == [
        ("acme", "CANCELLED"),
        ("globex", "ACTIVE"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("status", "nightly"), "no job 'nightly'"),  # the tenant `default` has none
        (("status", "acme/nightly", "--tenant", "globex"), "names tenant 'acme', but --tenant is 'globex'"),
        (("status", "/nightly"), "is not a job id"),
    ],
)
def test_a_job_reference_that_names_no_job_is_exit_2(run, h: Harness, args: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    run("schedule", "t.echo", "--cron", "0 2 1 * *", "--job-id", "nightly", "--tenant", "acme")
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_list_status_and_cancel_work_on_a_job_whose_record_does_not_decode(  # type: ignore[no-untyped-def]
    run, h: Harness, tmp_path: Path
) -> None:
    assert run("schedule", "t.echo", "--cron", "*/2 * * * * *", "--job-id", "poison").exit_code == 0
    db = sqlite3.connect(tmp_path / "jobq.db")  # as an older version or a bug could have left it
    with db:
        db.execute("UPDATE jobq_jobs SET doc = json_set(doc, '$.retry.max_retries', -1) WHERE job_id = 'poison'")
    db.close()
    listed = run("list")
    assert listed.exit_code == 0, listed.output
    assert "poison" in listed.output and "corrupt: retry.max_retries" in listed.output
    status = run("status", "poison")
    assert status.exit_code == 0, status.output
    assert "corrupt" in status.output and "max_retries" in status.output
    cancelled = run("cancel", "poison")
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(run("status", "poison", "--json").output)["job_status"] == "CANCELLED"
    assert {r.state for r in h.client.runs("poison").items} == {RunState.CANCELLED}
