"""Taking records that cannot be processed out of circulation, so that one never stops a pass.

A store reads a row that does not decode as a corrupt marker (`jobq.records`); a daemon that
meets one hands it here and goes on with the rest of its batch (design §14.6):

- a job (met by beat, or by the scanner or reaper through one of its runs) is set QUARANTINED by
  a narrow status write that leaves its record as it is, with the reason in `status_reason`; it
  creates no more runs. Beat also quarantines a job that decodes but whose schedule cannot be
  computed. Its open runs go to the dead-letter list;
- a run that does not decode (met by the scanner's claim, the reaper or beat's repair) goes to
  the dead-letter list.

A dead-lettered run is FAILED with `dead_letter` and a `last_error` starting with ``Corrupt:``
(fence+1, so a worker still holding it can commit nothing). Every record is counted in
`jobq_corrupt_records_total{kind}` and named in the log once: by the call whose write took it
out of circulation (a later daemon meeting it again finds the write done and stays quiet).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from jobq.daemons.base import event
from jobq.deployment import Deployment
from jobq.logs import run_fields
from jobq.metrics import METRICS
from jobq.models import TERMINAL_STATES, Job, JobStatus, Run, RunState, Transition
from jobq.ports import RunQuery

CORRUPT = "Corrupt: "  # how a dead-lettered run's last_error starts
_OPEN = frozenset(RunState) - TERMINAL_STATES
# A cancelled job is already out of circulation; anything else a daemon meets can be quarantined.
_QUARANTINABLE = frozenset({JobStatus.ACTIVE, JobStatus.PAUSED, JobStatus.COMPLETED})


def quarantine_reason(job: Job) -> str:
    """Why a job a daemon met must be (or was) taken out of circulation."""
    if job.corrupt is not None:
        return f"its record does not decode: {job.corrupt}"
    return job.status_reason or "it is quarantined"


def _quarantined(job: Job) -> bool:
    return job.status is JobStatus.QUARANTINED


def needs_quarantine(job: Job) -> bool:
    """A job met by a daemon whose runs must not go on: its record does not decode, or it is
    QUARANTINED. A cancelled one is ended the ordinary way."""
    return job.status is not JobStatus.CANCELLED and (job.corrupt is not None or _quarantined(job))


class Quarantine:
    def __init__(self, deployment: Deployment, log: logging.Logger) -> None:
        self.d = deployment
        self.store = deployment.store
        self.log = log

    def jobs(self, jobs: Sequence[tuple[Job, str]], now_ms: int) -> int:
        """Quarantine each job for its reason (one line: what does not decode) and dead-letter its
        open runs; returns how many runs were dead-lettered."""
        dead = 0
        for job, reason in jobs:
            if self.store.set_job_status(job.key, JobStatus.QUARANTINED, _QUARANTINABLE, now_ms, reason):
                METRICS.corrupt_records.inc(kind="job")
                self.log.error(
                    "quarantined job %s: %s; its open runs go to the dead-letter list",
                    str(job.key),
                    reason,
                    extra={"job_id": job.job_id, "tenant_id": job.tenant_id},
                )
            elif job.status is not JobStatus.QUARANTINED:
                continue  # cancelled meanwhile: its runs are the cancel's to end
            moved = self._dead_letter(self._open_runs(job), f"{CORRUPT}its job is quarantined ({reason})", now_ms)
            if moved:
                fields = {"job_id": job.job_id, "tenant_id": job.tenant_id}
                self.log.warning("dead-lettered %d open runs of quarantined job %s", moved, str(job.key), extra=fields)
            dead += moved
        return dead

    def runs(self, runs: Sequence[Run], now_ms: int) -> int:
        """Dead-letter each run that does not decode; returns how many this call moved."""
        dead = 0
        for run in runs:
            reason = f"{CORRUPT}its record does not decode ({run.corrupt})"
            if self._dead_letter([run], reason, now_ms):
                METRICS.corrupt_records.inc(kind="run")
                self.log.error("dead-lettered run %s: %s", run.run_id, reason, extra=run_fields(run))
                dead += 1
        return dead

    def _open_runs(self, job: Job) -> list[Run]:
        runs: list[Run] = []
        cursor = None
        while True:
            page = self.store.list_runs(RunQuery(job=job.key, states=_OPEN, cursor=cursor, limit=500))
            runs.extend(page.items)
            if page.next_cursor is None:
                return runs
            cursor = page.next_cursor

    def _dead_letter(self, runs: Sequence[Run], reason: str, now_ms: int) -> int:
        moves = [
            Transition(
                run.run_id,
                frozenset({run.state}),
                RunState.FAILED,
                # A corrupt row's fence may be what does not decode: its state is the guard.
                None if run.corrupt is not None else run.fence,
                {
                    "dead_letter": True,
                    "last_error": reason,
                    "finished_ms": now_ms,
                    "lease_owner": None,
                    "lease_expires_ms": None,
                },
                bump_fence=True,
                at_ms=now_ms,
            )
            for run in runs
            if run.state in _OPEN
        ]
        if not moves:
            return 0
        done = [(t, moved) for t, moved in zip(moves, self.store.transition(moves), strict=True) if moved is not None]
        self.d.index.discard([t.run_id for t, _ in done])
        self.d.history.record([event(moved, "FAILED", now_ms, error=reason) for _, moved in done])
        return len(done)
