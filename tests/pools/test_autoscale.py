"""Autoscaling: the decision on its own (stepped by hand), and a real worker growing and shrinking
its pool from the backlog of its queues, logged and exported."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.daemons.worker.autoscale import (
    GROW_COOLDOWN_S,
    IDLE_FOR_S,
    SHRINK_COOLDOWN_S,
    Autoscaler,
    Signals,
    recommended_workers,
)
from jobq.metrics import METRICS
from jobq.models import RunState

T = 1_790_000_000_000


def test_a_backlog_with_busy_slots_grows_the_pool_at_once_to_what_waits() -> None:
    scaler = Autoscaler(64, 2)
    change = scaler.decide(Signals(backlog=30, busy=2, size=2), T)
    assert change is not None and change.size == 32


def test_growth_stops_at_max() -> None:
    change = Autoscaler(8, 2).decide(Signals(backlog=5000, busy=2, size=2), T)
    assert change is not None and change.size == 8


def test_a_backlog_while_slots_are_free_is_not_a_reason_to_grow() -> None:
    # The consumer is about to take those messages: more slots would not start them sooner.
    assert Autoscaler(8, 2).decide(Signals(backlog=3, busy=1, size=4), T) is None


def test_late_starts_with_every_slot_busy_grow_the_pool_even_when_the_broker_shows_no_backlog() -> None:
    change = Autoscaler(8, 2).decide(Signals(backlog=0, busy=4, size=4, lateness_s=5.0), T)
    assert change is not None and change.size == 6


def test_a_second_grow_waits_for_the_cool_down() -> None:
    scaler = Autoscaler(64, 2)
    assert scaler.decide(Signals(backlog=4, busy=2, size=2), T) is not None
    assert scaler.decide(Signals(backlog=40, busy=6, size=6), T + 100) is None
    later = scaler.decide(Signals(backlog=40, busy=6, size=6), T + round(GROW_COOLDOWN_S * 1000))
    assert later is not None and later.size == 46


def test_the_pool_shrinks_only_after_being_idle_for_a_while_and_never_below_min() -> None:
    scaler = Autoscaler(64, 2)
    assert scaler.decide(Signals(backlog=100, busy=2, size=2), T) is not None
    idle = Signals(backlog=0, busy=0, size=64)
    start = T + round(SHRINK_COOLDOWN_S * 1000)
    assert scaler.decide(idle, start) is None  # idle begins now
    assert scaler.decide(idle, start + round(IDLE_FOR_S * 1000) - 1) is None
    change = scaler.decide(idle, start + round(IDLE_FOR_S * 1000))
    assert change is not None and change.size == 2


def test_half_busy_slots_or_any_backlog_keep_the_pool_from_shrinking() -> None:
    """Hysteresis: the pool grew past 75 % busy and shrinks below 50 % only."""
    scaler = Autoscaler(64, 2)
    for step in range(100):
        now = T + step * 1000
        assert scaler.decide(Signals(backlog=0, busy=6, size=10), now) is None
        assert scaler.decide(Signals(backlog=1, busy=1, size=10), now + 500) is None


def test_recommended_workers_cover_every_message_at_max_slots_each() -> None:
    assert recommended_workers(0, 8) == 1
    assert recommended_workers(17, 8) == 3


# --- a real worker ----------------------------------------------------------------------------


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness("sqlite", tmp_path, clock)
    yield harness
    harness.close()


def gauge(name: str, **labels: str) -> float:
    for metric in METRICS.all():
        if metric.name == name:
            metric.refresh()  # type: ignore[union-attr]
            return metric.value(**labels)
    raise AssertionError(f"no metric {name}")


@pytest.mark.slow
def test_a_worker_grows_its_pool_with_the_backlog_and_shrinks_back_to_min_once_idle(h: Harness, tmp_path: Path) -> None:
    release = tmp_path / "release"

    @h.app.task(name="t.wait")
    def wait() -> None:
        deadline = time.monotonic() + 20
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    handles = [wait.delay() for _ in range(20)]
    h.dispatch()
    worker = h.worker(pool="threads", autoscale=(8, 2), concurrency=2, background=False)
    assert worker.concurrency == 2 and gauge("jobq_worker_pool_size") == 2
    ups = METRICS.autoscale.value(direction="up")

    assert worker.run_once(h.clock.now_ms()) == 2
    change = worker.autoscale_once(h.clock.now_ms())
    assert change is not None and change.size == 8, "18 waiting and both slots busy"
    assert worker.concurrency == 8 and worker.state.concurrency == 8
    assert gauge("jobq_worker_pool_size") == 8 and METRICS.autoscale.value(direction="up") == ups + 1
    assert gauge("jobq_worker_recommended_workers") == 3  # 20 messages at 8 slots a worker
    assert worker.run_once(h.clock.now_ms()) == 6, "the new slots take work at once"
    assert gauge("jobq_worker_slots", state="busy") == 8 and gauge("jobq_worker_slots", state="free") == 0
    running = {t.name for t in threading.enumerate() if t.name.startswith("jobq-task-")}
    assert len(running) == 8

    release.touch()
    while worker.state.busy() or worker.run_once(h.clock.now_ms()):
        worker.complete_once(h.clock.now_ms())
        time.sleep(0.01)
    assert all(h.client.get(x.job_id).current_run.state is RunState.SUCCEEDED for x in handles)  # type: ignore[union-attr]

    assert worker.autoscale_once(h.clock.now_ms()) is None  # idle from now on
    h.advance(IDLE_FOR_S + SHRINK_COOLDOWN_S)
    change = worker.autoscale_once(h.clock.now_ms())
    assert change is not None and change.size == 2
    assert gauge("jobq_worker_pool_size") == 2
    assert [(before, after) for _, before, after, _ in worker.scaling_log] == [(2, 8), (8, 2)]
    deadline = time.monotonic() + 5
    while worker.pool.size != 2:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert os.getpid()  # the pool shrank in this process: idle threads retired
