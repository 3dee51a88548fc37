"""`jobq result RUN_ID`: the value on stdout, and an exit code per way a run ends."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from harness import Harness

from jobq.cli.main import cli
from jobq.clock import SYSTEM_CLOCK, ManualClock
from jobq.models import RetryPolicy

Invoke = Callable[..., Result]


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    clock.set(SYSTEM_CLOCK.now_ms())  # the CLI reads the system clock: results must not look expired
    harness = Harness("sqlite", tmp_path, clock)
    yield harness
    harness.close()


@pytest.fixture
def run(tmp_path: Path) -> Invoke:
    runner = CliRunner()
    store = f"sqlite:///{tmp_path / 'jobq.db'}"

    def invoke(*args: str) -> Result:
        return runner.invoke(cli, list(args), env={"JOBQ_STORE": store}, catch_exceptions=False)

    return invoke


def _run_id(h: Harness, job_id: str) -> str:
    run_id = h.client.current_run_id(job_id)
    assert run_id is not None
    return run_id


def test_a_succeeded_run_prints_its_value_as_json_and_exits_0(h: Harness, run: Invoke) -> None:
    @h.app.task(name="t.totals")
    def totals() -> dict[str, object]:
        return {"total": 5, "items": ["a [b]"]}

    handle = totals.delay()
    h.cycle()
    result = run("result", _run_id(h, handle.job_id))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"total": 5, "items": ["a [b]"]}


def test_a_failed_run_prints_the_error_and_exits_1(h: Harness, run: Invoke) -> None:
    @h.app.task(name="t.bad", retry=RetryPolicy(max_retries=0))
    def bad() -> None:
        raise ValueError("no [such] invoice")

    handle = bad.delay()
    h.cycle()
    result = run("result", _run_id(h, handle.job_id))
    assert result.exit_code == 1
    assert "failed: ValueError: no [such] invoice" in result.stderr


def test_an_unfinished_run_exits_5_and_a_cancelled_one_3(h: Harness, run: Invoke) -> None:
    @h.app.task(name="t.later")
    def later() -> None: ...

    handle = later.delay()
    run_id = _run_id(h, handle.job_id)
    result = run("result", run_id, "--wait", "0.2")
    assert result.exit_code == 5 and "not finished" in result.stderr
    handle.cancel()
    assert run("result", run_id).exit_code == 3


def test_an_expired_result_exits_4(tmp_path: Path, clock: ManualClock, run: Invoke) -> None:
    clock.set(SYSTEM_CLOCK.now_ms() - 2 * 86_400_000)  # finished two days ago: past the default TTL
    h = Harness("sqlite", tmp_path, clock)
    try:

        @h.app.task(name="t.one")
        def one() -> int:
            return 1

        handle = one.delay()
        h.cycle()
        result = run("result", _run_id(h, handle.job_id))
        assert result.exit_code == 4 and "expired" in result.stderr
    finally:
        h.close()


def test_json_output_holds_the_run_and_its_result_state(h: Harness, run: Invoke) -> None:
    @h.app.task(name="t.one")
    def one() -> int:
        return 1

    handle = one.delay()
    h.cycle()
    body = json.loads(run("result", _run_id(h, handle.job_id), "--json").stdout)
    assert (body["result_state"], body["result"], body["state"]) == ("SUCCEEDED", 1, "SUCCEEDED")


def test_an_unknown_run_is_one_line_and_exit_2(h: Harness, run: Invoke) -> None:
    result = run("result", "nope:123")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: no run 'nope:123'"
