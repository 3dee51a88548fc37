"""Worker: consumes its queues in strict priority order and runs tasks under a fenced lease.

Per delivery: CAS to RUNNING with a 30 s lease (a lost CAS means the run moved on: drop the
message), run the task with a `TaskContext`, then write the outcome with a CAS on the fence and
lease owner, then ack. The writes batch without waiting for a batch to fill: the consumer starts
everything one consume returned in one `transition` call, and a completer thread writes every
outcome that has queued up (and acks their messages) in one call each, so a busy worker makes a
few store round trips per batch instead of three per run, and an idle one answers at once.

A monitor thread renews every lease in one batch each heartbeat and extends the messages'
visibility; a renewal that fails sets `ctx.lease_lost`, and the task's eventual outcome write is
rejected and counted (`jobq_fenced_writes_total`).

Prefetch never exceeds free slots, so a long LOW task never holds a CRITICAL message back.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jobq.codec import Envelope, UndecodableMessage, decode
from jobq.daemons.base import MAX_BACKOFF_S, Daemon, event
from jobq.ids import new_worker_id
from jobq.logs import run_fields
from jobq.metrics import METRICS
from jobq.models import WEBHOOK_TASK, Job, JobStatus, Run, RunState, Transition, WebhookTarget
from jobq.ports import Delivery, HealthCheck, IndexEntry
from jobq.retry import decide
from jobq.tasks import TaskContext, TaskDef, TaskRegistry, WebhookCaller
from jobq.wiring import Deployment

_STARTABLE = frozenset({RunState.CLAIMED, RunState.DISPATCHED})
_RUNNING = frozenset({RunState.RUNNING})
UNKNOWN_TASK_REDELIVERIES = 5  # other workers may serve it; after this many deliveries the run fails
RESULT_MAX_BYTES = 64 * 1024
_MONITOR_TICK_S = 0.5
_COMPLETE_BATCH = 500  # outcomes written in one store call at most
_COMPLETE_GATHER_S = 0.002
_REFILL_WAIT_S = 0.005  # how long a busy worker waits for half its slots before consuming
_WEBHOOK = TaskDef(WEBHOOK_TASK, lambda: None)  # a marker: resolved per run by `_webhook_task`


@dataclass
class _Active:
    run: Run
    ctx: TaskContext
    delivery: Delivery
    started_ms: int
    timeout_s: float | None
    beat_ms: int
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Worker(Daemon):
    name = "worker"

    def __init__(
        self,
        deployment: Deployment,
        registry: TaskRegistry,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        worker_id: str | None = None,
        webhook: WebhookCaller | None = None,
    ) -> None:
        super().__init__(deployment)
        self.registry = registry
        self.webhook = webhook
        self.queues = list(queues or self.settings.queues)
        self.concurrency = concurrency or self.settings.concurrency
        self.worker_id = worker_id or new_worker_id("worker")
        self.lease_ms = round(self.settings.lease_s * 1000)
        self.heartbeat_ms = round(self.settings.heartbeat_s * 1000)
        self.poll_s = 0.1
        self._refill_at = max(1, self.concurrency // 2)
        self._work: queue.Queue[_Started | None] = queue.Queue()
        self._done: queue.Queue[_Done | None] = queue.Queue()
        self._slots = threading.Condition()
        self._in_flight = 0  # deliveries taken and not yet finished
        self._active: dict[str, _Active] = {}
        self._active_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._start_lock = threading.Lock()
        self.completed = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Register the served task names and start the pool and the monitor (once)."""
        with self._start_lock:
            if not self._threads:
                self._start()

    def _start(self) -> None:
        self.store.register_worker(self.worker_id, sorted(self.registry.names()), self.queues, self.clock.now_ms())
        for n in range(self.concurrency):
            t = threading.Thread(target=self._pool_loop, name=f"jobq-task-{n}", daemon=True)
            t.start()
            self._threads.append(t)
        for target, name in ((self._monitor_loop, "jobq-monitor"), (self._completer_loop, "jobq-completer")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.log.info("worker %s serving %s with %d slots", self.worker_id, ",".join(self.queues), self.concurrency)

    def run_once(self, now_ms: int, wait_s: float = 0.0) -> int:
        """Take up to the free slots' worth of deliveries and hand them to the pool."""
        self.start()
        with self._slots:
            free = self.concurrency - self._in_flight
        if free <= 0:
            return 0
        deliveries = self.d.transport.consume(self.queues, free, wait_s)
        if deliveries:
            with self._slots:
                self._in_flight += len(deliveries)
            try:
                self._begin(deliveries)
            except BaseException:
                self._release(len(deliveries))
                self.d.transport.nack(deliveries)  # the store is failing: let the broker keep them
                raise
        return len(deliveries)

    def run_forever(self, stop: threading.Event) -> None:
        self.start()
        failures = 0
        while not stop.is_set():
            self.last_beat = time.monotonic()
            with self._slots:
                while self._in_flight >= self.concurrency and not stop.is_set():
                    self._slots.wait(0.2)
                    self.last_beat = time.monotonic()
                # A busy worker refills in batches: it waits a moment for half its slots to be
                # free rather than taking one delivery per finished task, since every consume and
                # every start batch costs about as much as a few dozen runs.
                refill_by = time.monotonic() + _REFILL_WAIT_S
                while self.concurrency - self._in_flight < self._refill_at and not stop.is_set():
                    left = refill_by - time.monotonic()
                    if left <= 0:
                        break
                    self._slots.wait(left)
            if stop.is_set():
                break
            try:
                self.run_once(self.clock.now_ms(), wait_s=self.poll_s)
                failures = 0
            except Exception:
                failures += 1
                METRICS.loop_errors.inc(daemon=self.name)
                self.log.exception("consume failed (%d in a row)", failures)
                stop.wait(min(MAX_BACKOFF_S, 0.25 * 2**failures))
        self.shutdown()

    def healthy(self, max_silence_s: float = 60.0) -> bool:
        """The loop is coming round and, when a slot is free, the transport still reaches the broker
        (a worker whose slots are all busy on long tasks consumes nothing and is still healthy)."""
        if not super().healthy(max_silence_s):
            return False
        with self._slots:
            busy = self._in_flight >= self.concurrency
        transport = self.d.transport
        return busy or not isinstance(transport, HealthCheck) or transport.health_check(max_silence_s)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Block until nothing is in flight (for tests and graceful shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._slots:
            while self._in_flight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._slots.wait(left)
        return True

    def shutdown(self) -> None:
        """Stop: wait up to `shutdown_grace_s` for running tasks, then hand the rest back (fence+1,
        SCHEDULED now, attempt not counted) so another worker runs them without waiting for a lease."""
        finished = self.wait_idle(self.settings.shutdown_grace_s)
        self._stopping.set()
        if not finished:
            with self._active_lock:
                left = [a for a in self._active.values() if not a.done]
            now = self.clock.now_ms()
            moves = [
                Transition(
                    a.run.run_id,
                    _RUNNING,
                    RunState.SCHEDULED,
                    a.ctx.fence,
                    {
                        "due_ms": now,
                        "lease_owner": None,
                        "lease_expires_ms": None,
                        "last_error": "handed back: worker shut down",
                    },
                    bump_fence=True,
                    expect_owner=self.worker_id,
                    at_ms=now,
                )
                for a in left
            ]
            back = [r for r in self.store.transition(moves) if r is not None]
            self.d.index.add([IndexEntry(r.run_id, r.due_ms, r.priority) for r in back])
            for a in left:
                a.ctx.lease_lost.set()
            self.d.transport.ack([a.delivery for a in left])
            self.log.warning("handed back %d unfinished runs", len(back))
        for _ in range(self.concurrency):
            self._work.put(None)
        self._done.put(None)  # the completer writes what is queued before it, then stops
        for thread in self._threads:
            if thread.name == "jobq-completer":
                thread.join(timeout=10)
        self.log.info("worker %s stopped after %d runs", self.worker_id, self.completed)

    # -- executing ------------------------------------------------------------------------------

    def _release(self, n: int) -> None:
        with self._slots:
            self._in_flight -= n
            self._slots.notify_all()

    def _begin(self, deliveries: Sequence[Delivery]) -> None:
        """Start every run one consume returned, in one store batch, and hand them to the pool."""
        now = self.clock.now_ms()
        wanted: list[tuple[Delivery, Envelope, TaskDef | None]] = []
        drop: list[Delivery] = []
        hand_on: list[Delivery] = []
        for delivery in deliveries:
            try:
                envelope = decode(delivery.body)
            except UndecodableMessage as exc:
                self.log.error("dropping undecodable message from %s: %s", delivery.queue, exc)
                drop.append(delivery)
                continue
            task = self.registry.get(envelope.task)
            if task is None and envelope.task == WEBHOOK_TASK and self.webhook is not None:
                task = _WEBHOOK
            if task is None and delivery.delivery_count < UNKNOWN_TASK_REDELIVERIES:
                hand_on.append(delivery)  # another worker may serve it
                continue
            wanted.append((delivery, envelope, task))
        starts = [
            Transition(
                envelope.run_id,
                _STARTABLE,
                RunState.RUNNING,
                envelope.fence,
                {
                    "lease_owner": self.worker_id,
                    "lease_expires_ms": now + self.lease_ms,
                    "last_heartbeat_ms": now,
                    "started_ms": now,
                },
                at_ms=now,
            )
            for _, envelope, _ in wanted
        ]
        started = self.store.transition(starts) if starts else []
        events = []
        ready: list[_Started] = []
        for (delivery, envelope, task), run in zip(wanted, started, strict=True):
            if run is None:
                METRICS.stale_deliveries.inc()
                drop.append(delivery)
                continue
            METRICS.start_lateness.observe(max(0, now - run.due_ms) / 1000, priority=run.priority.value)
            ctx = TaskContext(run.run_id, run.job_id, run.attempt, run.fence, envelope.task, self.worker_id)
            active = _Active(run, ctx, delivery, now, task.timeout_s if task else None, now)
            with self._active_lock:
                self._active[run.run_id] = active
            events.append(event(run, "STARTED", now, worker=self.worker_id))
            ready.append(_Started(delivery, envelope, run, task, active))
        if events:
            self.d.history.record(events)  # before the pool can record an outcome
        for item in ready:
            self._work.put(item)
        if hand_on:
            self.d.transport.nack(hand_on, delay_s=1.0)
        if drop:
            self.d.transport.ack(drop)
        if drop or hand_on:
            self._release(len(drop) + len(hand_on))

    def _pool_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            try:
                self._done.put(self._run(item))
            except Exception:
                # A bug here must not leak the slot; the run's lease will expire and the reaper
                # takes it back.
                self.log.exception("unexpected failure running a task", extra=run_fields(item.run))
                with self._active_lock:
                    self._active.pop(item.run.run_id, None)
                self._release(1)

    def _run(self, item: _Started) -> _Done:
        run, envelope, task = item.run, item.envelope, item.task
        job: Job | None = None
        if task is None:
            outcome = _Outcome(error=f"UnknownTask: no worker serves {envelope.task!r}", retryable=False)
            with self._active_lock:
                self._active.pop(run.run_id, None)
        else:
            if not envelope.payload_inline or task is _WEBHOOK:
                job = self.store.get_jobs([run.job_id]).get(run.job_id)
            payload = envelope.payload if envelope.payload_inline else (job.payload if job else None)
            if task is _WEBHOOK:
                task = self._webhook_task(job)
                payload = None
            if job is not None and task.timeout_s is None and job.timeout_s is not None:
                item.active.timeout_s = job.timeout_s
            outcome = self._execute(task, item.active, payload)
        now = self.clock.now_ms()
        if outcome.ok:
            kind = "SUCCEEDED"
            move = Transition(
                run.run_id,
                _RUNNING,
                RunState.SUCCEEDED,
                run.fence,
                {"result": _jsonable(outcome.result), "finished_ms": now, "lease_expires_ms": None, "last_error": None},
                expect_owner=self.worker_id,
                at_ms=now,
                job_status=JobStatus.COMPLETED if envelope.last else None,
            )
        else:
            job = job or self.store.get_jobs([run.job_id]).get(run.job_id)
            move, kind = self._failure(run, outcome, job, now)
        return _Done(item, move, kind, outcome, now - (run.started_ms or now))

    def _completer_loop(self) -> None:
        while True:
            first = self._done.get()
            if first is None:
                return
            batch = [first]
            stop = False
            # While other runs are still executing, outcomes that arrive within a moment of the
            # first share its store batch and ack; a lone outcome is written at once.
            gather_by = time.monotonic() + _COMPLETE_GATHER_S
            while len(batch) < _COMPLETE_BATCH:
                try:
                    left = gather_by - time.monotonic()
                    if left > 0 and self._in_flight > len(batch):
                        more = self._done.get(timeout=left)
                    else:
                        more = self._done.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            try:
                self._complete(batch)
            except Exception:
                # The outcomes could not be written: the runs keep their leases until the reaper
                # takes them back (a failed attempt), and the messages stay unacked.
                METRICS.loop_errors.inc(daemon="completer")
                self.log.exception("could not record %d outcomes", len(batch))
            finally:
                self.completed += len(batch)
                self._release(len(batch))
            if stop:
                return

    def _complete(self, batch: Sequence[_Done]) -> None:
        """Write every outcome in one store batch, then ack every message in one transport call."""
        written = self.store.transition([d.move for d in batch])
        reindex: list[IndexEntry] = []
        events = []
        for done, after in zip(batch, written, strict=True):
            run = done.item.run
            if after is None:
                METRICS.fenced_writes.inc(op="complete")
                self.log.warning("outcome rejected: the run moved on (fence or lease lost)", extra=run_fields(run))
                continue
            METRICS.completed.inc(outcome=done.kind)
            if after.state is RunState.SCHEDULED:
                reindex.append(IndexEntry(after.run_id, after.due_ms, after.priority))
            events.append(
                event(after, done.kind, after.updated_ms, worker=self.worker_id, duration_ms=done.duration_ms)
            )
            if done.kind == "SUCCEEDED":
                if self.log.isEnabledFor(logging.INFO):
                    self.log.info("succeeded", extra=self._fields(done))
            else:
                then = f"retry at attempt {after.attempt}" if done.kind == "RETRYING" else "dead-lettered"
                self.log.warning("failed: %s; %s", done.outcome.error, then, extra=self._fields(done))
        if reindex:
            self.d.index.add(reindex)
        if events:
            self.d.history.record(events)
        self.d.transport.ack([d.item.delivery for d in batch])

    def _webhook_task(self, job: Job | None) -> TaskDef:
        """The built-in task that calls the job's HTTP target (the caller reads target and payload)."""
        caller = self.webhook
        assert caller is not None

        def call(ctx: TaskContext) -> Any:
            if job is None:
                raise LookupError("the job no longer exists")
            return caller(job, ctx)

        timeout = job.target.timeout_seconds + 5 if job is not None and isinstance(job.target, WebhookTarget) else None
        return TaskDef(WEBHOOK_TASK, call, timeout_s=timeout, bind=True)

    def _execute(self, task: TaskDef, active: _Active, payload: Any) -> _Outcome:
        ctx = active.ctx
        args, kwargs = _arguments(payload)
        try:
            result = task.call(ctx, args, kwargs)
            return _Outcome(result=result)
        except Exception as exc:
            # An exception may say how it should be treated (webhook responses do): whether it is
            # retryable, how long the server asked us to wait, and what to keep on the run.
            retryable = getattr(exc, "retryable", None)
            retry_after = getattr(exc, "retry_after_s", None)
            return _Outcome(
                result=getattr(exc, "result", None),
                exc=exc,
                error=f"{type(exc).__name__}: {exc}"[:2000],
                retryable=retryable if isinstance(retryable, bool) else None,
                retry_after_s=retry_after if isinstance(retry_after, int | float) else None,
            )
        finally:
            with active.lock:
                active.done = True
            with self._active_lock:
                self._active.pop(active.run.run_id, None)

    @staticmethod
    def _fields(done: _Done) -> dict[str, Any]:
        return run_fields(done.item.run, task=done.item.envelope.task, duration_ms=done.duration_ms)

    def _failure(self, run: Run, outcome: _Outcome, job: Job | None, now: int) -> tuple[Transition, str]:
        error = outcome.error or "failed"
        if job is None:
            retry, delay_s, reason = False, 0.0, f"{error} (job no longer exists)"
        else:
            verdict = decide(
                job.retry,
                run.attempt,
                outcome.exc if outcome.exc is not None else error,
                age_s=(now - run.nominal_ms) / 1000,
                retryable=outcome.retryable,
                retry_after_s=outcome.retry_after_s,
            )
            retry, delay_s, reason = verdict.retry, verdict.delay_s, verdict.reason
        cleared = {
            "lease_owner": None,
            "lease_expires_ms": None,
            "last_error": reason[:2000],
            "result": _jsonable(outcome.result),
        }
        if retry:
            changes = {
                **cleared,
                "attempt": run.attempt + 1,
                "due_ms": now + round(delay_s * 1000),
                "deadline_ms": None,
            }
            move = Transition(
                run.run_id, _RUNNING, RunState.SCHEDULED, run.fence, changes, expect_owner=self.worker_id, at_ms=now
            )
            return move, "RETRYING"
        finish = JobStatus.COMPLETED if job is not None and not job.recurring else None
        changes = {**cleared, "dead_letter": True, "finished_ms": now}
        move = Transition(
            run.run_id,
            _RUNNING,
            RunState.FAILED,
            run.fence,
            changes,
            expect_owner=self.worker_id,
            at_ms=now,
            job_status=finish,
        )
        return move, "FAILED"

    # -- heartbeats and timeouts ----------------------------------------------------------------

    def _monitor_loop(self) -> None:
        while not self._stopping.wait(_MONITOR_TICK_S):
            try:
                self.monitor_once(self.clock.now_ms())
            except Exception:
                METRICS.loop_errors.inc(daemon="monitor")
                self.log.exception("heartbeat pass failed")

    def monitor_once(self, now_ms: int) -> None:
        """Renew due leases in one batch, extend their messages, and time out overdue tasks."""
        with self._active_lock:
            active = [a for a in self._active.values() if not a.done]
        overdue = [a for a in active if a.timeout_s is not None and now_ms - a.started_ms > a.timeout_s * 1000]
        beating = [a for a in active if a not in overdue and now_ms - a.beat_ms >= self.heartbeat_ms]
        if beating:
            renewals = self.store.transition(
                [
                    Transition(
                        a.run.run_id,
                        _RUNNING,
                        RunState.RUNNING,
                        a.ctx.fence,
                        {"lease_expires_ms": now_ms + self.lease_ms, "last_heartbeat_ms": now_ms},
                        expect_owner=self.worker_id,
                        at_ms=now_ms,
                    )
                    for a in beating
                ]
            )
            lost = [a for a, r in zip(beating, renewals, strict=True) if r is None]
            for a in beating:
                a.beat_ms = now_ms
            kept = [a.delivery for a, r in zip(beating, renewals, strict=True) if r is not None]
            if kept:
                self.d.transport.extend(kept, self.settings.visibility_timeout_s)
            if lost:
                current = self.store.get_runs([a.run.run_id for a in lost])
                for a in lost:
                    METRICS.fenced_writes.inc(op="heartbeat")
                    a.ctx.lease_lost.set()
                    now_run = current.get(a.run.run_id)
                    if now_run is not None and now_run.state is RunState.CANCELLED:
                        a.ctx.cancelled.set()
                    self.log.warning("lease lost; the task should stop", extra=run_fields(a.run))
        for a in overdue:
            self._time_out(a, now_ms)

    def _time_out(self, active: _Active, now_ms: int) -> None:
        """The task ran past its timeout: its attempt fails now (fence+1, so whatever it writes later
        is rejected) and `lease_lost` asks it to stop; threads cannot be killed."""
        with active.lock:
            if active.done:
                return
            active.done = True
        active.ctx.lease_lost.set()
        job = self.store.get_jobs([active.run.job_id]).get(active.run.job_id)
        error = f"TaskTimeout: exceeded timeout of {active.timeout_s:g} s"
        move, kind = self._failure(active.run, _Outcome(error=error), job, now_ms)
        bumped = Transition(
            move.run_id,
            move.expect,
            move.to_state,
            move.expect_fence,
            move.changes,
            bump_fence=True,
            expect_owner=move.expect_owner,
            at_ms=move.at_ms,
            job_status=move.job_status,
        )
        [written] = self.store.transition([bumped])
        if written is not None:
            METRICS.completed.inc(outcome="TIMEOUT")
            if written.state is RunState.SCHEDULED:
                self.d.index.add([IndexEntry(written.run_id, written.due_ms, written.priority)])
            self.d.history.record([event(written, kind, now_ms, worker=self.worker_id)])
            self.log.warning(error, extra=run_fields(written))


@dataclass
class _Started:
    """A run the store moved to RUNNING for this worker, on its way to a pool thread."""

    delivery: Delivery
    envelope: Envelope
    run: Run
    task: TaskDef | None  # None: nobody serves it (after enough redeliveries): it fails
    active: _Active


@dataclass
class _Done:
    """A finished attempt on its way to the completer: the outcome write and what to log."""

    item: _Started
    move: Transition
    kind: str
    outcome: _Outcome
    duration_ms: int


@dataclass
class _Outcome:
    result: Any = None
    exc: BaseException | None = None
    error: str | None = None
    retryable: bool | None = None
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    if payload is None:
        return [], {}
    if isinstance(payload, dict) and set(payload) <= {"args", "kwargs"}:
        return list(payload.get("args", [])), dict(payload.get("kwargs", {}))
    return [payload], {}


def _jsonable(value: Any) -> Any:
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return {"repr": repr(value)[:1000]}
    return value if len(text) <= RESULT_MAX_BYTES else {"truncated": True, "size": len(text)}
