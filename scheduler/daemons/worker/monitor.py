"""The lease monitor: renews the lease of every attempt this worker holds, running or completing,
and applies time limits.

A renewal is a compare-and-set on (RUNNING, fence, lease owner); one that fails means the run was
taken back (the reaper, a cancel, an overlap policy): the task's `ctx.lease_lost` is set, and
`ctx.cancelled` too when the run was cancelled, so it can stop; its outcome will be refused.
Renewals go in one batch per heartbeat, and the messages' visibility is extended with them.

An attempt past its hard time limit is given up: the pool stops it if it can (else its slot is
counted lost until it returns), and its attempt fails as `TaskTimeout` with fence+1, so any late
write of the execution is refused. That write goes through the completer like any outcome.
"""

from __future__ import annotations

import logging
import threading

from jobq.daemons.worker.attempt import Attempt, Outcome, Phase, failure, renewal
from jobq.daemons.worker.broker import BrokerLane
from jobq.daemons.worker.pools import Pool
from jobq.daemons.worker.state import WorkerState
from jobq.deployment import Deployment
from jobq.logs import run_fields
from jobq.metrics import METRICS
from jobq.models import RunState


class LeaseMonitor:
    def __init__(
        self,
        deployment: Deployment,
        state: WorkerState,
        pool: Pool,
        lane: BrokerLane,
        *,
        worker_id: str,
        lease_ms: int,
        heartbeat_ms: int,
    ) -> None:
        self.d = deployment
        self.state = state
        self.pool = pool
        self.lane = lane
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.heartbeat_ms = heartbeat_ms
        self.log = logging.getLogger("jobq.worker")
        self._pass = threading.Lock()

    def check(self, now_ms: int) -> None:
        """Apply time limits, then renew the leases that are due (one store batch)."""
        with self._pass:
            self._check(now_ms)

    def _check(self, now_ms: int) -> None:
        held = self.state.snapshot()
        for attempt in held:
            if self._overdue(attempt, now_ms):
                self.time_out(attempt, now_ms)
            elif self._soft_overdue(attempt, now_ms):
                attempt.interrupted = True
                interrupted = self.pool.interrupt(attempt)
                self.log.warning(
                    "soft time limit of %g s passed: %s",
                    attempt.soft_timeout_s,
                    "SoftTimeLimitExceeded raised in the task" if interrupted else "this pool cannot interrupt it",
                    extra=run_fields(attempt.run),
                )
        beating = [a for a in held if not a.abandoned and now_ms - a.beat_ms >= self.heartbeat_ms]
        if beating:
            self._renew(beating, now_ms)

    @staticmethod
    def _overdue(attempt: Attempt, now_ms: int) -> bool:
        return (
            attempt.phase is Phase.EXECUTING
            and attempt.timeout_s is not None
            and now_ms - attempt.started_ms > attempt.timeout_s * 1000
        )

    @staticmethod
    def _soft_overdue(attempt: Attempt, now_ms: int) -> bool:
        return (
            attempt.phase is Phase.EXECUTING
            and not attempt.interrupted
            and attempt.soft_timeout_s is not None
            and now_ms - attempt.started_ms > attempt.soft_timeout_s * 1000
        )

    def _renew(self, beating: list[Attempt], now_ms: int) -> None:
        renewals = self.d.store.transition([renewal(a.run, self.worker_id, now_ms, self.lease_ms) for a in beating])
        kept = [a for a, r in zip(beating, renewals, strict=True) if r is not None]
        lost = [a for a, r in zip(beating, renewals, strict=True) if r is None]
        for a in kept:
            a.beat_ms = now_ms
        if kept:
            self.lane.extend([a.delivery for a in kept], self.d.settings.visibility_timeout_s)
        if lost:
            self._lost(lost)

    def _lost(self, lost: list[Attempt]) -> None:
        current = self.d.store.get_runs([a.run.run_id for a in lost])
        for a in lost:
            a.beat_ms = 2**62  # no more renewals: the run is someone else's (or its outcome is written)
            now = current.get(a.run.run_id)
            if a.phase is Phase.COMPLETING:
                continue  # the completer finds out whether its write applied or is refused
            METRICS.fenced_writes.inc(op="heartbeat")
            if now is not None and now.state is RunState.CANCELLED:
                a.ctx.cancelled.set()
            a.ctx.lease_lost.set()
            self.log.warning("lease lost; the task should stop", extra=run_fields(a.run))

    def time_out(self, attempt: Attempt, now_ms: int) -> None:
        """The attempt ran past its hard time limit: give it up (fence+1, TaskTimeout)."""
        error = f"TaskTimeout: exceeded the time limit of {attempt.timeout_s:g} s"

        def decide(a: Attempt) -> None:
            move, kind = failure(a.run, a.job, Outcome(error=error), self.worker_id, now_ms, bump_fence=True)
            a.decide(move, kind, error, now_ms)

        if not self.state.give_up(attempt, decide):
            return  # it finished meanwhile
        attempt.ctx.lease_lost.set()
        if self.pool.stop(attempt):
            self.state.recover(attempt.key)
        self.log.warning(error, extra=run_fields(attempt.run))
