"""Overlap, misfire, pause/resume/cancel/trigger, timeouts, lost leases and index repair."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import key
from harness import Harness

from jobq.clock import ManualClock
from jobq.codec import Envelope, encode
from jobq.daemons.worker import daemon as worker_daemon
from jobq.errors import MissedWindow
from jobq.metrics import METRICS
from jobq.models import JobStatus, Priority, RetryPolicy, RunState
from jobq.ports import RunQuery
from jobq.tasks import TaskContext
from jobq.timeindex.memory import MemoryTimeIndex


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock)
    yield harness
    harness.close()


def _states(h: Harness, job_id: str) -> list[str]:
    runs = h.d.store.list_runs(RunQuery(job=key(job_id), limit=1000)).items
    return [r.state.value for r in sorted(runs, key=lambda r: r.nominal_ms)]


class Blocker:
    """A task that holds its worker slot until released, like a long-running job."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self) -> None:
        self.started.set()
        assert self.release.wait(10)


def _cron_with_running_first_run(h: Harness, overlap: str) -> tuple[str, Blocker]:
    blocker = Blocker()
    h.app.task(name="t.long")(blocker)
    job = h.app.registry.get("t.long")
    assert job is not None
    from jobq.app import Task

    handle = Task(h.app, job).schedule(cron="*/10 * * * * *", overlap=overlap)
    h.clock.set((h.clock.now_ms() // 10_000 + 1) * 10_000)  # the first fire
    h.dispatch()
    worker = h.worker(concurrency=2)
    worker.run_once(h.clock.now_ms())
    assert blocker.started.wait(5)
    return handle.job_id, blocker


@pytest.mark.parametrize(
    ("overlap", "expected"),
    [
        # first run RUNNING while the next two fires come due
        ("SKIP", ["RUNNING", "CANCELLED", "CANCELLED"]),
        ("BUFFER_ONE", ["RUNNING", "SCHEDULED", "CANCELLED"]),
        ("BUFFER_ALL", ["RUNNING", "SCHEDULED", "SCHEDULED"]),
        ("ALLOW_ALL", ["RUNNING", "DISPATCHED", "DISPATCHED"]),
    ],
)
def test_overlap_policy_decides_what_happens_to_runs_due_while_one_is_running(
    h: Harness, overlap: str, expected: list[str]
) -> None:
    job_id, blocker = _cron_with_running_first_run(h, overlap)
    for _ in range(2):
        h.advance(10)
        h.dispatch()
    assert _states(h, job_id)[:3] == expected
    blocker.release.set()


def test_buffered_runs_start_once_the_running_one_finishes(h: Harness) -> None:
    job_id, blocker = _cron_with_running_first_run(h, "BUFFER_ONE")
    h.advance(10)
    h.dispatch()
    blocker.release.set()
    assert h._workers[0].wait_idle(5)
    h.advance(1)  # the held run is re-checked after overlap_hold_s
    h.dispatch()
    assert _states(h, job_id)[:2] == ["SUCCEEDED", "DISPATCHED"]


def test_cancel_other_cancels_the_running_run_which_then_sees_its_lease_lost(h: Harness) -> None:
    job_id, blocker = _cron_with_running_first_run(h, "CANCEL_OTHER")
    h.advance(10)
    h.dispatch()
    assert _states(h, job_id)[:2] == ["CANCELLED", "DISPATCHED"]
    worker = h._workers[0]
    h.advance(h.d.settings.heartbeat_s)
    worker.monitor_once(h.clock.now_ms())
    blocker.release.set()
    assert worker.wait_idle(5)
    assert _states(h, job_id)[0] == "CANCELLED"  # its late success was refused


def test_a_one_off_past_its_catch_up_window_is_refused_at_submission(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    with pytest.raises(MissedWindow):
        noop.schedule(at=h.clock.now_ms() - 2 * 86_400_000)
    assert h.client.list(__import__("jobq.ports").ports.JobQuery()).items == []


def test_a_one_off_missed_while_the_scheduler_was_down_is_dead_lettered_as_missed(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.schedule(delay_s=600, catchup_window_s=60)
    h.advance(600 + 3600)  # everything was down for an hour past the fire time
    h.cycle()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and (run.state, run.dead_letter) == (RunState.FAILED, True)
    assert run.last_error is not None and run.last_error.startswith("MISSED")


@pytest.mark.parametrize(("policy", "ran"), [("fire_once_now", 1), ("skip", 0), ("fire_all", 6)])
def test_misfire_policy_after_an_outage(h: Harness, policy: str, ran: int) -> None:
    count: list[int] = []

    @h.app.task(name="t.count")
    def count_it() -> None:
        count.append(1)

    handle = count_it.schedule(cron="*/10 * * * *", misfire=policy, overlap="ALLOW_ALL")
    h.advance(3600)  # beat, scanner and workers were all down for an hour
    before = METRICS.misfires.value()
    h.cycle()
    assert len(count) == ran
    assert METRICS.misfires.value() > before
    job = h.client.job(handle.job_id)
    assert job.next_fire_ms is not None and job.next_fire_ms > h.clock.now_ms()


def test_pause_parks_waiting_runs_and_resume_skips_fires_missed_meanwhile(h: Harness) -> None:
    count: list[int] = []

    @h.app.task(name="t.count")
    def count_it() -> None:
        count.append(1)

    handle = count_it.schedule(cron="*/10 * * * * *")
    h.dispatch()  # materialises the next minute of fires
    h.client.pause(handle.job_id)
    assert h.client.job(handle.job_id).status is JobStatus.PAUSED
    h.cycle(35)
    assert count == []
    h.client.resume(handle.job_id)
    h.cycle()
    assert count == []  # fires during the pause are skipped, not replayed
    h.cycle(10)
    assert len(count) == 1


def test_a_paused_one_off_fires_when_resumed(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.schedule(delay_s=5)
    h.client.pause(handle.job_id)
    h.cycle(10)
    assert h.client.get(handle.job_id).current_run is None or _states(h, handle.job_id) == ["SCHEDULED"]
    h.client.resume(handle.job_id)
    h.cycle()
    assert _states(h, handle.job_id) == ["SUCCEEDED"]


def test_cancel_ends_the_job_and_its_unfinished_runs(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.schedule(cron="* * * * * *")
    h.dispatch()
    h.client.cancel(handle.job_id)
    h.cycle(5)
    states = set(_states(h, handle.job_id))
    assert states == {"CANCELLED"}
    assert h.client.job(handle.job_id).status is JobStatus.CANCELLED


def test_trigger_runs_a_cron_job_now(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.schedule(cron="0 0 1 1 *")
    run = h.client.trigger(handle.job_id)
    h.cycle()
    assert h.client.run(run.run_id).state is RunState.SUCCEEDED


def test_a_task_past_its_timeout_fails_its_attempt_and_sees_lease_lost(h: Harness) -> None:
    seen: list[TaskContext] = []
    release = threading.Event()

    @h.app.task(name="t.slow", timeout_s=5, bind=True)
    def slow(ctx: TaskContext) -> None:
        seen.append(ctx)
        release.wait(10)

    handle = slow.delay()
    h.dispatch()
    worker = h.worker()
    worker.run_once(h.clock.now_ms())
    for _ in range(500):  # the task thread reads its start time when it picks the run up
        if seen:
            break
        threading.Event().wait(0.01)
    h.advance(6)
    worker.monitor_once(h.clock.now_ms())
    worker.complete_once(h.clock.now_ms())  # the timeout is an outcome: the completer makes it durable
    assert seen and seen[0].lease_lost.is_set()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and run.state is RunState.SCHEDULED and run.attempt == 2
    assert run.last_error is not None and "TaskTimeout" in run.last_error
    release.set()
    assert worker.wait_idle(5)
    assert h.client.run(run.run_id).state is RunState.SCHEDULED  # the late success was fenced off


def test_heartbeats_renew_the_lease_so_the_reaper_leaves_a_long_task_alone(h: Harness) -> None:
    release = threading.Event()

    @h.app.task(name="t.long")
    def long() -> None:
        release.wait(10)

    handle = long.delay()
    h.dispatch()
    worker = h.worker()
    worker.run_once(h.clock.now_ms())
    for _ in range(10):  # 100 s of a task with a 30 s lease, a heartbeat every 10 s
        h.advance(10)
        worker.monitor_once(h.clock.now_ms())
        assert h.reaper.run_once(h.clock.now_ms()) == 0
    release.set()
    assert worker.wait_idle(5)
    run = h.client.get(handle.job_id).current_run
    assert run is not None and (run.state, run.attempt) == (RunState.SUCCEEDED, 1)


def test_a_message_for_an_unknown_task_is_left_for_other_workers_then_failed(h: Harness) -> None:
    from jobq.submission import JobSpec

    spec = JobSpec.model_validate({"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "t.elsewhere"}})
    job = h.client.submit(spec).job
    worker = h.worker()
    for n in range(5):  # handed on through the store (fence+1), re-dispatched a second later
        h.dispatch()
        worker.run_once(h.clock.now_ms())
        assert worker.wait_idle(5)
        h.advance(1.1)
        if n < 4:
            run = h.client.get(job.job_id).current_run
            assert run is not None and (run.state, run.handbacks) == (RunState.SCHEDULED, n + 1)
    run = h.client.get(job.job_id).current_run
    assert run is not None and run.state is RunState.FAILED
    assert run.last_error is not None and "UnknownTask" in run.last_error


def test_an_undecodable_message_is_dropped_without_stopping_the_worker(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    h.d.transport.publish("default", [b"not json"])
    handle = noop.delay()
    h.dispatch()
    assert h.work() == 2
    assert h.client.get(handle.job_id).current_run.state is RunState.SUCCEEDED  # type: ignore[union-attr]
    assert h.d.transport.depth("default") == 0


def test_a_stale_message_is_acked_and_counted(h: Harness) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    handle = noop.delay()
    h.cycle()
    run = h.client.get(handle.job_id).current_run
    assert run is not None
    before = METRICS.stale_deliveries.value()
    stale = Envelope(run.run_id, run.job_id, run.fence - 1, "t.noop", Priority.DEFAULT, 1, {"args": []})
    h.d.transport.publish("default", [encode(stale)])
    assert h.work() == 1
    assert METRICS.stale_deliveries.value() == before + 1
    assert h.d.transport.depth("default") == 0


def test_beat_repairs_an_index_that_lost_its_entries(tmp_path: Path, clock: ManualClock) -> None:
    h = Harness("memory", tmp_path, clock, repair_interval_s=1)
    try:
        ran: list[int] = []

        @h.app.task(name="t.count")
        def count_it() -> None:
            ran.append(1)

        for _ in range(20):
            count_it.schedule(delay_s=1)
        h.d.index = MemoryTimeIndex()  # the index was flushed
        h.scanner.index = h.d.index
        h.beat.d.index = h.d.index
        h.cycle(1)
        assert ran == []
        h.cycle(3)  # beat re-indexes overdue SCHEDULED runs from the store
        assert len(ran) == 20
    finally:
        h.close()


def test_shutdown_hands_back_runs_that_outlive_the_grace_period(tmp_path: Path, clock: ManualClock) -> None:
    h = Harness("sqlite", tmp_path, clock, shutdown_grace_s=0.2)
    release = threading.Event()
    started = threading.Event()
    try:

        @h.app.task(name="t.stuck", bind=True)
        def stuck(ctx: TaskContext) -> None:
            started.set()
            release.wait(10)

        handle = stuck.delay()
        h.dispatch()
        worker = h.worker()
        worker.run_once(h.clock.now_ms())
        assert started.wait(5)
        held = h.client.get(handle.job_id).current_run
        assert held is not None and held.state is RunState.RUNNING
        worker.shutdown()
        back = h.client.run(held.run_id)
        assert (back.state, back.attempt, back.fence, back.handbacks) == (RunState.SCHEDULED, 1, held.fence + 1, 1)
        assert back.last_error == "handed back: the worker shut down while it ran"
    finally:
        release.set()
        h.close()


def test_shutdown_ends_the_completer_at_once_however_long_its_idle_wait(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An idle completer waits on the worker's state; stopping must wake it, not leave it to sleep
    # out its wait (shutdown gives each thread 2 s, then leaves it running).
    monkeypatch.setattr(worker_daemon, "COMPLETER_IDLE_S", 60.0)

    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    noop.delay()
    worker = h.worker()
    h.cycle()
    [completer] = [t for t in worker._threads if t.name == "jobq-completer"]
    # A moment for the completer to reach its idle wait (were it not there yet, it would see the
    # stop anyway: the test would prove less, never fail wrongly).
    worker.state.wait(lambda: False, 0.05)
    worker.shutdown()
    assert not completer.is_alive()


class _Refused(Exception):
    retryable = False
    result = {"status": 400, "body": "bad request"}


class _Busy(Exception):
    retryable = True
    retry_after_s = 120.0
    result = {"status": 429, "body": ""}


def _webhook_job(h: Harness) -> str:
    from jobq.submission import JobSpec

    spec = JobSpec.model_validate(
        {
            "schedule_type": "IMMEDIATE",
            "target": {"type": "HTTP_WEBHOOK", "endpoint": "https://hooks.example/x"},
            "payload": {"n": 1},
        }
    )
    return h.client.submit(spec).job.job_id


def test_a_webhook_job_runs_through_the_worker_s_caller_with_its_job(h: Harness) -> None:
    calls: list[tuple[str, object, int]] = []

    def caller(job, ctx):  # type: ignore[no-untyped-def]
        calls.append((job.target.endpoint, job.payload, ctx.fence))
        return {"status": 200, "body": "ok"}

    job_id = _webhook_job(h)
    h.dispatch()
    h.work(h.worker(webhook=caller))
    run = h.client.get(job_id).current_run
    assert run is not None and (run.state, run.result) == (RunState.SUCCEEDED, {"status": 200, "body": "ok"})
    assert calls == [("https://hooks.example/x", {"n": 1}, run.fence)]


def test_an_exception_can_say_it_is_not_retryable_and_what_to_keep(h: Harness) -> None:
    def caller(job, ctx):  # type: ignore[no-untyped-def]
        raise _Refused("HTTP 400")

    job_id = _webhook_job(h)
    h.dispatch()
    h.work(h.worker(webhook=caller))
    run = h.client.get(job_id).current_run
    assert run is not None and (run.state, run.attempt, run.dead_letter) == (RunState.FAILED, 1, True)
    assert run.result == {"status": 400, "body": "bad request"}


def test_an_exception_s_retry_after_raises_the_backoff(h: Harness) -> None:
    def caller(job, ctx):  # type: ignore[no-untyped-def]
        raise _Busy("HTTP 429")

    job_id = _webhook_job(h)
    h.dispatch()
    now = h.clock.now_ms()
    h.work(h.worker(webhook=caller))
    run = h.client.get(job_id).current_run
    assert run is not None and (run.state, run.attempt) == (RunState.SCHEDULED, 2)
    assert run.due_ms >= now + 120_000


def test_a_context_flag_wakes_a_waiter_whether_set_before_or_during_the_wait() -> None:
    from jobq.tasks import Flag

    early = Flag()
    early.set()
    assert early.is_set() and early.wait(0) is True

    late = Flag()
    assert late.wait(0.01) is False  # nobody set it: the wait times out
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(late.wait(5)))
    waiter.start()
    late.set()
    waiter.join(5)
    assert woke == [True] and late.is_set()
    late.clear()
    assert not late.is_set() and late.wait(0.01) is False


def test_a_run_handed_back_by_every_shutdown_uses_an_attempt_after_the_third(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A deployment that keeps restarting cannot rerun a long task for ever: past MAX_HANDBACKS
    hand-backs without an attempt, a hand-back counts as a failed attempt (retried, then dead-lettered)."""
    from jobq.daemons.worker.attempt import MAX_HANDBACKS

    h = Harness("sqlite", tmp_path, clock, shutdown_grace_s=0.05)
    release = threading.Event()
    try:

        @h.app.task(name="t.long", retry=RetryPolicy(max_retries=1, initial_interval_sec=0))
        def long() -> None:
            release.wait(10)

        handle = long.delay()
        seen: list[tuple[RunState, int, int]] = []
        for _ in range(MAX_HANDBACKS + 2):
            h.advance(1)
            h.dispatch()
            worker = h.worker()
            assert worker.run_once(h.clock.now_ms()) == 1
            worker.shutdown()  # the task is still running: handed back
            run = h.client.get(handle.job_id).current_run
            assert run is not None
            seen.append((run.state, run.attempt, run.handbacks))
        assert seen[:MAX_HANDBACKS] == [(RunState.SCHEDULED, 1, n) for n in range(1, MAX_HANDBACKS + 1)]
        assert seen[MAX_HANDBACKS] == (RunState.SCHEDULED, 2, MAX_HANDBACKS + 1), "the fourth used an attempt"
        assert seen[MAX_HANDBACKS + 1][0] is RunState.FAILED, "and with no attempt left, it is dead-lettered"
        final = h.client.get(handle.job_id).current_run
        assert final is not None and final.last_error is not None and "HandedBack" in final.last_error
    finally:
        release.set()
        h.close()
