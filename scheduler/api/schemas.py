"""Response models: the OpenAPI document's promises about every body the API returns.

The resources are rendered by `jobq.views` (shared with the CLI's `--json`); these models
describe them, and FastAPI checks each response against its model before sending it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

CRON_EXPRESSION = (
    "The canonical expression that fires: aliases expanded, `a-a` written `a`, and `H` replaced by the "
    "values it picked from the job id."
)
CRON_SOURCE = "The expression as submitted (with its alias or `H`), for display."


class FieldError(BaseModel):
    field: str | None = None
    message: str


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. `job_not_found`, `idempotency_conflict`.")
    message: str = Field(description="What went wrong, for people.")
    field: str | None = Field(default=None, description="The input at fault, e.g. `target.endpoint`.")
    request_id: str | None = Field(default=None, description="Quote it when reporting a problem: it is in the logs.")
    details: list[FieldError] | None = Field(default=None, description="Every validation error (422 only).")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class JobCreated(BaseModel):
    job_id: str
    tenant_id: str
    job_name: str
    status: str = Field(description="`SCHEDULED` at creation.")
    job_status: str = Field(description="The job's own status: `ACTIVE`.")
    schedule_type: str
    priority: str
    cron_expression: str | None = Field(description=CRON_EXPRESSION)
    cron_source: str | None = Field(default=None, description=CRON_SOURCE)
    timezone: str
    next_run_time_epoch_ms: int | None
    next_run_time_iso: str | None
    next_fire_times: list[str] = Field(description="The next (up to 5) nominal fire times, ISO 8601 UTC.")
    next_fire_times_epoch_ms: list[int]
    created_at: str
    warnings: list[str] = Field(
        default_factory=list,
        description="Things the job was accepted despite, e.g. a task no worker has served yet (it waits for one).",
    )


class RunResource(BaseModel):
    run_id: str
    job_id: str
    state: str
    attempt: int
    fencing_token: int
    priority: str
    nominal_time_iso: str | None
    due_time_iso: str | None = Field(description="None while the job is paused (the run is parked).")
    lease_worker_id: str | None
    lease_expires_at: str | None
    last_heartbeat_at: str | None
    dispatched_at: str | None
    started_at: str | None
    finished_at: str | None
    last_error: str | None
    dead_letter: bool
    result: Any = Field(description="A webhook's `{status, body}` or a task's return value.")
    corrupt: str | None = Field(
        default=None,
        description="Set when the stored run does not decode: what is wrong. Only the fields that decode are shown.",
    )


class RunResultResource(RunResource):
    result: Any = Field(
        description="A task's return value once `result_state` is `SUCCEEDED` (a webhook's `{status, body}`); "
        "what a `FAILED` run kept; otherwise null."
    )
    result_state: str = Field(
        description="`PENDING` (not finished: scheduled, running or waiting to retry), `SUCCEEDED`, `FAILED`, "
        "`CANCELLED`, `EXPIRED` (older than `result_ttl_s`) or `NOT_KEPT` (not JSON, or over 64 KiB)."
    )
    error_type: str | None = Field(description="For `FAILED`: the type of the task's final error, e.g. `ValueError`.")
    error: str | None = Field(description="For `FAILED`: its message; for `CANCELLED` and `NOT_KEPT`: why.")
    result_expires_at: str | None = Field(description="When the result of a finished run expires (or expired).")


class JobSummary(BaseModel):
    job_id: str
    tenant_id: str
    job_name: str
    job_status: str = Field(description="`ACTIVE`, `PAUSED`, `COMPLETED`, `CANCELLED` or `QUARANTINED`.")
    status_reason: str | None = Field(
        default=None, description="Why a daemon set the status: for `QUARANTINED`, what could not be decoded."
    )
    corrupt: str | None = Field(
        default=None,
        description="Set when the stored job does not decode: what is wrong. Fields that do not decode show "
        "placeholders (task `jobq.corrupt`, a `ONE_OFF` schedule without a time); it can still be cancelled.",
    )
    schedule_type: str
    cron_expression: str | None = Field(description=CRON_EXPRESSION)
    cron_source: str | None = Field(default=None, description=CRON_SOURCE)
    timezone: str
    priority: str
    task: str | None
    created_at: str | None
    updated_at: str | None


class JobResource(JobSummary):
    status: str = Field(description="The state of the job's current run, or the job's status when it has none.")
    last_heartbeat_at: str | None
    current_lease_worker_id: str | None
    current_attempt: int | None
    fencing_token: int | None
    next_run_time_epoch_ms: int | None
    next_run_time_iso: str | None
    next_fire_times: list[str | None]
    current_run: RunResource | None
    run_counts: dict[str, int] = Field(description="How many of the job's runs are in each state.")
    payload: Any
    retry_policy: dict[str, Any]
    misfire_policy: str
    catchup_window_seconds: int
    overlap_policy: str
    jitter_seconds: int
    target: dict[str, Any]


class Attempt(BaseModel):
    attempt: int
    worker_id: str | None
    started_at: str | None
    finished_at: str | None
    outcome: str | None = Field(description="SUCCEEDED, RETRYING, FAILED, RECLAIMED, ...; None while running.")
    error: str | None
    duration_ms: int | None


class Event(BaseModel):
    run_id: str
    attempt: int
    fencing_token: int
    event: str
    at: str | None
    worker_id: str | None
    error: str | None
    duration_ms: int | None


class RunWithAttempts(RunResource):
    attempts: list[Attempt]
    events: list[Event]


class RetryPolicyResource(BaseModel):
    max_retries: int
    initial_interval_sec: float
    backoff_multiplier: float
    max_interval_sec: float
    non_retryable_errors: list[str]
    max_age_sec: float | None


class TaskResource(BaseModel):
    name: str
    priority: str = Field(description="Applied to a submission by name that gives no `priority`.")
    queue: str = Field(description="The queue of that tier: `critical`, `high`, `default` or `low`.")
    retry_policy: RetryPolicyResource | None = Field(
        description="Applied to a submission that gives no `retry_policy`; null: the default policy."
    )
    timeout_seconds: float | None = Field(description="Applied to a submission that gives no `timeout_seconds`.")
    parameters: list[str] = Field(description="The task function's parameters, as written.")
    published_by: str = Field(description="The worker that published this declaration last.")
    published_at: str | None


class TaskList(BaseModel):
    items: list[TaskResource]


class JobPage(BaseModel):
    items: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; None on the last.")


class RunPage(BaseModel):
    items: list[RunWithAttempts]
    next_cursor: str | None


class DeadLetterPage(BaseModel):
    items: list[RunResource]
    next_cursor: str | None


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class PreviewEvent(BaseModel):
    kind: str = Field(description="`fire`, or `skipped`: wall times that matched but a DST rule dropped.")
    epoch_ms: int = Field(description="A fire's instant; for `skipped`, the instant of the clock change.")
    utc: str
    local: str = Field(description="The same instant in the schedule's timezone, ISO 8601 with its offset.")
    zone: str | None = Field(description="The zone's abbreviation at that instant, e.g. `EDT`.")
    dst: str | None = Field(
        description="`shifted` (a fire moved out of a spring-forward gap), `second_pass` (a fire in a repeated "
        "hour), `gap` or `repeat` (skipped wall times); null when DST played no part."
    )
    reason: str | None = Field(description="Why, in words, when `dst` is set.")
    wall_times: list[str] = Field(description="The local wall times a `shifted` or `skipped` event stands for (<= 5).")
    wall_time_count: int = Field(description="How many such wall times (counted up to 1,000).")


class SchedulePreview(BaseModel):
    cron_expression: str = Field(description=CRON_EXPRESSION)
    cron_source: str = Field(description=CRON_SOURCE)
    timezone: str
    dst_gap: str
    dst_overlap: str
    job_id: str | None = Field(description="The job id `H` was resolved with, if given.")
    after: str = Field(description="The preview starts strictly after this instant.")
    events: list[PreviewEvent] = Field(description="Fires and skipped wall times, in time order.")
