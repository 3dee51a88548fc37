"""Builders for jobs and runs in tests: valid defaults, override what the test is about."""

from __future__ import annotations

from typing import Any

from jobq.models import Job, JobKey, Priority, Run, RunState, Schedule, ScheduleType, TaskTarget

T0 = 1_790_000_000_000  # 2026-09-21T15:33:20Z


def key(job_id: str = "job_1", tenant_id: str = "default") -> JobKey:
    return JobKey(tenant_id, job_id)


def make_job(job_id: str = "job_1", **overrides: Any) -> Job:
    fields: dict[str, Any] = {
        "job_id": job_id,
        "tenant_id": "default",
        "name": "tests.noop",
        "target": TaskTarget(task="tests.noop"),
        "payload": {"args": [], "kwargs": {}},
        "schedule": Schedule(type=ScheduleType.ONE_OFF, at_ms=T0),
        "created_ms": T0,
        "updated_ms": T0,
        "next_fire_ms": T0,
    }
    fields.update(overrides)
    return Job.model_validate(fields)


def make_run(job_id: str = "job_1", nominal_ms: int = T0, **overrides: Any) -> Run:
    tenant_id = overrides.get("tenant_id", "default")
    fields: dict[str, Any] = {
        "run_id": Run.make_id(JobKey(tenant_id, job_id), nominal_ms),
        "job_id": job_id,
        "nominal_ms": nominal_ms,
        "due_ms": nominal_ms,
        "priority": Priority.DEFAULT,
        "state": RunState.SCHEDULED,
        "created_ms": T0,
        "updated_ms": T0,
    }
    fields.update(overrides)
    return Run.model_validate(fields)
