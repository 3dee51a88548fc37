"""Beat: turns job schedules into runs within the horizon, and repairs the time index.

A pass takes the due jobs CRITICAL first (`JobStore.due_jobs`), so a backlog of LOW jobs larger
than a batch never delays a CRITICAL one, and writes the whole batch with one `advance_jobs`
call: each job's advance is a compare-and-set on its version, and (SQL stores) only the jobs it
moved get their runs, all in one transaction. Several beats share the jobs out by shard
(`jobq.sharding`): each reads the live beats from the daemon registry every
`registry_heartbeat_s` and materialises only its own shards, so a beat that dies hands its share
to the others once its registry entry expires. Idempotent and safe while views differ: run ids
derive from fire times, and the second advance of the same job version is refused.
A job whose record does not decode, or whose schedule cannot be computed, is quarantined and
the pass goes on with the others (`jobq.daemons.quarantine`).
"""

from __future__ import annotations

from jobq.daemons.base import Daemon, event
from jobq.daemons.quarantine import Quarantine, quarantine_reason
from jobq.deployment import Deployment
from jobq.logs import run_fields
from jobq.metrics import METRICS
from jobq.models import Job, Run, RunState
from jobq.ports import IndexEntry
from jobq.records import describe
from jobq.registry import Role
from jobq.sharding import owned_shards
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
        # The shards this beat owns (None: all of them), as of the registry read at `_shards_ms`.
        self.shards: tuple[int, ...] | None = None
        self._shards_ms: int | None = None

    def run_once(self, now_ms: int) -> int:
        return self.materialise(now_ms) + self.repair(now_ms)

    def busy(self, done: int) -> bool:
        return self._full

    def owned(self, now_ms: int) -> tuple[int, ...] | None:
        """The shards this beat materialises: re-read from the live beats in the daemon registry
        once per `registry_heartbeat_s`. With the registry off, or while it cannot be read (the
        last view is kept), a beat that has seen no other beat takes every job."""
        every_ms = round(self.settings.registry_heartbeat_s * 1000)
        if every_ms <= 0:
            return None
        if self._shards_ms is not None and 0 <= now_ms - self._shards_ms < every_ms:
            return self.shards
        try:
            live = [r.daemon_id for r in self.d.registry.live_daemons(now_ms) if r.role is Role.BEAT]
        except Exception as exc:  # a view: its outage must not stop materialisation
            self.log.warning("cannot read the live beats (%s); keeping the last view", describe(exc))
            return self.shards
        shards = owned_shards(self.daemon_id, live)
        if shards != self.shards:
            others = len(set(live) - {self.daemon_id})
            self.log.info("beat owns %s (%d other beats live)", "every shard" if shards is None else shards, others)
        self.shards, self._shards_ms = shards, now_ms
        return shards

    def materialise(self, now_ms: int) -> int:
        jobs = self.store.due_jobs(now_ms + self.limits.horizon_ms, self.batch, self.owned(now_ms))
        self._full = len(jobs) == self.batch
        advances: list[tuple[Job, list[Run]]] = []
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
            # `moved` keeps the version read: another beat (or a pause or cancel) that moved the job
            # first wins, and this pass creates none of its runs (a winning beat made the same ones).
            advances.append((moved, new_runs))
        advanced = self.store.advance_jobs(advances)
        # The runs of every job this pass advanced are indexed, those already stored included (a
        # DynamoDB beat that died between its run puts and its advance left some unindexed).
        added = [r for (_, runs), moved in zip(advances, advanced, strict=True) if moved for r in runs]
        self.d.index.add([IndexEntry(r.run_id, r.due_ms, r.priority) for r in added if r.state is RunState.SCHEDULED])
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
