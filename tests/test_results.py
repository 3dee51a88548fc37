"""Task results: `handle.get()`, what it raises for every way a run ends, the size limit, the TTL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.daemons.worker.execution import RESULT_MAX_BYTES
from jobq.errors import (
    ResultExpired,
    ResultNotKept,
    ResultTimeout,
    TaskCancelled,
    TaskFailed,
)
from jobq.models import RetryPolicy, RunState
from jobq.results import ResultState, split_error

DAY_S = 86_400


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock)
    yield harness
    harness.close()


def test_get_returns_the_tasks_return_value(h: Harness) -> None:
    @h.app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    handle = add.delay(2, 3)
    h.cycle()
    assert handle.get(timeout=0) == 5


def test_get_waits_for_a_run_finished_by_a_worker_meanwhile(h: Harness) -> None:
    @h.app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    handle = add.delay(20, 22)
    worker = threading.Thread(target=h.cycle)
    timer = threading.Timer(0.2, worker.start)
    timer.start()
    try:
        assert handle.get(timeout=60) == 42
    finally:
        timer.join()
        worker.join()


def test_get_times_out_with_its_own_error_while_the_run_has_not_finished(h: Harness) -> None:
    @h.app.task(name="t.never")
    def never() -> None: ...

    handle = never.delay()
    with pytest.raises(ResultTimeout) as caught:
        handle.get(timeout=0.1)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.state == RunState.DISPATCHED.value


def test_get_reraises_the_final_error_with_its_type_and_message(h: Harness) -> None:
    @h.app.task(name="t.bad", retry=RetryPolicy(max_retries=1, initial_interval_sec=0))
    def bad() -> None:
        raise ValueError("no such invoice: 42")

    handle = bad.delay()
    h.cycle()
    with pytest.raises(ResultTimeout):
        handle.get(timeout=0)  # waiting to retry: not final yet
    h.cycle(1)
    with pytest.raises(TaskFailed) as caught:
        handle.get(timeout=0)
    assert (caught.value.error_type, caught.value.message) == ("ValueError", "no such invoice: 42")
    assert caught.value.dead_letter


def test_get_of_a_cancelled_job_raises_task_cancelled(h: Harness) -> None:
    @h.app.task(name="t.later")
    def later() -> None: ...

    handle = later.schedule(delay_s=3600)
    h.cycle()
    handle.cancel()
    with pytest.raises(TaskCancelled):
        handle.get(timeout=0)


def test_a_value_that_is_not_json_is_not_kept_and_get_says_why(h: Harness) -> None:
    @h.app.task(name="t.obj")
    def obj() -> object:
        return {1, 2}

    handle = obj.delay()
    h.cycle()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and run.state is RunState.SUCCEEDED  # the task's work is done: not run again
    with pytest.raises(ResultNotKept, match="not JSON"):
        handle.get(timeout=0)


def test_a_value_larger_than_the_limit_is_not_kept_and_get_says_its_size(h: Harness) -> None:
    @h.app.task(name="t.big")
    def big() -> str:
        return "x" * RESULT_MAX_BYTES

    handle = big.delay()
    h.cycle()
    with pytest.raises(ResultNotKept, match=f"too large \\({RESULT_MAX_BYTES + 2} bytes"):
        handle.get(timeout=0)


def test_a_string_with_nul_is_not_kept_rather_than_failing_the_write(h: Harness) -> None:
    @h.app.task(name="t.nul")
    def nul() -> str:
        return "a\x00b"

    handle = nul.delay()
    h.cycle()
    with pytest.raises(ResultNotKept, match="NUL"):
        handle.get(timeout=0)


def test_a_result_expires_after_the_ttl_and_the_reaper_clears_it(h: Harness) -> None:
    @h.app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    handle = add.delay(2, 3)
    h.cycle()
    run_id = h.client.current_run_id(handle.job_id)
    assert run_id is not None
    h.advance(DAY_S - 1)
    h.reaper.run_once(h.clock.now_ms())
    assert handle.get(timeout=0) == 5
    h.advance(1)
    with pytest.raises(ResultExpired):
        handle.get(timeout=0)  # expired by time, before any pass cleared it
    assert h.client.run(run_id).result == 5
    h.advance(60)
    assert h.reaper.run_once(h.clock.now_ms()) == 1
    assert h.client.run(run_id).result is None
    assert h.client.run_result(run_id).state is ResultState.EXPIRED


def test_the_result_ttl_is_a_setting(tmp_path: Path, clock: ManualClock) -> None:
    h = Harness("memory", tmp_path, clock, result_ttl_s=10)
    try:

        @h.app.task(name="t.one")
        def one() -> int:
            return 1

        handle = one.delay()
        h.cycle()
        h.advance(10)
        with pytest.raises(ResultExpired):
            handle.get(timeout=0)
    finally:
        h.close()


def test_an_error_text_splits_into_type_and_message_without_the_retry_verdict() -> None:
    assert split_error("KeyError: 'x' (attempt 3 of 3)") == ("KeyError", "'x'")
    assert split_error("LeaseExpired: w1 stopped heartbeating") == ("LeaseExpired", "w1 stopped heartbeating")
    assert split_error("handed on: no worker serves 't'") == ("Error", "handed on: no worker serves 't'")
