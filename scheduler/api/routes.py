"""The `/v1` resources: jobs, their runs and actions, dead letters; and the operations endpoints.

Handlers are plain `def`s (FastAPI runs them in its thread pool) because the `Client` and the
stores block. Every tenant-scoped call goes through `Client(d, tenant_id=...)`, so another
tenant's job or run is `404`, exactly as if it did not exist. Job ids are scoped by tenant: a
`{job_id}` in a path is the token's tenant's job of that id, and creating a job whose id another
tenant uses creates this tenant's own job (nothing tells one tenant what ids another holds).

Actions are `POST /v1/jobs/{job_id}:cancel` (and `:pause`, `:resume`, `:trigger`, and
`POST /v1/dlq/{run_id}:redrive`): the path converters below match ids that cannot contain a
colon (job ids) or end in one colon and digits (run ids, `job_id:ms` or `tenant/job_id:ms`), so
`{id}:{action}` splits one way only.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, Header, Path, Query
from fastapi.responses import PlainTextResponse, Response
from starlette.convertors import Convertor, register_url_convertor

from jobq import tracing
from jobq.api.auth import Principal, ScopedClient, allowed_scope
from jobq.api.errors import ApiError
from jobq.api.middleware import API_METRICS
from jobq.api.schemas import (
    DeadLetterPage,
    ErrorResponse,
    Health,
    JobCreated,
    JobPage,
    JobResource,
    RunPage,
    RunResource,
    RunResultResource,
    TaskList,
)
from jobq.api.state import ApiState, api_state
from jobq.bounds import Text
from jobq.client import Client
from jobq.errors import Conflict
from jobq.metrics import METRICS
from jobq.models import Job, JobKey, JobStatus, Priority, RunEvent, WebhookTarget
from jobq.ports import JobQuery, Page
from jobq.results import read_result
from jobq.submission import IDEMPOTENCY_KEY_PATTERN, JOB_ID_PATTERN, JobSpec
from jobq.views import event_resource, iso, job_resource, job_summary, run_resource, task_resource
from jobq.webhooks import check_target

T = TypeVar("T")
log = logging.getLogger("jobq.api")

_JOB_ID = JOB_ID_PATTERN.removeprefix("^").removesuffix("$")
_TENANT = r"[A-Za-z0-9_.\-]{1,128}"  # as JobSpec.tenant_id
_JOB_CURSOR = re.compile(rf"{_JOB_ID}\|{_TENANT}")  # what `GET /v1/jobs` returns as next_cursor
_RUN_ID = f"(?:{_TENANT}/)?{_JOB_ID}:[0-9]{{1,19}}"  # Run.make_id: tenants other than `default` lead
RUN_ID_PATTERN = f"^{_RUN_ID}$"
HISTORY_LIMIT = 10_000  # events read per runs page; see docs/api.md on very long-lived cron jobs
_OUTCOMES = frozenset({"SUCCEEDED", "RETRYING", "FAILED", "RECLAIMED", "CANCELLED"})


class _JobIdConvertor(Convertor[str]):
    regex = _JOB_ID

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class _RunIdConvertor(_JobIdConvertor):
    regex = _RUN_ID


register_url_convertor("jobq_job_id", _JobIdConvertor())
register_url_convertor("jobq_run_id", _RunIdConvertor())

State = Annotated[ApiState, Depends(api_state)]
JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="A job id, e.g. `job_01k...`.")]
RunId = Annotated[
    str,
    Path(
        pattern=RUN_ID_PATTERN,
        description="`<job_id>:<nominal fire time, epoch ms>`, led by `<tenant>/` for tenants other than `default`.",
    ),
]
Cursor = Annotated[Text | None, Query(max_length=512, description="`next_cursor` of the previous page.")]
Limit = Annotated[int, Query(ge=1, le=500)]


JOB_EXAMPLES: dict[str, Any] = {
    "cron_webhook": {
        "summary": "A monthly webhook in New York time (design section 12)",
        "value": {
            "job_name": "monthly_billing_aggregation",
            "schedule_type": "CRON",
            "cron_expression": "0 2 1 * *",
            "timezone": "America/New_York",
            "priority": "HIGH",
            "target": {
                "type": "HTTP_WEBHOOK",
                "endpoint": "https://billing.example.com/invoices/generate",
                "method": "POST",
                "timeout_seconds": 120,
                "headers": {"Content-Type": "application/json"},
            },
            "payload": {"billing_cycle": "2026-09", "dry_run": False},
            "retry_policy": {"max_retries": 3, "initial_interval_sec": 10, "backoff_multiplier": 2.0},
        },
    },
    "one_off_task": {
        "summary": "A registered task in 90 seconds",
        "value": {
            "job_name": "welcome-mail",
            "schedule_type": "ONE_OFF",
            "delay_seconds": 90,
            "target": {"type": "TASK", "task": "billing.aggregate"},
            "payload": {"args": [], "kwargs": {"cycle": "2026-09"}},
        },
    },
    "immediate": {
        "summary": "As soon as possible (ONE_OFF with run_at takes ISO 8601 or epoch ms)",
        "value": {
            "schedule_type": "IMMEDIATE",
            "target": {"type": "HTTP_WEBHOOK", "endpoint": "https://hooks.example.com/x"},
        },
    },
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}


# Every /v1 operation may answer these; each route adds its own.
COMMON_ERRORS = _errors(401, 403, 413, 415, 422, 431, 500, 503)  # 403: `tenant_id` naming another tenant
router = APIRouter(responses=COMMON_ERRORS, tags=["jobs"])
dead_letters = APIRouter(responses=COMMON_ERRORS, tags=["dead letters"])
operations = APIRouter(tags=["operations"], responses=_errors(500))


def created_body(job: Job, fires: list[int]) -> dict[str, Any]:
    """The `201` body of `POST /v1/jobs` (also stored with the Idempotency-Key and replayed verbatim)."""
    return {
        "job_id": job.job_id,
        "tenant_id": job.tenant_id,
        "job_name": job.name,
        "status": "SCHEDULED",
        "job_status": job.status.value,
        "schedule_type": job.schedule.type.value,
        "priority": job.priority.value,
        "cron_expression": job.schedule.cron,
        "cron_source": job.schedule.cron_source or job.schedule.cron,
        "timezone": job.schedule.timezone,
        "next_run_time_epoch_ms": fires[0] if fires else None,
        "next_run_time_iso": iso(fires[0]) if fires else None,
        "next_fire_times": [iso(ms) for ms in fires],
        "next_fire_times_epoch_ms": list(fires),
        "created_at": iso(job.created_ms),
    }


@router.post(
    "/v1/jobs",
    status_code=201,
    response_model=None,
    summary="Submit a job",
    responses={
        201: {"model": JobCreated, "description": "Created."},
        200: {"model": JobCreated, "description": "Replayed: the original response to this Idempotency-Key."},
        **_errors(400, 403, 409, 429),
    },
)
def create_job(
    spec: Annotated[JobSpec, Body(openapi_examples=JOB_EXAMPLES)],
    token: Principal,
    state: State,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            pattern=IDEMPOTENCY_KEY_PATTERN,
            description="The same key and body within 24 h returns the original response; another body is 409.",
        ),
    ] = None,
    traceparent: Annotated[
        str | None,
        Header(
            description="W3C trace context: the job's runs continue this trace (ignored when malformed).",
        ),
    ] = None,
) -> Response:
    """Validate and store a job with its first runs, atomically with its Idempotency-Key.

    `tenant_id` may be omitted (it is the token's); another tenant's id is `403`. An operator
    token may name any tenant (none: `default`)."""
    named = spec.tenant_id if "tenant_id" in spec.model_fields_set else None
    scope = allowed_scope(token, named)
    tenant = scope if scope is not None else spec.tenant_id  # an operator's job without tenant_id: `default`
    wait_s = state.limiter.take(tenant)
    if wait_s > 0:
        raise ApiError(
            429,
            "rate_limited",
            f"tenant {tenant!r} is submitting faster than {state.limiter.rate_per_s:g} jobs/s",
            headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
        )
    fingerprint = spec.fingerprint()  # of the request as sent, before the tenant is filled in
    settings = state.deployment.settings
    if isinstance(spec.target, WebhookTarget):
        check_target(
            spec.target, state.policy, settings.webhook_max_headers, resolve=settings.webhook_resolve_at_submit
        )
    client = Client(state.deployment, tenant_id=tenant)
    submitted = client.submit(
        spec,
        idempotency_key=idempotency_key,
        respond=lambda job, fires: json.dumps(created_body(job, fires), separators=(",", ":")),
        fingerprint=fingerprint,
        # An instrumented server has made the request's span current; otherwise continue the header.
        trace=None if tracing.current_traceparent() else tracing.valid_traceparent(traceparent),
    )
    location = {"Location": f"/v1/jobs/{submitted.job.job_id}"}
    if submitted.created:
        body = _warned(submitted.response, submitted.warnings)
        return Response(body, status_code=201, media_type="application/json", headers=location)
    replayed = submitted.response or json.dumps(created_body(submitted.job, list(submitted.next_fire_times)))
    return Response(
        _warned(replayed, submitted.warnings),
        status_code=200,
        media_type="application/json",
        headers={**location, "Idempotent-Replayed": "true"},
    )


def _warned(body: str | None, warnings: tuple[str, ...]) -> str | None:
    """The stored response with this submission's warnings (they are not kept with the key: a
    replay says whether the task is served now)."""
    if not warnings or body is None:
        return body
    return json.dumps({**json.loads(body), "warnings": list(warnings)}, separators=(",", ":"))


@router.get("/v1/tasks", response_model=TaskList, summary="List the task catalogue")
def list_tasks(token: Principal, state: State) -> dict[str, Any]:
    """Every task a worker has published, with the options a submission by name gets unless it
    sets them (`priority`, `retry_policy`, `timeout_seconds`) and the function's parameters."""
    catalogue = state.client(token.tenant_id).declared()
    return {"items": [task_resource(info) for _, info in sorted(catalogue.items())]}


@router.get("/v1/jobs", response_model=JobPage, responses=_errors(400), summary="List jobs")
def list_jobs(
    client: ScopedClient,
    status: JobStatus | None = None,
    priority: Priority | None = None,
    job_name_prefix: Annotated[Text | None, Query(max_length=200)] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """The tenant's jobs ordered by job id, filtered by status, priority and job name prefix (an
    operator token's: every tenant's, unless `tenant_id` names one)."""
    if cursor is not None and not _JOB_CURSOR.fullmatch(cursor):
        raise ApiError(400, "invalid_cursor", "cursor is not a next_cursor this API returned", field="cursor")
    query = JobQuery(status=status, priority=priority, name_prefix=job_name_prefix, cursor=cursor, limit=limit)
    page = _paged(lambda: client.list(query))
    return {"items": [job_summary(j) for j in page.items], "next_cursor": page.next_cursor}


@router.get("/v1/jobs/{job_id:jobq_job_id}", response_model=JobResource, responses=_errors(404), summary="Get a job")
def get_job(job_id: JobId, client: ScopedClient) -> dict[str, Any]:
    """The job, its current run (state, lease holder, heartbeat, attempt, fence), next run time and run counts."""
    return job_resource(client.get(job_id))


@router.delete(
    "/v1/jobs/{job_id:jobq_job_id}",
    status_code=204,
    response_class=Response,
    responses=_errors(404, 409),
    summary="Cancel a job for good",
)
def delete_job(job_id: JobId, client: ScopedClient) -> Response:
    """Cancel the job and its unfinished runs. Idempotent: a job already cancelled or completed is
    also `204`. Nothing is erased: the job, its runs and their history stay readable."""
    try:
        client.cancel(job_id)
    except Conflict:
        if client.job(job_id).status not in (JobStatus.CANCELLED, JobStatus.COMPLETED):
            raise
    return Response(status_code=204)


def _action(name: str, doc: str, act: Callable[[Client, str], object]) -> None:
    def handler(job_id: JobId, client: ScopedClient) -> dict[str, Any]:
        act(client, job_id)
        return job_resource(client.get(job_id))

    handler.__doc__ = doc
    router.add_api_route(
        f"/v1/jobs/{{job_id:jobq_job_id}}:{name}",
        handler,
        methods=["POST"],
        response_model=JobResource,
        responses=_errors(404, 409),
        summary=f"{name.capitalize()} a job",
        name=f"{name}_job",
    )


_action("cancel", "Cancel the job and every unfinished run (a running one sees `lease_lost`).", Client.cancel)
_action("pause", "Stop creating runs; unclaimed runs wait, parked, until resume.", Client.pause)
_action("resume", "Create runs again; recurring fires missed during the pause are skipped.", Client.resume)


@router.post(
    "/v1/jobs/{job_id:jobq_job_id}:trigger",
    status_code=201,
    response_model=RunResource,
    responses=_errors(404, 409),
    summary="Run a job once now",
)
def trigger_job(job_id: JobId, client: ScopedClient) -> dict[str, Any]:
    """Create one run now, outside the schedule (the job's policies and payload apply)."""
    return run_resource(client.trigger(job_id))


@router.get(
    "/v1/jobs/{job_id:jobq_job_id}/runs",
    response_model=RunPage,
    responses=_errors(400, 404),
    summary="List a job's runs with their attempts",
)
def list_runs(job_id: JobId, client: ScopedClient, cursor: Cursor = None, limit: Limit = 50) -> dict[str, Any]:
    """The job's runs, newest first, each with its attempts (start, end, worker, outcome, error)
    and its history events."""
    page = _paged(lambda: client.runs(job_id, cursor=cursor, limit=limit))
    by_run: dict[str, list[RunEvent]] = {}
    for e in client.history(job_id, limit=HISTORY_LIMIT):
        by_run.setdefault(e.run_id, []).append(e)
    items = []
    for run in page.items:
        events = by_run.get(run.run_id, [])
        items.append({**run_resource(run), "attempts": attempts(events), "events": [event_resource(e) for e in events]})
    return {"items": items, "next_cursor": page.next_cursor}


@router.get(
    "/v1/runs/{run_id:jobq_run_id}",
    response_model=RunResultResource,
    responses=_errors(404),
    summary="Get a run and its result",
)
def get_run(run_id: RunId, client: ScopedClient) -> dict[str, Any]:
    """The run (of this token's tenant; any tenant's for an operator) with its result: the task's
    return value once it succeeded, or why there is none (`result_state`). Poll until
    `result_state` is not `PENDING`."""
    run = client.run(run_id)
    found = read_result(run, client.clock.now_ms(), client.d.settings.result_ttl_s)
    return {**run_resource(run), **found.as_json()}


@dead_letters.get("/v1/dlq", response_model=DeadLetterPage, responses=_errors(400), summary="List dead letters")
def list_dead_letters(client: ScopedClient, cursor: Cursor = None, limit: Limit = 50) -> dict[str, Any]:
    """The tenant's FAILED runs on the dead-letter list, newest first (an operator's: every tenant's,
    unless `tenant_id` names one)."""
    page = _paged(lambda: client.dead_letters(cursor=cursor, limit=limit))
    return {"items": [run_resource(r) for r in page.items], "next_cursor": page.next_cursor}


@dead_letters.post(
    "/v1/dlq/{run_id:jobq_run_id}:redrive",
    response_model=RunResource,
    responses=_errors(404, 409),
    summary="Redrive a dead letter",
)
def redrive(run_id: RunId, client: ScopedClient) -> dict[str, Any]:
    """Schedule the dead-lettered run again now, as attempt N+1."""
    return run_resource(client.redrive(run_id))


@operations.get("/healthz", response_model=Health, summary="Liveness")
def healthz() -> dict[str, Any]:
    """200 while the process serves requests; checks nothing else."""
    return {"status": "ok", "checks": {}}


@operations.get("/readyz", response_model=Health, responses=_errors(503), summary="Readiness")
def readyz(state: State) -> dict[str, Any]:
    """200 when the store answers a read and the broker a queue depth; else 503."""
    d = state.deployment
    checks: dict[str, Callable[[], object]] = {
        "store": lambda: d.store.get_jobs([JobKey("default", "readyz-probe")]),
        "transport": lambda: d.transport.depth("critical"),
    }
    for name, check in checks.items():
        try:
            check()
        except Exception as exc:
            log.warning("readiness check %s failed: %s", name, exc)
            raise ApiError(503, "not_ready", f"{name} is not ready ({type(exc).__name__})") from None
    return {"status": "ok", "checks": dict.fromkeys(checks, "ok")}


@operations.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
def metrics() -> PlainTextResponse:
    """This process's metrics in the Prometheus text format."""
    text = METRICS.render() + "\n".join(line for m in API_METRICS for line in m.render()) + "\n"
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def attempts(events: list[RunEvent]) -> list[dict[str, Any]]:
    """A run's attempts from its history (oldest first): each STARTED event opens one, the next
    outcome event (SUCCEEDED, RETRYING, FAILED, RECLAIMED, CANCELLED) closes it."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for e in events:
        if e.kind == "STARTED":
            if current is not None:
                out.append(current)  # its outcome was never recorded (a crash); it stays open-ended
            current = {
                "attempt": e.attempt,
                "worker_id": e.worker,
                "started_at": iso(e.at_ms),
                "finished_at": None,
                "outcome": None,
                "error": None,
                "duration_ms": None,
            }
        elif current is not None and e.kind in _OUTCOMES:
            current.update(
                finished_at=iso(e.at_ms),
                outcome=e.kind,
                error=None if e.kind == "SUCCEEDED" else e.error,
                duration_ms=e.duration_ms,
            )
            out.append(current)
            current = None
    if current is not None:
        out.append(current)
    return out


def _paged(read: Callable[[], Page[T]]) -> Page[T]:
    """Run a paged read; a cursor the store cannot parse is the caller's fault (400)."""
    try:
        return read()
    except Conflict as exc:
        raise ApiError(400, "invalid_cursor", str(exc), field="cursor") from None
