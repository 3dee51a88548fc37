"""Beat: turns job schedules into runs within the horizon, and repairs the time index.

Idempotent and safe to run in several copies: run ids derive from fire times, so two beats
materialising the same job create the same runs, and the job's advance is a compare-and-set.
A job whose record does not decode, or whose schedule cannot be computed, is quarantined and
the pass goes on with the others (`jobq.daemons.quarantine`).
"""

from __future__ import annotations

import contextlib

from jobq.daemons.base import Daemon, event
from jobq.daemons.quarantine import Quarantine, quarantine_reason
from jobq.deployment import Deployment
from jobq.errors import Conflict, JobNotFound
from jobq.logs import run_fields
from jobq.metrics import METRICS
from jobq.models import Job, Run, RunState
from jobq.ports import IndexEntry
from jobq.records import describe
from jobq.submission import Limits, materialise

REPAIR_GRACE_MS = 2_000  # a run this overdue and still SCHEDULED may have lost its index entry


class Beat(Daemon):
    name = "beat"

    def __init__(self, deployment: Deployment, *, batch: int = 500) -> None:
        super().__init__(deployment)
        self.interval_s = self.settings.beat_interval_s
        self.batch = batch
        self.limits = Limits.from_settings(self.settings)
        self._last_repair_ms = 0
        self._full = False
        self.quarantine = Quarantine(deployment, self.log)

    def run_once(self, now_ms: int) -> int:
        return self.materialise(now_ms) + self.repair(now_ms)

    def busy(self, done: int) -> bool:
        return self._full

    def materialise(self, now_ms: int) -> int:
        jobs = self.store.due_jobs(now_ms + self.limits.horizon_ms, self.batch)
        self._full = len(jobs) == self.batch
        runs: list[Run] = []
        advanced: list[Job] = []
        bad: list[tuple[Job, str]] = []
        for job in jobs:
            if job.corrupt is not None:
                bad.append((job, quarantine_reason(job)))
                continue
            try:
                moved, new_runs, missed = materialise(job, now_ms, self.limits)
            except Exception as exc:  # pure: the record is what fails, and it must not stop the others
                bad.append((job, f"its schedule cannot be computed: {describe(exc)}"))
                continue
            if missed:
                METRICS.misfires.inc(missed, policy=job.misfire_policy.value)
                self.log.warning("job missed %d fire(s)", missed, extra={"job_id": job.job_id})
            runs.extend(new_runs)
            advanced.append(moved)
        added = self.store.add_runs(runs)
        self.d.index.add([IndexEntry(r.run_id, r.due_ms, r.priority) for r in runs if r.state is RunState.SCHEDULED])
        for job in advanced:
            # Another beat (or a pause/cancel) may have moved the job first; its runs are the same runs.
            # A job gone meanwhile (or not where this version keeps it) must not fail the others.
            with contextlib.suppress(Conflict, JobNotFound):
                self.store.update_job(job)
        missed_runs = [r for r in added if r.state is RunState.FAILED]
        if missed_runs:
            self.d.history.record([event(r, "MISSED", now_ms) for r in missed_runs])
            for r in missed_runs:
                self.log.warning("one-off missed its catch-up window", extra=run_fields(r))
        if bad:
            self.quarantine.jobs(bad, now_ms)
        return len(added) + len(bad)

    def repair(self, now_ms: int) -> int:
        """Re-index SCHEDULED runs that are overdue: the index lost them (flushed, or a scanner died
        between taking them from the index and claiming them in the store)."""
        if self.d.index.derived_from_store or now_ms - self._last_repair_ms < self.settings.repair_interval_s * 1000:
            return 0
        self._last_repair_ms = now_ms
        overdue = self.store.overdue_runs(now_ms - REPAIR_GRACE_MS, 5000)
        corrupt = [r for r in overdue if r.corrupt is not None]
        if corrupt:
            self.quarantine.runs(corrupt, now_ms)
            overdue = [r for r in overdue if r.corrupt is None]
        if overdue:
            self.d.index.add([IndexEntry(r.run_id, r.due_ms, r.priority) for r in overdue])
            self.log.info("re-indexed %d overdue runs", len(overdue))
        return len(overdue)
