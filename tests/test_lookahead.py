"""The scanner's look-ahead (issue 14): runs due within `dispatch_lookahead_s` are claimed and
handed over early with a not-before time; the worker holds them and starts them at their due
time, never earlier, and a held run stays fenced like any dispatched run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.daemons.worker import Worker
from jobq.models import JobStatus, Run, RunState
from jobq.ports import RunQuery

LOOKAHEAD_S = 0.3


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock, dispatch_lookahead_s=LOOKAHEAD_S, shutdown_grace_s=0)
    yield harness
    harness.close()


@pytest.fixture
def executed(h: Harness) -> list[str]:
    calls: list[str] = []

    @h.app.task(name="t.record", bind=True)
    def record(ctx: object) -> None:
        calls.append(ctx.run_id)

    return calls


def _one_run(h: Harness, job_id: str) -> Run:
    [run] = h.d.store.list_runs(RunQuery(limit=10)).items
    assert run.job_id == job_id
    return run


def _held(worker: Worker) -> list[int | None]:
    """The not-before times of the deliveries `worker` holds."""
    return [w.envelope.not_before_ms for w in worker.consumer.waiting]


def _schedule_in(h: Harness, ms: int) -> tuple[str, int]:
    from jobq.app import Task

    task = h.app.registry.get("t.record")
    assert task is not None
    due_ms = h.clock.now_ms() + ms
    handle = Task(h.app, task).schedule(at=due_ms)
    return handle.job_id, due_ms


def test_a_run_due_within_the_look_ahead_is_handed_over_early_and_starts_exactly_at_its_due_time(
    h: Harness, executed: list[str]
) -> None:
    job_id, due_ms = _schedule_in(h, 200)
    assert h.dispatch() == 1, "claimed 200 ms before it is due"
    run = _one_run(h, job_id)
    assert run.state is RunState.DISPATCHED
    worker = h.worker()
    worker.run_once(h.clock.now_ms())
    assert _held(worker) == [due_ms], "held, not started"
    assert _one_run(h, job_id).state is RunState.DISPATCHED
    h.clock.set(due_ms - 1)
    worker.run_once(h.clock.now_ms())
    assert _one_run(h, job_id).state is RunState.DISPATCHED, "one millisecond early is too early"
    h.clock.set(due_ms)
    worker.run_once(h.clock.now_ms())
    assert worker.wait_idle(10)
    done = _one_run(h, job_id)
    assert done.state is RunState.SUCCEEDED
    assert done.started_ms == due_ms
    assert executed == [done.run_id]


def test_a_run_due_beyond_the_look_ahead_is_not_claimed_yet(h: Harness, executed: list[str]) -> None:
    job_id, _ = _schedule_in(h, round(LOOKAHEAD_S * 1000) + 50)
    assert h.dispatch() == 0
    assert _one_run(h, job_id).state is RunState.SCHEDULED


def test_a_held_run_counts_against_a_slot_from_the_moment_it_is_held(h: Harness, executed: list[str]) -> None:
    _schedule_in(h, 100)
    h.dispatch()
    worker = h.worker(concurrency=2)
    worker.run_once(h.clock.now_ms())
    assert worker.state.free() == 1, "its slot is kept, so it starts on time whatever else arrives"


def test_cancel_while_a_run_is_held_wins(h: Harness, executed: list[str]) -> None:
    job_id, due_ms = _schedule_in(h, 250)
    h.dispatch()
    worker = h.worker()
    worker.run_once(h.clock.now_ms())
    assert _held(worker) == [due_ms]
    h.client.cancel(job_id)
    h.clock.set(due_ms + 10)
    worker.run_once(h.clock.now_ms())
    assert worker.wait_idle(10)
    assert _one_run(h, job_id).state is RunState.CANCELLED
    assert executed == []
    assert _held(worker) == []
    assert worker.state.free() == worker.concurrency, "the held slot is free again"
    assert h.d.transport.depth("default") == 0, "the stale delivery was dropped"


def test_pause_while_a_run_is_held_wins_and_resume_runs_it_once(h: Harness, executed: list[str]) -> None:
    job_id, due_ms = _schedule_in(h, 250)
    h.dispatch()
    worker = h.worker()
    worker.run_once(h.clock.now_ms())
    h.client.pause(job_id)
    h.clock.set(due_ms)
    worker.run_once(h.clock.now_ms())
    assert worker.wait_idle(10)
    assert executed == []
    assert _one_run(h, job_id).state is RunState.SCHEDULED
    h.client.resume(job_id)
    h.cycle(1)
    assert len(executed) == 1
    assert h.client.job(job_id).status is JobStatus.COMPLETED


def test_a_worker_killed_while_holding_a_run_leaves_it_to_the_reaper_and_it_runs_once(
    h: Harness, executed: list[str]
) -> None:
    job_id, due_ms = _schedule_in(h, 250)
    h.dispatch()
    doomed = h.worker()
    doomed.run_once(h.clock.now_ms())
    assert _held(doomed) == [due_ms]
    h._workers.remove(doomed)  # killed: no shutdown, its delivery stays in flight
    first = _one_run(h, job_id)
    # Past the schedule-to-start lease and the broker's visibility timeout.
    h.advance(max(h.d.settings.schedule_to_start_s, h.d.settings.visibility_timeout_s) + 1)
    assert h.reaper.run_once(h.clock.now_ms()) == 1
    reclaimed = _one_run(h, job_id)
    assert reclaimed.state is RunState.SCHEDULED
    assert reclaimed.fence > first.fence
    for _ in range(3):
        h.cycle(1)
    assert _one_run(h, job_id).state is RunState.SUCCEEDED
    assert len(executed) == 1, "the old delivery came back with a stale fence and was dropped"


def test_a_worker_shutting_down_hands_its_held_runs_back_for_another_to_start_on_time(
    h: Harness, executed: list[str]
) -> None:
    job_id, due_ms = _schedule_in(h, 250)
    h.dispatch()
    leaving = h.worker()
    leaving.run_once(h.clock.now_ms())
    h._workers.remove(leaving)
    leaving.shutdown()
    other = h.worker()
    other.run_once(h.clock.now_ms())
    assert _held(other) == [due_ms]
    h.clock.set(due_ms)
    other.run_once(h.clock.now_ms())
    assert other.wait_idle(10)
    run = _one_run(h, job_id)
    assert run.state is RunState.SUCCEEDED and run.started_ms == due_ms
    assert len(executed) == 1


def test_a_blocked_recurring_run_claimed_early_is_judged_by_its_overlap_policy_only_once_due(
    h: Harness, executed: list[str]
) -> None:
    from jobq.app import Task

    task = h.app.registry.get("t.record")
    assert task is not None
    h.clock.set(h.clock.now_ms() // 60_000 * 60_000 + 60_000)
    handle = Task(h.app, task).schedule(cron="*/5 * * * * *", job_id="every5", overlap="SKIP")
    h.advance(5)
    h.dispatch()  # the first fire is due now: dispatched, and left open (no worker takes it)
    h.advance(5 - LOOKAHEAD_S / 2)  # the second fire is within the look-ahead; the first is still open
    h.dispatch()
    runs = sorted(h.d.store.list_runs(RunQuery(limit=1000)).items, key=lambda r: r.nominal_ms)
    assert [r.state for r in runs[:2]] == [RunState.DISPATCHED, RunState.SCHEDULED], "put back, not skipped"
    assert h.scanner.wait_s(1.0) > 0, "and not claimed again and again until it is due"
    assert handle.job_id == "every5"


def test_a_cancel_after_the_held_run_s_job_was_read_ahead_still_wins(h: Harness, executed: list[str]) -> None:
    job_id, due_ms = _schedule_in(h, 250)
    h.dispatch()
    worker = h.worker()
    worker.run_once(h.clock.now_ms())
    h.clock.set(due_ms - 10)
    worker.run_once(h.clock.now_ms())
    assert _one_run(h, job_id).run_id in worker.consumer.prepared, "its job was read ahead of its start"
    assert worker.consumer.next_due_ms() == due_ms
    h.client.cancel(job_id)
    h.clock.set(due_ms)
    worker.run_once(h.clock.now_ms())
    assert worker.wait_idle(10)
    assert _one_run(h, job_id).state is RunState.CANCELLED
    assert executed == []
    assert worker.consumer.prepared == {}
