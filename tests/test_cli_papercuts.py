"""A newcomer's CLI trial (issue 11): verbs that are idempotent, read-only commands that create
nothing, listings newest first, one status, and dead letters that are easy to act on."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from harness import Harness
from services import require_postgres

from jobq.cli.main import cli
from jobq.clock import SYSTEM_CLOCK, ManualClock
from jobq.models import JobStatus

Run = Callable[..., Result]


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    clock.set(SYSTEM_CLOCK.now_ms())  # the CLI stamps jobs with the system clock
    harness = Harness("sqlite", tmp_path, clock)

    @harness.app.task(name="t.echo")
    def echo(text: str = "") -> str:
        return text

    harness.worker().start()
    yield harness
    harness.close()


@pytest.fixture
def run(h: Harness, tmp_path: Path) -> Run:
    store = f"sqlite:///{tmp_path / 'jobq.db'}"

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli, list(args), env={"JOBQ_STORE": store}, catch_exceptions=False)

    return invoke


def _schedule(run: Run, *args: str) -> str:
    result = run("schedule", "t.echo", *args)
    assert result.exit_code == 0, result.output
    return result.output.split()[1]


@pytest.mark.parametrize(
    ("verb", "first", "said"),
    [("pause", None, "already paused"), ("resume", None, "already active"), ("cancel", "cancel", "already cancelled")],
)
def test_asking_again_for_the_state_a_job_is_in_exits_0_and_says_it_already_was(
    run: Run, h: Harness, verb: str, first: str | None, said: str
) -> None:
    job_id = _schedule(run, "--cron", "0 2 * * *")
    if verb == "pause":
        assert run("pause", job_id).exit_code == 0
    if first is not None:
        assert run(first, job_id).exit_code == 0
    again = run(verb, job_id)
    assert again.exit_code == 0, again.output
    assert f"{job_id} was {said}" in again.output
    expected = {"pause": JobStatus.PAUSED, "resume": JobStatus.ACTIVE, "cancel": JobStatus.CANCELLED}[verb]
    assert h.client.job(job_id).status is expected


READ_ONLY = [
    ["list"],
    ["status", "job_1"],
    ["runs", "job_1"],
    ["history", "job_1"],
    ["dlq", "list"],
    ["dlq", "show", "job_1:1"],
    ["tasks"],
    ["tokens", "list"],
    ["status"],
    ["workers"],
    ["top"],
]


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_a_read_only_command_where_there_is_no_store_exits_2_and_creates_nothing(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args, env={"JOBQ_STORE": None})
    assert result.exit_code == 2, result.output
    expected = (
        f"error: no jobq store at sqlite:///{tmp_path.resolve() / 'jobq.db'} (start `jobq dev`, or run `jobq init`)"
    )
    assert result.output.strip() == expected
    assert list(tmp_path.iterdir()) == []


def test_read_only_commands_on_postgresql_create_no_schema_and_need_no_broker() -> None:
    import psycopg

    dsn = require_postgres()
    absent, made = (f"jobq_test_{uuid.uuid4().hex[:12]}" for _ in range(2))
    try:
        missing = CliRunner().invoke(cli, ["list", "--store", f"{dsn}?schema={absent}"])
        assert missing.exit_code == 2 and "no jobq store at" in missing.output, missing.output
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [absent]).fetchone() is None
        assert CliRunner().invoke(cli, ["init", "--store", f"{dsn}?schema={made}"]).exit_code == 0
        for args in (["list"], ["dlq", "list"], ["tasks"], ["status", "nope"]):
            shown = CliRunner().invoke(cli, [*args, "--store", f"{dsn}?schema={made}"], env={"JOBQ_BROKER": None})
            assert "--broker" not in shown.output, shown.output
            assert shown.exit_code == (2 if args[0] == "status" else 0), shown.output
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for schema in (absent, made):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _submit(h: Harness, task: str, name: str | None = None, **fields: object) -> str:
    spec = {"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": task}, "job_name": name, **fields}
    job_id = h.client.submit(spec).job.job_id
    h.advance(1)
    return job_id


def _listed_ids(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [m.group(0) for line in result.output.splitlines() if (m := re.search(r"job_[0-9a-z]{26}", line))]


def test_jobq_list_shows_the_newest_jobs_first_and_new_jobs_are_never_behind_a_cursor(run: Run, h: Harness) -> None:
    ids = [_submit(h, "t.echo", f"n{i}") for i in range(60)]
    assert _listed_ids(run("list", "--limit", "3")) == ids[::-1][:3]
    assert _listed_ids(run("list"))[0] == ids[-1] and len(_listed_ids(run("list"))) == 50


def test_jobq_list_filters_by_status_task_and_name(run: Run, h: Harness) -> None:
    @h.app.task(name="t.other")
    def other() -> None:
        return None

    echo = _submit(h, "t.echo", "report.daily")
    second = _submit(h, "t.other", "report.weekly")
    third = _submit(h, "t.other", "cleanup")
    h.client.pause(second)
    assert _listed_ids(run("list", "--task", "t.other")) == [third, second]
    assert _listed_ids(run("list", "--name", "report.")) == [second, echo]
    assert _listed_ids(run("list", "--status", "paused")) == [second]
    assert run("list", "--task", "t.none").output.strip() == "no jobs match"


def test_a_dead_lettered_one_off_is_listed_and_shown_as_failed(run: Run, h: Harness) -> None:
    @h.app.task(name="t.broken", retry=None)
    def broken() -> None:
        raise RuntimeError("it broke")

    ok = _submit(h, "t.echo")
    dead = _submit(h, "t.broken", retry_policy={"max_retries": 0})
    h.worker().start()
    h.cycle()
    assert h.client.job(dead).status is JobStatus.COMPLETED  # the record: nothing more will run
    table = {
        m.group(0): line for line in run("list").output.splitlines() if (m := re.search(r"job_[0-9a-z]{26}", line))
    }
    assert " FAILED " in table[dead] and " COMPLETED " in table[ok]
    assert _listed_ids(run("list", "--status", "failed")) == [dead]
    shown = "\n".join(line.strip() for line in run("status", dead).output.splitlines())
    assert [line.split()[1] for line in shown.splitlines() if line.split()[0] == "status"] == ["FAILED"]


def test_jobq_status_has_one_status_row_and_the_last_run_success_and_error(run: Run, h: Harness) -> None:
    calls = []

    @h.app.task(name="t.flaky")
    def flaky() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("second run fails")

    job = h.client.submit(
        {
            "schedule_type": "CRON",
            "cron_expression": "* * * * *",
            "overlap_policy": "BUFFER_ALL",
            "target": {"type": "TASK", "task": "t.flaky"},
        }
    ).job.job_id
    h.worker().start()
    for _ in range(2):
        h.cycle(61)
    out = "\n".join(line.strip() for line in run("status", job).output.splitlines())
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert [line for line in out.splitlines() if line.split()[:1] == ["status"]] == [rows["status"]]
    assert "job_status" not in rows
    assert rows["status"].split()[1] == "ACTIVE"
    last_error = next(line for line in out.splitlines() if line.startswith("last error"))
    last_success = next(line for line in out.splitlines() if line.startswith("last success"))
    last_run = next(line for line in out.splitlines() if line.startswith("last run"))
    assert "second run fails" in last_error
    assert job in last_success
    failing_run = last_error.split("(")[-1].rstrip(")")
    assert last_run.split()[2] == failing_run  # the newest run that ran (retrying), not a future one


def _dead(h: Harness, task: str, n: int = 1) -> list[str]:
    ids = [_submit(h, task, retry_policy={"max_retries": 1, "initial_interval_sec": 0}) for _ in range(n)]
    h.worker().start()
    for _ in range(3):
        h.cycle(1)
    return [h.client.get(j).current_run.run_id for j in ids]  # type: ignore[union-attr]


@pytest.fixture
def failing(h: Harness) -> Harness:
    @h.app.task(name="t.fails")
    def fails() -> None:
        raise RuntimeError("the upstream service answered 503 Service Unavailable " + "and more words " * 10)

    @h.app.task(name="t.also_fails")
    def also_fails() -> None:
        raise RuntimeError("no")

    return h


def test_dlq_list_shows_the_task_and_never_wraps_a_run_id_at_80_columns(
    run: Run, failing: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobq.cli import common

    [run_id] = _dead(failing, "t.fails")
    monkeypatch.setattr(common.console, "width", 80)
    out = run("dlq", "list").output
    assert any(run_id in line and " t.fails " in line for line in out.splitlines()), out
    assert "…" in out  # the long error is clipped
    for line in out.splitlines():
        assert "and mo" not in line.replace("and more", "")  # cut at a word, never inside one


def test_clip_cuts_at_a_word_boundary() -> None:
    from jobq.cli.common import clip

    assert clip("RuntimeError: the upstream service answered 503", 30) == "RuntimeError: the upstream…"
    assert clip("short\nerror", 30) == "short error"


def test_dlq_redrive_all_and_by_task(run: Run, failing: Harness) -> None:
    one, two = _dead(failing, "t.fails", 2)
    [other] = _dead(failing, "t.also_fails")
    assert run("dlq", "redrive").exit_code == 2
    by_task = run("dlq", "redrive", "--task", "t.fails")
    assert by_task.exit_code == 0, by_task.output
    assert {line.split()[1] for line in by_task.output.splitlines()} == {one, two}
    assert [r.run_id for r in failing.client.dead_letters().items] == [other]
    everything = run("dlq", "redrive", "--all")
    assert [line.split()[1] for line in everything.output.splitlines()] == [other]
    assert failing.client.dead_letters().items == []


def test_a_redrive_grants_a_fresh_attempt_budget_and_every_count_agrees(run: Run, failing: Harness) -> None:
    [run_id] = _dead(failing, "t.also_fails")
    dead = failing.client.run(run_id)
    assert (dead.attempt, dead.last_error) == (2, "RuntimeError: no (attempt 2 of 2)")
    redriven = run("dlq", "redrive", run_id)
    assert f"redriven {run_id} as attempt 3 (of up to 4)" in redriven.output
    for _ in range(3):
        failing.cycle(1)
    again = failing.client.run(run_id)
    assert (again.attempt, again.dead_letter, again.last_error) == (4, True, "RuntimeError: no (attempt 4 of 4)")


def test_history_records_each_outcome_under_the_attempt_and_fence_that_ran(failing: Harness) -> None:
    [run_id] = _dead(failing, "t.also_fails")
    events = [e for e in failing.client.history(failing.client.run(run_id).job_key) if e.run_id == run_id]
    started = {e.attempt: e.fence for e in events if e.kind == "STARTED"}
    outcomes = [(e.kind, e.attempt, e.fence) for e in events if e.kind != "STARTED"]
    assert outcomes == [("RETRYING", 1, started[1]), ("FAILED", 2, started[2])]


def test_restarting_the_quickstart_on_the_same_database_adds_no_duplicate_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))  # as `jobq dev -A` does
    from examples import quickstart
    from jobq.ports import JobQuery
    from jobq.settings import Settings
    from jobq.wiring import connect

    d = connect(Settings.load({"store": f"sqlite:///{tmp_path / 'jobq.db'}", "history_flush_s": 0}, env={}))
    try:
        quickstart.app.use(d)
        quickstart.seed(quickstart.app)
        first = sorted(j.job_id for j in quickstart.app.client.list(JobQuery(limit=100)).items)
        quickstart.seed(quickstart.app)  # `jobq dev` started again
        assert sorted(j.job_id for j in quickstart.app.client.list(JobQuery(limit=100)).items) == first
        assert len(first) == 5
    finally:
        d.close()


def test_an_at_in_the_past_within_the_catch_up_window_warns_that_it_fires_now(run: Run, h: Harness) -> None:
    from jobq.instants import to_iso

    past = to_iso(SYSTEM_CLOCK.now_ms() - 14 * 3_600_000)
    result = run("schedule", "t.echo", "--at", past)
    assert result.exit_code == 0, result.output
    assert "warning: --at is 14 h in the past (within the catch-up window): it fires now" in result.output
    future = run("schedule", "t.echo", "--at", to_iso(SYSTEM_CLOCK.now_ms() + 3_600_000))
    assert "warning" not in future.output
