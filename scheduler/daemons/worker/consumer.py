"""The consumer: takes deliveries in strict priority order, never more than the free slots, and
starts their runs in one store batch.

Per batch: decode the envelopes, read their jobs (one batch read, before anything starts, so a
store error costs no attempt), end the runs whose job was cancelled or paused meanwhile, and
move the rest to RUNNING under this worker's lease (a compare-and-set on the envelope's fence:
a lost one means the run moved on and the message is dropped). Only what the start wrote is
handed to the pool. Once runs have started, a broker error acking or returning the other
deliveries is logged, never raised: those messages come back after their visibility timeout
and fail the start compare-and-set then.

A delivery handed over ahead of its due time (the scanner's look-ahead: the envelope carries
`not_before_ms`) is held here, decoded but not started, with a slot reserved for it, and goes
through the same start batch once its time has come (`start_due`); its job is read a moment
before (`PREPARE_AHEAD_MS`), so at the due time only the start write remains. Its run stays DISPATCHED
under the scanner's schedule-to-start lease meanwhile, so a cancel or pause (which fence it off)
wins over the held delivery, and a worker that dies holding it leaves it to the reaper.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobq.codec import Envelope, UndecodableMessage, decode
from jobq.daemons.base import event
from jobq.daemons.quarantine import CORRUPT, needs_quarantine, quarantine_reason
from jobq.daemons.worker.attempt import STARTABLE, Attempt, Outcome, hand_back, renewal
from jobq.daemons.worker.execution import webhook_task
from jobq.daemons.worker.pools import Done, Pool
from jobq.daemons.worker.state import WorkerState
from jobq.deployment import Deployment
from jobq.metrics import METRICS
from jobq.models import PAUSED, PAUSED_RECHECK_MS, WEBHOOK_TASK, Job, JobStatus, Run, RunState, Transition
from jobq.ports import Delivery, IndexEntry
from jobq.tasks import TaskContext, TaskDef, TaskRegistry, WebhookCaller

PREPARE_AHEAD_MS = 25  # a held delivery's job is read this long before its not-before time
UNKNOWN_TASK_HANDOFFS = 5  # other workers may serve it; after this many hand-ons the run fails
HAND_ON_DELAY_MS = 1_000


@dataclass
class _Wanted:
    delivery: Delivery
    envelope: Envelope
    task: TaskDef | None  # None: nobody serves it (after enough redeliveries): it fails at once


@dataclass
class _Doubtful:
    """A start batch whose write raised, and whose outcome could not be read back yet."""

    wanted: list[_Wanted]
    moves: list[Transition]
    jobs: dict[str, Job]
    now: int


class Consumer:
    def __init__(
        self,
        deployment: Deployment,
        state: WorkerState,
        pool: Pool,
        registry: TaskRegistry,
        *,
        worker_id: str,
        queues: Sequence[str],
        lease_ms: int,
        webhook: WebhookCaller | None,
        on_done: Done,
    ) -> None:
        self.d = deployment
        self.state = state
        self.pool = pool
        self.registry = registry
        self.worker_id = worker_id
        self.queues = list(queues)
        self.lease_ms = lease_ms
        self.webhook = webhook
        self.on_done = on_done
        self.log = logging.getLogger("jobq.worker")
        self._doubtful: list[_Doubtful] = []
        self.waiting: list[_Wanted] = []  # held until their not-before time, earliest first
        self.prepared: dict[str, Job | None] = {}  # run id -> its job, read ahead for held deliveries

    def take(self, wait_s: float = 0.0) -> int:
        """Start the held deliveries whose time has come, then consume up to the free slots' worth
        of deliveries (waiting no longer than until the next held one is due) and start or hold
        them; the number of deliveries taken and held ones started. Nothing while the outcome of
        an earlier start batch is unknown and the store still does not answer."""
        if self._doubtful and not self._resolve():
            return 0  # the store is still away: nothing new could start either
        done = self.start_due()
        self.prepare_due()
        free = self.state.free()
        if free <= 0:
            return done
        upcoming = self.next_due_ms()
        if upcoming is not None:
            wait_s = min(wait_s, max(0.0, (upcoming - self.d.clock.now_ms()) / 1000))
        deliveries = self.d.transport.consume(self.queues, free, wait_s)
        if deliveries:
            self.begin(deliveries)
        return done + len(deliveries) + self.start_due()

    def next_due_ms(self) -> int | None:
        """When the loop must come round next for the held deliveries: the earliest one's
        not-before time, or `PREPARE_AHEAD_MS` before it while its job is still to be read; None
        when none is held."""
        if not self.waiting:
            return None
        first = self.waiting[0]
        due = first.envelope.not_before_ms or 0
        return due if first.envelope.run_id in self.prepared else due - PREPARE_AHEAD_MS

    def prepare_due(self) -> int:
        """Read the jobs of the held deliveries due within `PREPARE_AHEAD_MS` (one batch read), so
        their start at the due time is the start write alone. A job read early is safe: a cancel
        or pause in between fences the run off, and the start write fails. How many were read."""
        if not self.waiting:
            return 0
        soon = self.d.clock.now_ms() + PREPARE_AHEAD_MS
        todo = [
            w
            for w in self.waiting
            if (w.envelope.not_before_ms or 0) <= soon and w.envelope.run_id not in self.prepared
        ]
        if not todo:
            return 0
        jobs = self._jobs(todo)
        for w in todo:
            self.prepared[w.envelope.run_id] = jobs.get(w.envelope.run_id)
        return len(todo)

    def start_due(self) -> int:
        """Start the held deliveries whose not-before time has come (one start batch); how many.
        Raises like `begin` (the deliveries are then returned to the broker)."""
        if not self.waiting:
            return 0
        now = self.d.clock.now_ms()
        due = [w for w in self.waiting if (w.envelope.not_before_ms or 0) <= now]
        if not due:
            return 0
        self.waiting = self.waiting[len(due) :]
        self.state.unreserve(len(due))
        jobs = None
        if all(w.envelope.run_id in self.prepared for w in due):
            jobs = {w.envelope.run_id: job for w in due if (job := self.prepared[w.envelope.run_id]) is not None}
        for w in due:
            self.prepared.pop(w.envelope.run_id, None)
        self._begin(due, [], [], jobs)
        return len(due)

    def return_held(self) -> int:
        """Hand every held delivery back to the broker (shutdown): visible again at once, for
        another worker; how many."""
        held, self.waiting = self.waiting, []
        self.prepared.clear()
        if held:
            self.state.unreserve(len(held))
            self._settle(ack=[], nack=[w.delivery for w in held])
        return len(held)

    def begin(self, deliveries: Sequence[Delivery]) -> list[Attempt]:
        """Start the runs of `deliveries` and hand them to the pool (holding those handed over
        ahead of their not-before time); returns the attempts started. Raises only before
        anything started (the deliveries are then returned to the broker)."""
        wanted, drop, unserved = self._sort(deliveries)
        now = self.d.clock.now_ms()
        early = [w for w in wanted if w.envelope.not_before_ms is not None and w.envelope.not_before_ms > now]
        if early:
            self._hold(early)
            wanted = [w for w in wanted if w not in early]
        return self._begin(wanted, drop, unserved)

    def _hold(self, early: list[_Wanted]) -> None:
        self.state.reserve(len(early))
        self.waiting = sorted(self.waiting + early, key=lambda w: w.envelope.not_before_ms or 0)

    def _begin(
        self,
        wanted: list[_Wanted],
        drop: list[Delivery],
        unserved: list[_Wanted],
        jobs: dict[str, Job] | None = None,
    ) -> list[Attempt]:
        retry_later: list[Delivery] = []
        if unserved:
            try:
                failing, handed = self._hand_on(unserved)
                wanted += failing
                drop += handed
            except Exception:
                self.log.exception("could not hand on %d runs of tasks this worker does not serve", len(unserved))
                retry_later = [w.delivery for w in unserved]
        attempts: list[Attempt] = []
        if wanted:
            try:
                attempts, ended, again = self._start(wanted, jobs if not unserved else None)
            except Exception:
                self._settle(ack=drop, nack=[w.delivery for w in wanted] + retry_later)
                raise
            drop += ended
            retry_later += again
        return self._launch(attempts, drop, retry_later)

    def _launch(self, attempts: list[Attempt], drop: list[Delivery], retry_later: list[Delivery]) -> list[Attempt]:
        """Settle the deliveries that will not run here, and hand the started attempts to the pool."""
        if attempts:
            attempts, refused = self._fresh(attempts)
            drop += refused
        self._settle(ack=drop, nack=retry_later, delay_s=1.0)
        for attempt in attempts:
            if attempt.task is _UNSERVED:
                error = f"UnknownTask: no worker that took it serves {attempt.envelope.task!r}"
                self.on_done(attempt.key, Outcome(error=error, retryable=False))
            else:
                self.pool.submit(attempt, self.on_done)
        return attempts

    # -- steps ----------------------------------------------------------------------------------

    def _sort(self, deliveries: Sequence[Delivery]) -> tuple[list[_Wanted], list[Delivery], list[_Wanted]]:
        """Decoded deliveries this worker can run, those to drop, and those of tasks it does not serve."""
        wanted: list[_Wanted] = []
        drop: list[Delivery] = []
        unserved: list[_Wanted] = []
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
            (wanted if task is not None else unserved).append(_Wanted(delivery, envelope, task))
        return wanted, drop, unserved

    def _hand_on(self, unserved: list[_Wanted]) -> tuple[list[_Wanted], list[Delivery]]:
        """Runs of tasks this worker does not serve go back to the scanner for another worker
        (fence+1, due in a second, the hand-back counted on the run, the message dropped). The count
        lives in the store, not in the broker's delivery count, which RabbitMQ does not keep: after
        `UNKNOWN_TASK_HANDOFFS` the run is started here and fails with UnknownTask. Returns those to
        start and fail, and the deliveries to drop."""
        now = self.d.clock.now_ms()
        runs = self.d.store.get_runs([w.envelope.run_id for w in unserved])
        failing: list[_Wanted] = []
        moves: list[Transition] = []
        movers: list[_Wanted] = []
        for w in unserved:
            run = runs.get(w.envelope.run_id)
            if run is None or run.fence != w.envelope.fence:
                continue  # a stale message: dropped
            if run.handbacks + 1 >= UNKNOWN_TASK_HANDOFFS:
                failing.append(w)
                continue
            moves.append(
                Transition(
                    run.run_id,
                    STARTABLE,
                    RunState.SCHEDULED,
                    run.fence,
                    {
                        "due_ms": now + HAND_ON_DELAY_MS,
                        "lease_owner": None,
                        "lease_expires_ms": None,
                        "handbacks": run.handbacks + 1,
                        "last_error": f"handed on: worker {self.worker_id} does not serve {w.envelope.task!r}",
                    },
                    bump_fence=True,
                    at_ms=now,
                )
            )
            movers.append(w)
        moved = self.d.store.transition(moves) if moves else []
        back = [IndexEntry(r.run_id, r.due_ms, r.priority) for r in moved if r is not None]
        if back:
            self.d.index.add(back)
        failing_ids = {id(w) for w in failing}
        return failing, [w.delivery for w in unserved if id(w) not in failing_ids]

    def _start(
        self, wanted: list[_Wanted], jobs: dict[str, Job] | None = None
    ) -> tuple[list[Attempt], list[Delivery], list[Delivery]]:
        """One job read and one transition batch: starts, and the ends of runs whose job is gone,
        cancelled or paused. Returns the attempts started, the deliveries to drop, and those to
        return to the broker (their write did not apply because the batch failed, not because
        the run moved on). `jobs`, when given, are the jobs read ahead (`prepare_due`)."""
        if jobs is None:
            jobs = self._jobs(wanted)
        now = self.d.clock.now_ms()
        moves: list[Transition] = []
        for w in wanted:
            moves.append(self._start_or_end(w.envelope, jobs.get(w.envelope.run_id), now))
        try:
            results = self.d.store.transition(moves)
        except Exception:
            try:
                results = self._confirm(moves, now)  # a start may have applied before the error
            except Exception:
                self._doubtful.append(_Doubtful(wanted, moves, jobs, now))
                self.log.warning(
                    "a start batch of %d raised and the store is away: its messages wait until it answers",
                    len(moves),
                )
                return [], [], []
            return self._started(wanted, moves, results, jobs, now, failed=True)
        return self._started(wanted, moves, results, jobs, now, failed=False)

    def _resolve(self) -> bool:
        """Settle the start batches whose write raised and whose outcome could not be read back
        then (the store went away mid-commit): read them now. A start that applied holds its run
        under this worker's lease, so giving up on it (returning its message) would leave the run
        neither executed nor renewed until its lease ran out and cost an attempt; until the store
        answers, the messages stay here. Returns whether none is left."""
        while self._doubtful:
            batch = self._doubtful[0]
            try:
                results = self._confirm(batch.moves, batch.now)
            except Exception as exc:
                self.log.debug("the outcome of a start batch is still unknown: %s", exc)
                return False
            self._doubtful.pop(0)
            self._launch(*self._started(batch.wanted, batch.moves, results, batch.jobs, batch.now, failed=True))
        return True

    def _started(
        self,
        wanted: list[_Wanted],
        moves: list[Transition],
        results: Sequence[Run | None],
        jobs: dict[str, Job],
        now: int,
        *,
        failed: bool,
    ) -> tuple[list[Attempt], list[Delivery], list[Delivery]]:
        """The attempts a start batch began, the deliveries to drop, and those to return (`failed`:
        the batch raised, so a write that did not apply left its run where it was)."""
        attempts: list[Attempt] = []
        ended: list[Delivery] = []
        again: list[Delivery] = []
        events = []
        held: list[IndexEntry] = []
        lateness: dict[str, list[float]] = {}  # start lateness in seconds, by priority
        earliest_due = now  # of the runs started: the batch's largest lateness is now minus it
        for w, move, run in zip(wanted, moves, results, strict=True):
            if run is None and failed:
                again.append(w.delivery)  # not applied: the run is where it was, and its message must stay
                continue
            if run is None or move.to_state is not RunState.RUNNING:
                if run is None:
                    METRICS.stale_deliveries.inc()
                elif run.state is RunState.SCHEDULED:
                    held.append(IndexEntry(run.run_id, run.due_ms, run.priority))
                ended.append(w.delivery)
                continue
            job = jobs.get(run.run_id)
            attempts.append(self._attempt(w, run, job, now))
            lateness.setdefault(run.priority.value, []).append(max(0, now - run.due_ms) / 1000)
            earliest_due = min(earliest_due, run.due_ms)
            events.append(event(run, "STARTED", now, worker=self.worker_id))
        for priority, values in lateness.items():  # one observation call per tier and batch, not per run
            METRICS.start_lateness.observe_many(values, priority=priority)
        if attempts:
            self.state.note_lateness(now - earliest_due)
        self.state.add(attempts)
        if events:
            self.d.history.record(events)  # before the pool can record an outcome
        if held:
            try:
                self.d.index.add(held)
            except Exception:  # beat's repair re-indexes it when it is overdue
                self.log.exception("could not index %d runs held for their paused job", len(held))
        return attempts, ended, again

    def _jobs(self, wanted: list[_Wanted]) -> dict[str, Job]:
        """The job of each message, by run id: one read by the envelopes' job keys. Jobs are never
        deleted, so a job not found there is a message of the previous version, which named no
        tenant: its run's row does (read only for those)."""
        jobs = self.d.store.get_jobs(list({w.envelope.job_key for w in wanted}))
        found = {w.envelope.run_id: jobs[w.envelope.job_key] for w in wanted if w.envelope.job_key in jobs}
        lost = [w.envelope.run_id for w in wanted if w.envelope.run_id not in found]
        if lost:
            runs = self.d.store.get_runs(lost)
            more = self.d.store.get_jobs(list({r.job_key for r in runs.values()}))
            found.update({r.run_id: more[r.job_key] for r in runs.values() if r.job_key in more})
        return found

    def _fresh(self, attempts: list[Attempt]) -> tuple[list[Attempt], list[Delivery]]:
        """Only runs with most of their lease left start executing. A start whose store call hung
        for a third of a lease or more may have left a lease that is running out, or already ran
        out and was taken back: those renew first (one batch); a refused renewal means the run
        moved on (the message is dropped), and one that fails or hangs again hands the run back.
        Returns the attempts to execute and the deliveries to drop."""
        now = self.d.clock.now_ms()
        limit = self.lease_ms // 3
        late = [a for a in attempts if now - a.started_ms >= limit]
        if not late:
            return attempts, []
        try:
            renewed: list[Run | None] | None = self.d.store.transition(
                [renewal(a.run, self.worker_id, now, self.lease_ms) for a in late]
            )
        except Exception:
            renewed = None
        slow = self.d.clock.now_ms() - now >= limit
        gone: list[Attempt] = []
        for i, attempt in enumerate(late):
            if renewed is not None and renewed[i] is not None and not slow:
                attempt.beat_ms = now
            elif renewed is not None and renewed[i] is None:
                gone.append(attempt)
            else:
                why = "its start took a third of a lease"
                move, kind = hand_back(attempt.run, attempt.job, self.worker_id, now, why)
                self.state.finish(attempt.key, _deciding(move, kind, now))
        if gone:
            METRICS.fenced_writes.inc(len(gone), op="heartbeat")
            self.state.release(gone)
        fresh = [a for a in attempts if a not in gone and a.move is None]
        self.log.warning("%d starts took a third of a lease or more; %d of them start now", len(late), len(fresh))
        return fresh, [a.delivery for a in gone]

    def _start_or_end(self, envelope: Envelope, job: Job | None, now: int) -> Transition:
        """The start write, or (its job gone, cancelled or paused since dispatch) the write that
        ends or holds the run instead. Every one is fenced: a late copy of the message fails it."""
        status = None if job is None else job.status
        if job is not None and needs_quarantine(job):
            # Its job's record stopped decoding (or was quarantined) since dispatch: like the
            # scanner, dead-letter the run rather than run a task with arguments nobody can trust.
            return Transition(
                envelope.run_id,
                STARTABLE,
                RunState.FAILED,
                envelope.fence,
                {
                    "last_error": f"{CORRUPT}{quarantine_reason(job)}"[:2000],
                    "dead_letter": True,
                    "finished_ms": now,
                    "lease_owner": None,
                    "lease_expires_ms": None,
                },
                bump_fence=True,
                at_ms=now,
            )
        if status is None or status is JobStatus.CANCELLED:
            return Transition(
                envelope.run_id,
                STARTABLE,
                RunState.CANCELLED,
                envelope.fence,
                {
                    "last_error": "its job was cancelled",
                    "finished_ms": now,
                    "lease_owner": None,
                    "lease_expires_ms": None,
                },
                bump_fence=True,
                at_ms=now,
            )
        if status is JobStatus.PAUSED:
            return Transition(
                envelope.run_id,
                STARTABLE,
                RunState.SCHEDULED,
                envelope.fence,
                {
                    "due_ms": now + PAUSED_RECHECK_MS,
                    "lease_owner": None,
                    "lease_expires_ms": None,
                    "blocked_by": PAUSED,
                },
                bump_fence=True,
                at_ms=now,
            )
        return Transition(
            envelope.run_id,
            STARTABLE,
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

    def _confirm(self, moves: Sequence[Transition], now: int) -> list[Run | None]:
        """After a start batch raised: which of its writes applied all the same. A start that did
        holds the run under this worker's lease and is kept; the others did not happen."""
        current = self.d.store.get_runs([m.run_id for m in moves])
        confirmed: list[Run | None] = []
        for move in moves:
            run = current.get(move.run_id)
            applied = (
                run is not None
                and run.state is move.to_state
                and run.updated_ms == now
                and run.fence == (move.expect_fence or 0) + (1 if move.bump_fence else 0)
                and (move.to_state is not RunState.RUNNING or run.lease_owner == self.worker_id)
            )
            confirmed.append(run if applied else None)
        self.log.warning(
            "a start batch raised; %d of %d writes had applied", sum(1 for r in confirmed if r), len(moves)
        )
        return confirmed

    def _attempt(self, w: _Wanted, run: Run, job: Job | None, now: int) -> Attempt:
        task = w.task
        is_webhook = task is _WEBHOOK
        if is_webhook and self.webhook is not None and job is not None:
            task = webhook_task(self.webhook, job)
        timeout_s = None
        if task is not None:
            timeout_s = task.timeout_s if task.timeout_s is not None else (job.timeout_s if job else None)
        settings = self.d.settings
        if timeout_s is None:
            timeout_s = settings.time_limit_s
        soft_s = settings.soft_time_limit_s
        if soft_s is not None and timeout_s is not None and soft_s >= timeout_s:
            soft_s = None  # a task's own hard limit comes first: no time is left to clean up
        payload = w.envelope.payload if w.envelope.payload_inline else (job.payload if job else None)
        ctx = TaskContext(run.run_id, run.job_id, run.attempt, run.fence, w.envelope.task, self.worker_id)
        ctx.tenant_id = run.tenant_id
        ctx.tier = run.priority.queue
        ctx.lateness_ms = max(0, now - run.due_ms)
        ctx.trace = w.envelope.trace or run.trace
        return Attempt(
            run=run,
            job=job,
            envelope=w.envelope,
            delivery=w.delivery,
            task=task or _UNSERVED,
            payload=None if is_webhook else payload,
            ctx=ctx,
            started_ms=now,
            timeout_s=timeout_s,
            beat_ms=now,
            soft_timeout_s=soft_s,
        )

    def _settle(self, *, ack: Sequence[Delivery], nack: Sequence[Delivery], delay_s: float = 0.0) -> None:
        """Drop or return deliveries that will not run here. A broker error is logged, not raised:
        the messages come back after their visibility timeout and are settled then."""
        try:
            if nack:
                self.d.transport.nack(nack, delay_s=delay_s)
            if ack:
                self.d.transport.ack(ack)
        except Exception:
            METRICS.loop_errors.inc(daemon="worker")
            self.log.exception(
                "could not settle %d deliveries; they come back after their visibility timeout", len(ack) + len(nack)
            )


_UNSERVED = TaskDef("jobq.unserved", lambda: None)  # a marker: the run fails as UnknownTask
_WEBHOOK = TaskDef(WEBHOOK_TASK, lambda: None)  # a marker: resolved per run by `webhook_task`


def _deciding(move: Transition, kind: str, now_ms: int) -> Callable[[Attempt], None]:
    def decide(attempt: Attempt) -> None:
        attempt.decide(move, kind, None, now_ms)

    return decide
