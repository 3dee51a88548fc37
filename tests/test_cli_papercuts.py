"""A newcomer's CLI trial (issue 11): verbs that are idempotent, read-only commands that create
nothing, listings newest first, one status, and dead letters that are easy to act on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from harness import Harness

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
