"""Reaper: takes back runs whose lease ran out, with fence+1 so the old holder's writes fail.

A CLAIMED or DISPATCHED run goes back to SCHEDULED as it was (it never started). An expired
RUNNING lease means the worker died or hung: it counts as a failed attempt, retried with
backoff or dead-lettered. The compare-and-set names the version it read, so a heartbeat that
renews the lease in the meantime wins. A run whose record does not decode, or whose job's does
not, is dead-lettered as Corrupt instead (`jobq.daemons.quarantine`).

Once a minute the reaper also clears the results that outlived `result_ttl_s` (reads already
treat them as expired by time; this frees the space), a batch per pass until none is left.
"""

from __future__ import annotations

from jobq.daemons.base import Daemon, event
from jobq.daemons.quarantine import Quarantine, needs_quarantine, quarantine_reason
from jobq.deployment import Deployment
from jobq.logs import run_fields
from jobq.metrics import METRICS
from jobq.models import Job, JobStatus, Run, RunState, Transition
from jobq.ports import IndexEntry
from jobq.retry import decide

RESULT_EXPIRY_EVERY_MS = 60_000


class Reaper(Daemon):
    name = "reaper"

    def __init__(self, deployment: Deployment, *, batch: int = 500) -> None:
        super().__init__(deployment)
        self.interval_s = self.settings.reaper_interval_s
        self.batch = batch
        self._full = False
        self._results_due_ms = 0  # when the next result expiry pass runs
        self.quarantine = Quarantine(deployment, self.log)

    def busy(self, done: int) -> bool:
        return self._full

    def run_once(self, now_ms: int) -> int:
        cleared = self.expire_results(now_ms)
        expired = self.store.expired_leases(now_ms, self.batch)
        self._full = len(expired) == self.batch or cleared == self.batch
        if not expired:
            return cleared
        return cleared + self._reclaim_all(expired, now_ms)

    def expire_results(self, now_ms: int) -> int:
        """Clear one batch of results older than `result_ttl_s`, at most once a minute unless a full
        batch says more are waiting."""
        if now_ms < self._results_due_ms:
            return 0
        cleared = self.store.expire_results(now_ms - self.settings.result_ttl_s * 1000, self.batch)
        self._results_due_ms = now_ms if cleared == self.batch else now_ms + RESULT_EXPIRY_EVERY_MS
        if cleared:
            self.log.info("cleared %d expired results", cleared)
        return cleared

    def _reclaim_all(self, expired: list[Run], now_ms: int) -> int:
        corrupt = [r for r in expired if r.corrupt is not None]
        expired = [r for r in expired if r.corrupt is None]
        jobs = self.store.get_jobs(list({r.job_key for r in expired if r.state is RunState.RUNNING}))
        bad = [(j, quarantine_reason(j)) for j in jobs.values() if needs_quarantine(j)]
        set_aside = self.quarantine.runs(corrupt, now_ms) + self.quarantine.jobs(bad, now_ms)
        if bad:
            expired = [r for r in expired if r.job_key not in {j.key for j, _ in bad}]
        if not expired:
            return set_aside
        moves = [self._reclaim(run, jobs.get(run.job_key), now_ms) for run in expired]
        results = self.store.transition(moves)
        rescheduled = [r for r in results if r is not None and r.state is RunState.SCHEDULED]
        self.d.index.add([IndexEntry(r.run_id, r.due_ms, r.priority) for r in rescheduled])
        events = []
        for before, after in zip(expired, results, strict=True):
            if after is None:
                continue  # renewed, finished or reclaimed by another reaper meanwhile
            METRICS.reclaimed.inc(state=before.state.value)
            kind = "RECLAIMED" if after.state is RunState.SCHEDULED else "FAILED"
            # The attempt that lost its lease, under its own number and fence.
            events.append(
                event(after, kind, now_ms, worker=before.lease_owner, attempt=before.attempt, fence=before.fence)
            )
            self.log.warning(
                "reclaimed expired %s lease of %s", before.state.value, before.lease_owner, extra=run_fields(after)
            )
        self.d.history.record(events)
        return len(events) + set_aside

    def _reclaim(self, run: Run, job: Job | None, now_ms: int) -> Transition:
        cleared = {"lease_owner": None, "lease_expires_ms": None}
        if run.state is not RunState.RUNNING:
            return Transition(
                run.run_id,
                frozenset({run.state}),
                RunState.SCHEDULED,
                run.fence,
                {**cleared, "due_ms": now_ms},
                bump_fence=True,
                expect_version=run.version,
                at_ms=now_ms,
            )
        error = f"LeaseExpired: {run.lease_owner} stopped heartbeating"
        if job is None:
            verdict_retry, delay_s = False, 0.0
        else:
            verdict = decide(
                job.retry, run.attempt, "LeaseExpired", age_s=(now_ms - run.nominal_ms) / 1000, base=run.attempt_base
            )
            verdict_retry, delay_s = verdict.retry, verdict.delay_s
        if verdict_retry:
            changes = {
                **cleared,
                "attempt": run.attempt + 1,
                "due_ms": now_ms + round(delay_s * 1000),
                "last_error": error,
                "deadline_ms": None,
            }
            return Transition(
                run.run_id,
                frozenset({RunState.RUNNING}),
                RunState.SCHEDULED,
                run.fence,
                changes,
                bump_fence=True,
                expect_version=run.version,
                at_ms=now_ms,
            )
        changes = {**cleared, "last_error": error, "dead_letter": True, "finished_ms": now_ms}
        finish = JobStatus.COMPLETED if job is not None and job.completed_by(run.nominal_ms) else None
        return Transition(
            run.run_id,
            frozenset({RunState.RUNNING}),
            RunState.FAILED,
            run.fence,
            changes,
            bump_fence=True,
            expect_version=run.version,
            at_ms=now_ms,
            job_status=finish,
        )
