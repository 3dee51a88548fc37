"""The external shape of jobs and runs: one rendering for `--json` output and the HTTP API.

Rendering never fails on anything a store can hold: instants are formatted by the total
`jobq.instants.to_iso`, a run held for its paused job has no due time, and secrets are write-only
(webhook header values are shown redacted, `redact_target`).
"""

from __future__ import annotations

from typing import Any

from jobq.client import JobView
from jobq.instants import to_iso
from jobq.joblist import JobRow
from jobq.models import Job, JobStatus, Run, RunEvent, RunState, Target, TaskInfo, WebhookTarget
from jobq.redaction import redact_headers, redact_url


def iso(ms: int | None) -> str | None:
    return None if ms is None else to_iso(ms)


def run_resource(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "job_id": run.job_id,
        "state": run.state.value,
        "attempt": run.attempt,
        "fencing_token": run.fence,
        "priority": run.priority.value,
        "nominal_time_iso": iso(run.nominal_ms),
        "due_time_iso": None if run.held else iso(run.due_ms),
        "lease_worker_id": run.lease_owner,
        "lease_expires_at": iso(run.lease_expires_ms),
        "last_heartbeat_at": iso(run.last_heartbeat_ms),
        "dispatched_at": iso(run.dispatched_ms),
        "started_at": iso(run.started_ms),
        "finished_at": iso(run.finished_ms),
        "last_error": run.last_error,
        "dead_letter": run.dead_letter,
        "result": run.result,
        "corrupt": run.corrupt,
    }


def job_resource(view: JobView) -> dict[str, Any]:
    job, run = view.job, view.current_run
    upcoming = list(view.next_fire_times)
    paused = job.status is JobStatus.PAUSED and (run is None or run.state is RunState.SCHEDULED)
    return {
        **job_summary(job),
        # A paused job's waiting run is SCHEDULED in the store; what the user needs to see is why it waits.
        "status": JobStatus.PAUSED.value if paused else run.state.value if run is not None else job.status.value,
        "last_heartbeat_at": iso(run.last_heartbeat_ms) if run else None,
        "current_lease_worker_id": run.lease_owner if run else None,
        "current_attempt": run.attempt if run else None,
        "fencing_token": run.fence if run else None,
        "next_run_time_epoch_ms": upcoming[0] if upcoming else None,
        "next_run_time_iso": iso(upcoming[0]) if upcoming else None,
        "next_fire_times": [iso(ms) for ms in upcoming],
        "current_run": run_resource(run) if run else None,
        "run_counts": view.counts,
        "payload": job.payload,
        "retry_policy": job.retry.model_dump(mode="json"),
        "misfire_policy": job.misfire_policy.value,
        "catchup_window_seconds": job.catchup_window_s,
        "overlap_policy": job.overlap_policy.value,
        "jitter_seconds": job.jitter_s,
        "target": redact_target(job.target),
    }


def redact_target(target: Target) -> dict[str, Any]:
    """A job's target as shown: webhook header values (but for public ones) and URL secrets hidden."""
    shown: dict[str, Any] = target.model_dump(mode="json")
    if isinstance(target, WebhookTarget):
        shown["endpoint"] = redact_url(target.endpoint)
        shown["headers"] = redact_headers(target.headers)
    return shown


def job_summary(job: Job) -> dict[str, Any]:
    return JobRow.from_job(job).summary()


def event_resource(e: RunEvent) -> dict[str, Any]:
    return {
        "run_id": e.run_id,
        "attempt": e.attempt,
        "fencing_token": e.fence,
        "event": e.kind,
        "at": iso(e.at_ms),
        "worker_id": e.worker,
        "error": e.error,
        "duration_ms": e.duration_ms,
    }


def task_resource(info: TaskInfo) -> dict[str, Any]:
    """A task catalogue entry as `GET /v1/tasks` and `jobq tasks --json` show it."""
    return {
        "name": info.name,
        "priority": info.priority.value,
        "queue": info.queue,
        "retry_policy": None if info.retry is None else info.retry.model_dump(mode="json"),
        "timeout_seconds": info.timeout_s,
        "parameters": list(info.parameters),
        "published_by": info.worker_id,
        "published_at": iso(info.published_ms),
    }
