"""The contract every pool keeps (prefork, threads, gevent, asyncio, solo), over the embedded SQLite
deployment and over PostgreSQL + Redis.

The worker runs with `background=False` on a manual clock: the test steps the completer, the
lease monitor and the reaper, so heartbeats and time limits happen exactly when the clock says;
the pool itself runs for real (child processes, threads, a gevent hub, an event loop). A pool
that cannot do something the contract asks is listed in `UNSUPPORTED` with the reason and what
it does instead, which its own test checks.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import T0
from services import require_postgres, require_redis
from stacks import _redis_prefix_cleanup

from jobq.app import App, JobHandle, Task
from jobq.clock import ManualClock
from jobq.daemons.beat import Beat
from jobq.daemons.reaper import Reaper
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.metrics import METRICS, Gauge
from jobq.models import Run, RunState
from jobq.settings import Settings
from jobq.wiring import connect, init_store

from . import tasks

POOLS = ("prefork", "threads", "gevent", "asyncio", "solo")
BACKENDS = ("sqlite", "postgres-redis")
KILLABLE = frozenset({"prefork", "gevent", "asyncio"})  # the hard limit frees the slot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


class PoolHarness:
    """A deployment on a manual clock and one worker with the pool under test."""

    def __init__(self, pool: str, urls: dict[str, str], tmp_path: Path, **settings: Any) -> None:
        self.pool = pool
        self.tmp = tmp_path
        self.clock = ManualClock(T0)
        values = {**urls, "history_flush_s": 0, "shutdown_grace_s": 0.2, **settings}
        self.d = connect(Settings.load(values, env={}), self.clock)
        self.app = App(clock=self.clock)
        self.app.use(self.d)
        tasks.register(self.app, pool)
        self.beat = Beat(self.d)
        self.scanner = Scanner(self.d, scanner_id="scanner-test")
        self.reaper = Reaper(self.d)
        self.worker = Worker(self.d, self.app.registry, pool=pool, concurrency=1, background=False)
        self._consumers: list[threading.Thread] = []

    def delay(self, name: str, *args: Any) -> JobHandle:
        definition = self.app.registry.get(name)
        assert definition is not None
        return Task(self.app, definition).delay(*args)

    def path(self, name: str) -> str:
        return str(self.tmp / f"{name}-{uuid.uuid4().hex[:6]}")

    def dispatch(self) -> None:
        now = self.clock.now_ms()
        self.beat.run_once(now)
        while self.scanner.run_once(now) > 0:
            pass

    def take(self) -> None:
        """One consume pass on a thread of its own: the solo pool runs the task inside it."""
        consumer = threading.Thread(target=self.worker.run_once, args=(self.clock.now_ms(),), daemon=True)
        consumer.start()
        self._consumers.append(consumer)
        consumer.join(0.5)

    def settle(self, timeout_s: float = 20.0) -> None:
        """Write outcomes as they are decided until the worker holds nothing."""
        deadline = time.monotonic() + timeout_s
        while self.worker.state.busy() > 0:
            assert time.monotonic() < deadline, f"still held: {self.worker.state.snapshot()}"
            self.worker.complete_once(self.clock.now_ms())
            time.sleep(0.01)

    def run_job(self, handle: JobHandle) -> Run:
        self.dispatch()
        self.take()
        self.settle()
        return self.current(handle)

    def current(self, handle: JobHandle) -> Run:
        run = self.app.client.get(handle.job_id).current_run
        assert run is not None
        return run

    def monitor(self, advance_s: float) -> None:
        self.clock.advance(s=advance_s)
        self.worker.monitor_once(self.clock.now_ms())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.worker.shutdown()
        for consumer in self._consumers:
            consumer.join(2)
        self.d.close()


def wait_for(path: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def wait_until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


@contextlib.contextmanager
def backend_urls(backend: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    if backend == "sqlite":
        yield {"store": f"sqlite:///{tmp_path / 'jobq.db'}"}
        return
    pg = require_postgres()
    redis_url = require_redis()
    tag = f"p{uuid.uuid4().hex[:10]}"
    urls = {"store": f"{pg}?schema={tag}", "broker": f"{redis_url}?prefix={tag}"}
    init_store(Settings.load(urls, env={}))
    try:
        yield urls
    finally:
        import psycopg

        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE')
        _redis_prefix_cleanup(tag)()


# (pool, test) -> why the pool cannot keep that clause, and what it does instead.
UNSUPPORTED: dict[tuple[str, str], str] = {}


@pytest.fixture(params=POOLS)
def pool(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "gevent":
        pytest.importorskip("gevent", reason="the gevent pool needs jobq[gevent]")
    reason = UNSUPPORTED.get((name, request.node.originalname))
    if reason is not None:
        pytest.skip(reason)
    return name


@pytest.fixture(params=BACKENDS)
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    with backend_urls(request.param, tmp_path) as found:
        yield found


@pytest.fixture
def make(pool: str, urls: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., PoolHarness]]:
    made: list[PoolHarness] = []

    def factory(**settings: Any) -> PoolHarness:
        h = PoolHarness(pool, urls, tmp_path, **settings)
        made.append(h)
        return h

    yield factory
    for h in made:
        h.close()


def test_a_task_s_return_value_is_recorded_on_success(make: Callable[..., PoolHarness], pool: str) -> None:
    h = make()
    run = h.run_job(h.delay("c.add", 2, 3))
    assert run.state is RunState.SUCCEEDED
    assert run.result is not None and run.result["sum"] == 5
    if pool == "prefork":
        assert run.result["pid"] != os.getpid(), "prefork runs tasks in a child process"


def test_the_next_task_runs_on_the_slot_while_the_previous_outcome_is_still_being_written(
    make: Callable[..., PoolHarness],
) -> None:
    h = make()
    first, second = h.delay("c.add", 1, 2), h.delay("c.add", 3, 4)
    h.dispatch()
    h.take()
    assert h.worker.state.wait(lambda: h.worker.state.executing() == 0, 20)
    assert h.worker.state.busy() == 1, "the first outcome is not written yet: its attempt is held"
    h.take()  # the one slot is free again: the second task runs before the first outcome is durable
    assert h.worker.state.wait(lambda: h.worker.state.busy() == 2 and h.worker.state.executing() == 0, 20)
    assert h.current(first).state is RunState.RUNNING, "still leased to this worker until its write commits"
    h.settle()
    assert [h.current(x).state for x in (first, second)] == [RunState.SUCCEEDED] * 2


def test_a_retry_runs_the_task_again_and_the_second_attempt_succeeds(make: Callable[..., PoolHarness]) -> None:
    h = make()
    handle = h.delay("c.flaky", h.path("flaky"))
    first = h.run_job(handle)
    assert first.state is RunState.SCHEDULED and first.attempt == 2
    second = h.run_job(handle)
    assert second.state is RunState.SUCCEEDED and second.result == "second try"


def test_a_failing_task_is_dead_lettered(make: Callable[..., PoolHarness]) -> None:
    h = make()
    run = h.run_job(h.delay("c.fail"))
    assert run.state is RunState.FAILED and run.dead_letter
    assert run.last_error is not None and "no good" in run.last_error


def test_the_soft_limit_raises_inside_the_task_which_cleans_up(make: Callable[..., PoolHarness]) -> None:
    h = make(soft_time_limit_s=1.0, time_limit_s=30.0)
    started = h.path("soft")
    handle = h.delay("c.soft", started)
    h.dispatch()
    h.take()
    wait_for(started)
    h.monitor(1.5)  # past the soft limit, well before the hard one
    h.settle()
    run = h.current(handle)
    assert run.state is RunState.SUCCEEDED and run.result == "cleaned up"


def test_the_hard_limit_fails_the_attempt_with_task_timeout_and_fences_it(
    make: Callable[..., PoolHarness], pool: str
) -> None:
    h = make()
    started = h.path("forever")
    handle = h.delay("c.forever", started)
    h.dispatch()
    h.take()
    wait_for(started)
    h.monitor(tasks.HARD_LIMIT_S + 0.5)
    h.worker.complete_once(h.clock.now_ms())
    run = h.current(handle)
    assert run.state is RunState.SCHEDULED and run.attempt == 2, "the policy retries a timed-out attempt"
    assert run.last_error is not None and "TaskTimeout" in run.last_error
    if pool in KILLABLE:
        wait_until(lambda: h.worker.state.lost_slots() == 0)
        assert slots_gauge("lost") == 0
        # The slot came back: the next task runs on it (concurrency is 1).
        assert h.run_job(h.delay("c.add", 1, 1)).state is RunState.SUCCEEDED
    else:
        assert h.worker.state.lost_slots() == 1, "a thread cannot be killed: its slot is lost"
        assert slots_gauge("lost") == 1 and slots_gauge("free") == 0
        assert not h.worker.healthy(), "every slot lost turns the worker unhealthy"


def test_heartbeats_renew_the_lease_during_a_long_task(make: Callable[..., PoolHarness]) -> None:
    h = make(lease_s=30, heartbeat_s=10)
    started, release = h.path("long"), h.path("release")
    handle = h.delay("c.hold", started, release)
    h.dispatch()
    h.take()
    wait_for(started)
    for _ in range(4):  # 100 s: three leases' worth, renewed every 25 s
        h.monitor(25)
        assert h.reaper.run_once(h.clock.now_ms()) == 0
    touch_file(release)
    h.settle()
    run = h.current(handle)
    assert run.state is RunState.SUCCEEDED and run.attempt == 1 and run.result == "released"


def test_a_task_sees_its_lease_lost_when_its_job_is_cancelled(make: Callable[..., PoolHarness]) -> None:
    h = make(lease_s=30, heartbeat_s=10)
    started, release = h.path("held"), h.path("never")
    handle = h.delay("c.hold", started, release)
    h.dispatch()
    h.take()
    wait_for(started)
    h.app.client.cancel(handle.job_id)
    h.monitor(11)  # the next heartbeat is refused: the task is told
    wait_for(started + ".lost")
    assert Path(started + ".lost").read_text() == "cancelled"
    h.settle()
    assert h.current(handle).state is RunState.CANCELLED


def test_shutdown_hands_a_running_task_back_without_using_an_attempt(make: Callable[..., PoolHarness]) -> None:
    h = make(shutdown_grace_s=0.2)
    started, release = h.path("running"), h.path("never")
    handle = h.delay("c.hold", started, release)
    h.dispatch()
    h.take()
    wait_for(started)
    h.worker.shutdown()
    run = h.current(handle)
    assert run.state is RunState.SCHEDULED and run.attempt == 1 and run.handbacks == 1


def test_a_crashing_task_fails_its_attempt_and_the_worker_runs_the_next_one(
    make: Callable[..., PoolHarness], pool: str
) -> None:
    h = make()
    run = h.run_job(h.delay("c.crash"))
    if pool == "prefork":  # a dead child is retried by the policy: the next attempt may well live
        assert run.state is RunState.SCHEDULED and run.attempt == 2
        assert run.last_error is not None and "WorkerLost" in run.last_error and "exit code 3" in run.last_error
    else:  # a task that raises SystemExit asked to end: not retried
        assert run.state is RunState.FAILED and run.dead_letter
        assert run.last_error is not None and "SystemExit" in run.last_error
    assert h.run_job(h.delay("c.add", 2, 2)).state is RunState.SUCCEEDED


def slots_gauge(state: str) -> float:
    """`jobq_worker_slots{state}` as a scrape would read it now."""
    for metric in METRICS.all():
        if metric.name == "jobq_worker_slots":
            assert isinstance(metric, Gauge)
            metric.refresh()
            return metric.value(state=state)
    raise AssertionError("jobq_worker_slots is not exported")


def touch_file(path: str) -> None:
    Path(path).write_text("")
