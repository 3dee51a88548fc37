"""A worker keeps what it finished: outcomes stay leased until durable, whatever the store does
meanwhile, and its bookkeeping never lets one attempt touch another (issue "Trust under faults",
items 5 and 6)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import FaultPlan, Faulty
from harness import Harness

from jobq.clock import ManualClock
from jobq.daemons.worker import Worker
from jobq.metrics import METRICS
from jobq.models import RunState, Transition
from jobq.ports import RunQuery
from jobq.tasks import TaskContext


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock)
    yield harness
    harness.close()


def _faulty(h: Harness, plan: FaultPlan, concurrency: int = 32) -> Worker:
    """A worker whose store and broker calls go through `plan`; driven by hand (no threads but the pool's)."""
    h.d.store = Faulty(h.d.store, "store", plan)  # type: ignore[assignment]
    h.d.transport = Faulty(h.d.transport, "transport", plan)  # type: ignore[assignment]
    return h.worker(background=False, concurrency=concurrency)


def _outcomes(ts: list[Transition]) -> bool:
    return any(t.to_state in (RunState.SUCCEEDED, RunState.FAILED) for t in ts)


def _finish(h: Harness, worker: Worker, job_ids: list[str], *, timeout_s: float = 5) -> None:
    """Step the worker's completer until every job's run has an outcome, as its thread would."""
    for _ in range(200):
        worker.complete_once(h.clock.now_ms())
        if all(h.client.get(j).current_run.state.terminal for j in job_ids):  # type: ignore[union-attr]
            return
        worker.state.wait(lambda: False, 0.01)
    raise AssertionError("the outcomes were never written")


def _noop(h: Harness) -> Any:
    @h.app.task(name="t.noop")
    def noop() -> str:
        return "done"

    return noop


@pytest.mark.parametrize("mode", ["before", "after"])
def test_an_outcome_batch_whose_write_fails_is_retried_until_it_commits(h: Harness, mode: str) -> None:
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    jobs = [noop.delay().job_id for _ in range(5)]
    plan.script("store", "transition", mode, times=2, when=_outcomes)  # raises twice (after applying, for "after")
    worker.run_once(h.clock.now_ms())
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    fenced_before = METRICS.fenced_writes.value(op="complete")
    for _ in range(3):
        worker.complete_once(h.clock.now_ms())
        h.advance(5)  # past any backoff
    runs = [h.client.get(j).current_run for j in jobs]
    assert [(r.state, r.attempt, r.result) for r in runs if r] == [(RunState.SUCCEEDED, 1, "done")] * 5
    assert METRICS.fenced_writes.value(op="complete") == fenced_before, "a write that applied is not counted refused"
    assert worker.state.busy() == 0
    kinds = [e.kind for j in jobs for e in h.client.history(j)]
    assert kinds.count("SUCCEEDED") == 5


def test_a_finished_run_stays_leased_while_its_outcome_cannot_be_written(h: Harness) -> None:
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    job_id = noop.delay().job_id
    plan.script("store", "transition", "before", times=10**6, when=_outcomes)  # the store refuses outcomes for a while
    worker.run_once(h.clock.now_ms())
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    for _ in range(9):  # 90 s: three times the 30 s lease
        worker.complete_once(h.clock.now_ms())
        h.advance(10)
        worker.monitor_once(h.clock.now_ms())
        assert h.reaper.run_once(h.clock.now_ms()) == 0, "the completing run's lease was renewed"
    plan.scripted.clear()  # the store is back
    h.advance(10)
    _finish(h, worker, [job_id])
    run = h.client.get(job_id).current_run
    assert run is not None and (run.state, run.attempt) == (RunState.SUCCEEDED, 1)


def test_a_store_error_reading_the_job_uses_no_attempt(h: Harness) -> None:
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    job_id = noop.delay().job_id
    plan.script("store", "get_jobs", "before")
    with pytest.raises(Exception, match="injected"):
        worker.run_once(h.clock.now_ms())
    assert worker.state.busy() == 0
    run = h.client.get(job_id).current_run
    assert run is not None and run.state is RunState.DISPATCHED and run.attempt == 1  # nothing started
    h.advance(1)
    worker.run_once(h.clock.now_ms())  # the returned message comes back
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    _finish(h, worker, [job_id])
    run = h.client.get(job_id).current_run
    assert run is not None and (run.state, run.attempt) == (RunState.SUCCEEDED, 1)


def test_a_start_batch_that_applied_and_then_raised_still_runs_its_tasks(h: Harness) -> None:
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    jobs = [noop.delay().job_id for _ in range(3)]
    plan.script("store", "transition", "after", when=lambda ts: ts[0].to_state is RunState.RUNNING)
    worker.run_once(h.clock.now_ms())
    assert worker.state.busy() == 3, "the starts that applied are held and run"
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    _finish(h, worker, jobs)
    assert all(h.client.get(j).current_run.attempt == 1 for j in jobs)  # type: ignore[union-attr]


def test_a_start_batch_whose_confirmation_meets_the_same_outage_still_runs_its_tasks(h: Harness) -> None:
    """The starts applied, the answer was lost, and the store stayed away for the first reads that
    asked which had applied: the worker asks again instead of dropping runs it holds (they sat
    RUNNING, unexecuted and unrenewed, until the reaper took them back at attempt 2)."""
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    jobs = [noop.delay().job_id for _ in range(3)]
    plan.script("store", "transition", "after", when=lambda ts: ts[0].to_state is RunState.RUNNING)
    plan.script("store", "get_runs", "before", times=2)
    for _ in range(3):  # the first take's read and the next take's fail; the third take's answers
        worker.run_once(h.clock.now_ms())
    assert worker.state.busy() == 3, "the starts that applied are held and run"
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    _finish(h, worker, jobs)
    assert all(h.client.get(j).current_run.attempt == 1 for j in jobs)  # type: ignore[union-attr]


def test_a_start_whose_outcome_stays_unknown_through_a_long_outage_runs_once_the_store_answers(h: Harness) -> None:
    """The store went away while committing a start batch and stayed away for longer than any
    fixed wait (here 40 takes, well past half a lease on the clock). The worker keeps the messages
    and asks again on each take, consuming nothing new meanwhile; once the store answers, the runs
    whose start applied execute at attempt 1. It used to wait half a lease, then return the
    messages: the runs sat RUNNING, unexecuted and unrenewed, until the reaper took them back at
    attempt 2 (issue 9, a PostgreSQL outage on every pool)."""
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    jobs = [noop.delay().job_id for _ in range(3)]
    plan.script("store", "transition", "after", when=lambda ts: ts[0].to_state is RunState.RUNNING)
    plan.script("store", "get_runs", "before", times=40)
    consumed = 0
    for _ in range(40):
        consumed += worker.run_once(h.clock.now_ms())
        h.advance(0.5)
        assert worker.state.busy() == 0
    assert consumed == 3, "nothing new is taken while the outcome of a start is unknown"
    worker.run_once(h.clock.now_ms())
    assert worker.state.busy() == 3, "the starts that applied are held and run"
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    _finish(h, worker, jobs)
    assert all(h.client.get(j).current_run.attempt == 1 for j in jobs)  # type: ignore[union-attr]


def test_a_start_batch_that_failed_before_applying_returns_its_messages(h: Harness) -> None:
    """Nothing applied: the runs are still DISPATCHED, so their messages go back to the broker and
    start on a later take. They were acked as stale before, and each run waited for the reaper's
    schedule-to-start repair."""
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    jobs = [noop.delay().job_id for _ in range(3)]
    plan.script("store", "transition", "before", when=lambda ts: ts[0].to_state is RunState.RUNNING)
    worker.run_once(h.clock.now_ms())
    assert worker.state.busy() == 0
    h.advance(2)  # past the returned messages' delay
    worker.run_once(h.clock.now_ms())
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    _finish(h, worker, jobs)
    assert all(h.client.get(j).current_run.attempt == 1 for j in jobs)  # type: ignore[union-attr]


def test_a_broker_error_after_runs_started_keeps_their_slots_and_messages(h: Harness) -> None:
    release = threading.Event()

    @h.app.task(name="t.wait")
    def wait() -> None:
        assert release.wait(10)

    plan = FaultPlan()
    worker = _faulty(h, plan, concurrency=4)
    running = [wait.delay().job_id for _ in range(2)]
    stale = wait.delay()
    h.client.cancel(stale.job_id)  # its message is still queued; starting it is refused
    plan.script("transport", "ack")  # dropping the stale message fails
    plan.script("transport", "nack")
    assert worker.run_once(h.clock.now_ms()) == 3
    assert worker.state.busy() == 2 and worker.state.free() == 2, "only the stale delivery was let go"
    assert not worker.wait_idle(0.2), "the running tasks are still held"
    release.set()
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    _finish(h, worker, running)
    assert worker.state.free() == 4


def test_a_timed_out_attempt_returning_late_leaves_the_next_attempt_alone(h: Harness) -> None:
    first_release = threading.Event()
    starts: list[TaskContext] = []

    @h.app.task(name="t.slow", timeout_s=50, bind=True)
    def slow(ctx: TaskContext) -> str:
        starts.append(ctx)
        if ctx.attempt == 1:
            first_release.wait(10)
        else:
            second_release.wait(10)
        return f"attempt {ctx.attempt}"

    second_release = threading.Event()
    job_id = slow.delay().job_id
    worker = h.worker(concurrency=2, background=False)
    worker.run_once(h.clock.now_ms())
    h.advance(51)
    worker.monitor_once(h.clock.now_ms())  # attempt 1 times out: fence+1, retried at once
    worker.complete_once(h.clock.now_ms())
    h.advance(2)
    h.dispatch()
    assert worker.run_once(h.clock.now_ms()) == 1  # attempt 2 starts on the same worker
    for _ in range(100):
        if len(starts) == 2:
            break
        worker.state.wait(lambda: False, 0.01)
    first_release.set()  # attempt 1's thread finally returns
    worker.state.wait(lambda: False, 0.2)
    assert worker.complete_once(h.clock.now_ms()) == 0, "the late outcome of attempt 1 is ignored"
    for _ in range(6):  # attempt 2 keeps its lease: its heartbeats still run
        h.advance(4)
        worker.monitor_once(h.clock.now_ms())
        assert h.reaper.run_once(h.clock.now_ms()) == 0
    second_release.set()
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    _finish(h, worker, [job_id])
    run = h.client.get(job_id).current_run
    assert run is not None and (run.state, run.attempt, run.result) == (RunState.SUCCEEDED, 2, "attempt 2")


def test_tasks_stuck_past_their_time_limit_count_as_lost_slots_and_turn_the_worker_unhealthy(h: Harness) -> None:
    release = threading.Event()

    @h.app.task(name="t.stuck", timeout_s=1)
    def stuck() -> None:
        release.wait(30)

    jobs = [stuck.delay().job_id for _ in range(2)]
    worker = h.worker(concurrency=2, background=False)
    worker.run_once(h.clock.now_ms())
    assert worker.healthy()
    h.advance(2)
    worker.monitor_once(h.clock.now_ms())
    worker.complete_once(h.clock.now_ms())
    assert worker.state.lost_slots() == 2 and worker.state.free() == 0
    assert not worker.healthy(), "every slot is held by a task that cannot be stopped"
    runs = [h.client.get(j).current_run for j in jobs]
    assert all(r is not None and r.last_error and "TaskTimeout" in r.last_error for r in runs)
    release.set()
    assert worker.state.wait(lambda: worker.state.lost_slots() == 0, 5), "the slots come back when the tasks return"
    assert worker.healthy() and worker.state.free() == 2


def test_the_reaper_finds_no_run_to_reclaim_after_a_batch_of_outcomes_failed_once(h: Harness) -> None:
    noop = _noop(h)
    plan = FaultPlan()
    worker = _faulty(h, plan)
    jobs = [noop.delay().job_id for _ in range(20)]
    plan.script("store", "transition", "before", when=_outcomes)
    worker.run_once(h.clock.now_ms())
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    worker.complete_once(h.clock.now_ms())  # fails: the outcomes stay held
    h.advance(31)
    worker.monitor_once(h.clock.now_ms())
    assert h.reaper.run_once(h.clock.now_ms()) == 0
    _finish(h, worker, jobs)
    done = h.d.store.list_runs(RunQuery(limit=100)).items
    assert sorted({(r.state, r.attempt) for r in done}) == [(RunState.SUCCEEDED, 1)]


class _StalledBroker:
    """The deployment's transport, whose acks and extensions hang until `resume` (a SIGSTOPped Redis)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.resume = threading.Event()
        self.hung = threading.Event()

    def ack(self, deliveries: Any) -> None:
        self.hung.set()
        assert self.resume.wait(20)
        self.inner.ack(deliveries)

    def extend(self, deliveries: Any, visibility_s: float) -> None:
        self.hung.set()
        assert self.resume.wait(20)
        self.inner.extend(deliveries, visibility_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_stalled_broker_holds_up_neither_outcomes_nor_lease_renewals(h: Harness) -> None:
    release = threading.Event()

    @h.app.task(name="t.quick")
    def quick() -> None:
        pass

    @h.app.task(name="t.long")
    def long() -> None:
        assert release.wait(20)

    broker = _StalledBroker(h.d.transport)
    h.d.transport = broker  # type: ignore[assignment]
    worker = h.worker(concurrency=8)
    long_job = long.delay().job_id
    first = [quick.delay().job_id for _ in range(3)]
    worker.run_once(h.clock.now_ms())
    assert worker.state.wait(lambda: worker.state.busy() == 1, 5), "the quick outcomes are written"
    assert broker.hung.wait(5), "and their acks hang on the broker"
    second = [quick.delay().job_id for _ in range(3)]
    worker.run_once(h.clock.now_ms())
    assert worker.state.wait(lambda: worker.state.busy() == 1, 5), "later outcomes are not stuck behind the acks"
    for _ in range(6):  # a minute of the long task, twice its lease, with the broker still stalled
        h.advance(10)
        worker.monitor_once(h.clock.now_ms())
        assert h.reaper.run_once(h.clock.now_ms()) == 0, "its lease is renewed all the same"
    release.set()
    assert worker.state.wait(lambda: worker.state.busy() == 0, 5)
    runs = [h.client.get(j).current_run for j in [long_job, *first, *second]]
    assert {(r.state, r.attempt) for r in runs if r} == {(RunState.SUCCEEDED, 1)}
    broker.resume.set()
    assert worker.wait_idle(10)


def test_a_run_whose_job_stopped_decoding_since_dispatch_is_dead_lettered_not_run(h: Harness) -> None:
    ran: list[int] = []

    @h.app.task(name="t.count")
    def count() -> None:
        ran.append(1)

    job_id = count.delay().job_id  # dispatched at once: its message is queued
    job = h.client.job(job_id)
    from jobq.store.memory import MemoryStore
    from jobq.store.sqlite import SqliteStore

    doc = job.model_dump(mode="json")
    doc["retry"]["max_retries"] = -1  # a record no version of jobq accepts, written behind its back
    store = h.d.store
    if isinstance(store, MemoryStore):
        store.put_raw_job(doc)
    else:
        assert isinstance(store, SqliteStore)
        with store.db.write() as conn:
            conn.execute("UPDATE jobq_jobs SET doc = ? WHERE job_id = ?", (json.dumps(doc), job_id))
    assert h.work() == 1
    run = h.client.get(job_id).current_run
    assert ran == [], "the task of a job that does not decode is not run"
    assert run is not None and run.state is RunState.FAILED and run.dead_letter
    assert run.last_error is not None and run.last_error.startswith("Corrupt: ")
