"""A newcomer's CLI trial (issue 11): verbs that are idempotent, read-only commands that create
nothing, listings newest first, one status, and dead letters that are easy to act on."""

from __future__ import annotations

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
