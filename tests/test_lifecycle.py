"""A run's life through beat, scanner, worker and reaper, in process, on a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.errors import Fail, Retry
from jobq.metrics import METRICS
from jobq.models import JobStatus, Priority, RetryPolicy, RunState, Transition
from jobq.ports import JobQuery
from jobq.retry import backoff_ceiling_s


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock)
    yield harness
    harness.close()


def test_an_instant_job_runs_once_and_completes_its_job(h: Harness) -> None:
    calls: list[tuple[int, int]] = []

    @h.app.task(name="t.add")
    def add(x: int, y: int) -> int:
        calls.append((x, y))
        return x + y

    handle = add.delay(2, 3)
    assert h.cycle() == 1
    run = h.client.get(handle.job_id).current_run
    assert run is not None
    assert (run.state, run.result, run.attempt, run.fence) == (RunState.SUCCEEDED, 5, 1, 1)
    assert calls == [(2, 3)]
    assert h.client.job(handle.job_id).status is JobStatus.COMPLETED
    assert h.cycle(5) == 0  # nothing runs twice


def test_a_delayed_job_waits_for_its_time(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.schedule(delay_s=45)
    assert h.cycle(44) == 0
    assert h.client.get(handle.job_id).current_run.state is RunState.SCHEDULED  # type: ignore[union-attr]
    assert h.cycle(1) == 1
    assert h.client.get(handle.job_id).current_run.state is RunState.SUCCEEDED  # type: ignore[union-attr]


def test_a_cron_job_fires_at_each_time_and_beat_is_idempotent(h: Harness) -> None:
    seen: list[int] = []

    @h.app.task(name="t.tick", bind=True)
    def tick(ctx: object) -> None:
        seen.append(1)

    handle = tick.schedule(cron="*/10 * * * * *")
    for _ in range(6):
        h.beat.run_once(h.clock.now_ms())  # several beats in a row create nothing new
        h.cycle(10)
    runs = h.client.runs(handle.job_id).items
    assert len(seen) == 6
    assert all(r.nominal_ms % 10_000 == 0 for r in runs)
    assert len({r.run_id for r in runs}) == len(runs)


def test_a_task_failing_twice_then_succeeding_ends_at_attempt_3_with_jittered_delays(h: Harness) -> None:
    policy = RetryPolicy(max_retries=3, initial_interval_sec=2, backoff_multiplier=3, max_interval_sec=100)
    attempts: list[int] = []

    @h.app.task(name="t.flaky", retry=policy, bind=True)
    def flaky(ctx) -> str:  # type: ignore[no-untyped-def]
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("down")
        return "ok"

    handle = flaky.delay()
    for attempt in (1, 2):
        now = h.clock.now_ms()
        h.cycle()
        run = h.client.get(handle.job_id).current_run
        assert run is not None and run.state is RunState.SCHEDULED and run.attempt == attempt + 1
        delay_s = (run.due_ms - now) / 1000
        assert 0 <= delay_s <= backoff_ceiling_s(policy, attempt)
        assert run.last_error is not None and "ConnectionError: down" in run.last_error
        h.clock.set(run.due_ms)
    h.cycle()
    final = h.client.wait(handle.job_id, timeout_s=1)
    assert (final.state, final.attempt, final.result) == (RunState.SUCCEEDED, 3, "ok")
    assert attempts == [1, 2, 3]


def test_a_task_that_always_fails_is_dead_lettered_and_redrive_runs_it_again(h: Harness) -> None:
    outcome = {"fail": True}

    @h.app.task(name="t.broken", retry=RetryPolicy(max_retries=2, initial_interval_sec=1))
    def broken() -> None:
        if outcome["fail"]:
            raise RuntimeError("always")

    handle = broken.delay()
    for _ in range(4):
        h.cycle(2)
    run = h.client.get(handle.job_id).current_run
    assert run is not None and (run.state, run.attempt, run.dead_letter) == (RunState.FAILED, 3, True)
    assert [r.run_id for r in h.client.dead_letters().items] == [run.run_id]
    assert h.client.job(handle.job_id).status is JobStatus.COMPLETED

    outcome["fail"] = False
    redriven = h.client.redrive(run.run_id)
    assert (redriven.state, redriven.attempt, redriven.dead_letter) == (RunState.SCHEDULED, 4, False)
    h.cycle()
    assert h.client.wait(handle.job_id, timeout_s=1).state is RunState.SUCCEEDED
    assert h.client.dead_letters().items == []


def test_fail_stops_retries_and_retry_chooses_its_delay(h: Harness) -> None:
    @h.app.task(name="t.fail")
    def fails() -> None:
        raise Fail("bad input")

    @h.app.task(name="t.later")
    def later() -> None:
        raise Retry("not yet", delay_s=30)

    failed = fails.delay()
    retried = later.delay()
    now = h.clock.now_ms()
    h.cycle()
    f = h.client.get(failed.job_id).current_run
    r = h.client.get(retried.job_id).current_run
    assert f is not None and (f.state, f.attempt, f.dead_letter) == (RunState.FAILED, 1, True)
    assert r is not None and r.state is RunState.SCHEDULED and r.due_ms == now + 30_000


def test_non_retryable_errors_fail_at_once(h: Harness) -> None:
    @h.app.task(name="t.value", retry=RetryPolicy(max_retries=5, non_retryable_errors=("ValueError",)))
    def value() -> None:
        raise ValueError("no")

    handle = value.delay()
    h.cycle()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and (run.state, run.attempt) == (RunState.FAILED, 1)


def test_the_scanner_dispatches_critical_runs_before_lower_tiers(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    now = h.clock.now_ms()
    lows = [noop.schedule(at=now, priority="LOW") for _ in range(5)]
    critical = noop.schedule(at=now, priority="CRITICAL")
    h.scanner.batch = 1
    h.scanner.run_once(now)
    run = h.client.get(critical.job_id).current_run
    assert run is not None and run.state is RunState.DISPATCHED
    assert all(h.client.get(low.job_id).current_run.state is RunState.SCHEDULED for low in lows)  # type: ignore[union-attr]


def test_the_scanner_grows_its_batch_while_passes_come_back_full_and_starts_small_again(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    now = h.clock.now_ms()
    for _ in range(20):
        noop.schedule(at=now)
    h.scanner.base_batch = h.scanner.batch = 2
    passes = [h.scanner.run_once(now) for _ in range(5)]
    assert passes == [2, 4, 8, 6, 0]  # doubling while full; 6 of 16 is not full
    assert h.scanner.batch == 2  # the pass after a quiet one is small again
    h.scanner.base_batch = h.scanner.batch = 1000
    for _ in range(12):
        h.scanner._full = True
        h.scanner._resize()
    assert h.scanner.batch == 4000  # at most four times the configured batch


def test_a_critical_run_enqueued_after_1000_low_runs_starts_next(h: Harness) -> None:
    order: list[str] = []

    @h.app.task(name="t.record", bind=True)
    def record(ctx, tier: str) -> None:  # type: ignore[no-untyped-def]
        order.append(tier)

    for _ in range(1000):
        record.schedule(kwargs={"tier": "LOW"}, priority=Priority.LOW)
    h.dispatch()
    worker = h.worker(concurrency=1)
    worker.run_once(h.clock.now_ms())  # the one slot takes a LOW run
    record.schedule(kwargs={"tier": "CRITICAL"}, priority=Priority.CRITICAL)
    h.dispatch()
    assert worker.wait_idle(5)
    worker.run_once(h.clock.now_ms())
    assert worker.wait_idle(5)
    assert order == ["LOW", "CRITICAL"]


def test_the_reaper_reclaims_an_expired_running_lease_and_the_late_completion_is_rejected(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.delay()
    h.dispatch()
    run = h.client.get(handle.job_id).current_run
    assert run is not None
    # A worker starts the run, then dies without heartbeating.
    now = h.clock.now_ms()
    [started] = h.d.store.transition(
        [
            Transition(
                run.run_id,
                frozenset({RunState.DISPATCHED}),
                RunState.RUNNING,
                run.fence,
                {"lease_owner": "dead-worker", "lease_expires_ms": now + 30_000},
                at_ms=now,
            )
        ]
    )
    assert started is not None
    h.advance(29)
    assert h.reaper.run_once(h.clock.now_ms()) == 0
    h.advance(2)
    assert h.reaper.run_once(h.clock.now_ms()) == 1
    reclaimed = h.client.run(run.run_id)
    assert (reclaimed.state, reclaimed.fence, reclaimed.attempt) == (RunState.SCHEDULED, run.fence + 1, 2)
    assert reclaimed.last_error is not None and "LeaseExpired" in reclaimed.last_error

    before = METRICS.fenced_writes.value(op="complete")
    late = Transition(
        run.run_id,
        frozenset({RunState.RUNNING}),
        RunState.SUCCEEDED,
        run.fence,
        {"finished_ms": now},
        expect_owner="dead-worker",
    )
    assert h.d.store.transition([late]) == [None]
    h.clock.set(reclaimed.due_ms)
    h.cycle()
    final = h.client.run(run.run_id)
    assert final.state is RunState.SUCCEEDED and final.fence == run.fence + 2
    assert METRICS.fenced_writes.value(op="complete") == before  # the worker path wrote nothing stale


def test_an_expired_dispatch_lease_is_dispatched_again_without_counting_an_attempt(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.delay()
    h.dispatch()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and run.state is RunState.DISPATCHED
    h.advance(h.d.settings.schedule_to_start_s + 1)
    assert h.reaper.run_once(h.clock.now_ms()) == 1
    again = h.client.run(run.run_id)
    assert (again.state, again.attempt, again.fence) == (RunState.SCHEDULED, 1, run.fence + 1)
    h.cycle()  # the stale first message is dropped, the new one runs
    assert h.client.run(run.run_id).state is RunState.SUCCEEDED


def test_an_instant_run_is_dispatched_at_submission_without_the_scanner(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.delay()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and (run.state, run.fence, run.dispatched_ms) == (RunState.DISPATCHED, 1, h.clock.now_ms())
    assert h.d.index.next_due_ms() is None  # nothing waits in the time index
    assert h.work() == 1
    assert h.client.get(handle.job_id).current_run.state is RunState.SUCCEEDED  # type: ignore[union-attr]


def test_an_instant_run_the_broker_refuses_goes_to_the_scanner(h: Harness) -> None:
    from jobq.errors import TransportUnavailable

    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    publish = h.d.transport.publish

    def refuse(queue: str, bodies: object) -> None:
        raise TransportUnavailable("broker down")

    h.d.transport.publish = refuse  # type: ignore[method-assign]
    handle = noop.delay()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and (run.state, run.fence) == (RunState.SCHEDULED, 1)
    h.d.transport.publish = publish  # type: ignore[method-assign]
    assert h.cycle() == 1
    assert h.client.get(handle.job_id).current_run.state is RunState.SUCCEEDED  # type: ignore[union-attr]


def test_an_instant_run_whose_submitter_died_before_publishing_is_recovered_by_the_reaper(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobq.client import Client

    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    monkeypatch.setattr(Client, "_publish_pairs", lambda self, pairs: None)  # the process died here
    handle = noop.delay()
    assert h.d.transport.depth("default") == 0  # stored, never published
    h.advance(h.d.settings.schedule_to_start_s + 1)
    assert h.reaper.run_once(h.clock.now_ms()) == 1
    h.cycle()
    run = h.client.get(handle.job_id).current_run
    # fence 1 at submission, 2 when the reaper took it back, 3 when the scanner claimed it again
    assert run is not None and (run.state, run.fence, run.attempt) == (RunState.SUCCEEDED, 3, 1)


def test_submit_many_creates_a_batch_that_runs(h: Harness) -> None:
    from jobq.errors import InvalidJob
    from jobq.submission import JobSpec

    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    def spec(**fields: object) -> JobSpec:
        return JobSpec.model_validate({"target": {"type": "TASK", "task": "t.noop"}, **fields})

    jobs = h.client.submit_many([spec(schedule_type="IMMEDIATE"), spec(schedule_type="ONE_OFF", delay_seconds=5)] * 10)
    assert len(jobs) == 20
    assert h.work() == 10  # the instant ones were dispatched at submission
    assert h.cycle(5) == 10
    with pytest.raises(InvalidJob, match=r"specs\[1\]: .*cron"):
        h.client.submit_many(
            [spec(schedule_type="IMMEDIATE"), spec(schedule_type="CRON", cron_expression="61 * * * *")]
        )
    assert len(h.client.list(JobQuery(limit=100)).items) == 20  # nothing written
