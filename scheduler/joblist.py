"""Jobs as `jobq list` shows them: light rows, read without pydantic.

`jobq list` is run by hand and by scripts, many times a minute: it must start fast. Building the
pydantic models (`jobq.models`, `jobq.settings`) costs more than everything else the command
does, so the listing works on `JobRow`, a plain record of the fields it shows, decoded here from
a stored job document with the standard library.

The decoding is *conservative*: `row_from_doc` accepts a document only when every field has
exactly the shape `jobq.models.Job` would accept (known keys, JSON types, enum values, ranges),
and returns None for anything else: a document a pydantic decode could call corrupt, or one
merely written in a form this check does not know. A caller that gets None for any row falls
back to the full path (`Job` through pydantic), which names corrupt records exactly as every
other command does. So the light path never shows a record differently from the full one; it
only skips the cost when it can prove the record is sound. tests/test_joblist.py checks both
directions: the field sets and enum values against the models, and that every document accepted
here is accepted by `Job` with the same displayed values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobq.instants import to_iso
from jobq.texts import text_problem

if TYPE_CHECKING:
    from jobq.models import Job

DEFAULT_TENANT = "default"  # jobq.models.DEFAULT_TENANT
# The values of jobq.models' enums (tests/test_joblist.py checks they agree).
PRIORITY_RANKS = {"CRITICAL": 0, "HIGH": 1, "DEFAULT": 2, "LOW": 3}
JOB_STATUSES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELLED", "QUARANTINED")
SCHEDULE_TYPES = ("ONE_OFF", "CRON", "IMMEDIATE")
MISFIRE_POLICIES = ("fire_once_now", "skip", "fire_all")
OVERLAP_POLICIES = ("SKIP", "BUFFER_ONE", "BUFFER_ALL", "CANCEL_OTHER", "ALLOW_ALL")
DST_GAPS = ("skip", "shift")
DST_OVERLAPS = ("once", "twice")
WEBHOOK_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_PAYLOAD_DEPTH = 64  # jobq.bounds.MAX_PAYLOAD_DEPTH


@dataclass(frozen=True, slots=True)
class JobRow:
    """What a listing shows of a job. `status` is the stored job status; `task` is None for a
    webhook job; `corrupt` is set only on rows made from a corrupt marker (the full path)."""

    job_id: str
    tenant_id: str
    name: str
    status: str
    status_reason: str | None
    schedule_type: str
    cron: str | None
    cron_source: str | None
    at_ms: int | None
    timezone: str
    priority: str
    task: str | None
    created_ms: int
    updated_ms: int
    corrupt: str | None = None

    @classmethod
    def from_job(cls, job: Job) -> JobRow:
        """The row of a decoded job (a corrupt marker included)."""
        from jobq.models import TaskTarget  # loaded already: `job` is one of its models

        schedule = job.schedule
        return cls(
            job_id=job.job_id,
            tenant_id=job.tenant_id,
            name=job.name,
            status=job.status.value,
            status_reason=job.status_reason,
            schedule_type=schedule.type.value,
            cron=schedule.cron,
            cron_source=schedule.cron_source,
            at_ms=schedule.at_ms,
            timezone=schedule.timezone,
            priority=job.priority.value,
            task=job.target.task if isinstance(job.target, TaskTarget) else None,
            created_ms=job.created_ms,
            updated_ms=job.updated_ms,
            corrupt=job.corrupt,
        )

    def summary(self) -> dict[str, Any]:
        """The job as `GET /v1/jobs` and `jobq list --json` list it."""
        return {
            "job_id": self.job_id,
            "tenant_id": self.tenant_id,
            "job_name": self.name,
            "job_status": self.status,
            "status_reason": self.status_reason,
            "corrupt": self.corrupt,
            "schedule_type": self.schedule_type,
            "cron_expression": self.cron,
            "cron_source": self.cron_source or self.cron,
            "timezone": self.timezone,
            "priority": self.priority,
            "task": self.task,
            "created_at": to_iso(self.created_ms),
            "updated_at": to_iso(self.updated_ms),
        }

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant_id, self.job_id)

    @property
    def final_run_id(self) -> str | None:
        """The run whose outcome completes a one-off or immediate job (`Run.make_id`); None for cron."""
        if self.schedule_type == "CRON" or self.at_ms is None:
            return None
        return make_run_id(self.tenant_id, self.job_id, self.at_ms)


def make_run_id(tenant_id: str, job_id: str, nominal_ms: int) -> str:
    """As `jobq.models.Run.make_id`: `job_id:ms` for the tenant `default`, else `tenant/job_id:ms`."""
    job = job_id if tenant_id == DEFAULT_TENANT else f"{tenant_id}/{job_id}"
    return f"{job}:{nominal_ms}"


def job_cursor_of(job_id: str, tenant_id: str) -> str:
    """Jobs are listed by (job id, tenant): two tenants may share an id."""
    return f"{job_id}|{tenant_id}"


def parse_job_cursor(cursor: str) -> tuple[str, str | None]:
    """(job id, tenant) of a job cursor; the tenant is None in a cursor from before job ids were
    scoped by tenant (a bare job id), which continues after every tenant's job of that id."""
    job_id, sep, tenant = cursor.partition("|")
    return job_id, tenant if sep else None


# -- the conservative decoder -------------------------------------------------------------------


class _Unsure(Exception):
    """The document is not one this module can vouch for."""


def _nan(_constant: str) -> Any:
    raise _Unsure  # NaN and infinities: left to pydantic's rules


def _text(value: Any, *, min_length: int = 0, max_length: int | None = None) -> str:
    if type(value) is not str or text_problem(value) is not None or len(value) < min_length:
        raise _Unsure
    if max_length is not None and len(value) > max_length:
        raise _Unsure
    return value


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _int(value: Any) -> int:
    if type(value) is not int or not -(2**63) <= value < 2**63:
        raise _Unsure
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _number(value: Any, low: float | None = None, high: float | None = None, *, above: float | None = None) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _Unsure
    if (low is not None and value < low) or (high is not None and value > high):
        raise _Unsure
    if above is not None and value <= above:
        raise _Unsure
    return float(value)


def _choice(value: Any, allowed: Iterable[str]) -> str:
    if type(value) is not str or value not in allowed:
        raise _Unsure
    return value


def _fields(doc: Any, checks: Mapping[str, Callable[[Any], Any]], required: Iterable[str]) -> dict[str, Any]:
    """Each field of the JSON object `doc` through its check; unknown or missing required keys are unsure."""
    if type(doc) is not dict or not set(doc) <= set(checks) or not set(required) <= set(doc):
        raise _Unsure
    return {name: checks[name](value) for name, value in doc.items()}


def _retry(doc: Any) -> Any:
    def errors(value: Any) -> Any:
        if type(value) is not list:
            raise _Unsure
        return [_text(v) for v in value]

    return _fields(
        doc,
        {
            "max_retries": lambda v: _number(_int(v), 0, 1000),
            "initial_interval_sec": lambda v: _number(v, 0, 86_400),
            "backoff_multiplier": lambda v: _number(v, 1.0, 100),
            "max_interval_sec": lambda v: _number(v, 0, 7 * 86_400),
            "non_retryable_errors": errors,
            "max_age_sec": lambda v: None if v is None else _number(v, above=0),
        },
        (),
    )


def _json_value(value: Any, depth: int) -> Any:
    """A payload: any JSON value whose text is storable, nested no deeper than the edge allows."""
    if depth > _PAYLOAD_DEPTH:
        raise _Unsure
    if type(value) is str:
        _text(value)
    elif type(value) is list:
        for item in value:
            _json_value(item, depth + 1)
    elif type(value) is dict:
        for key, item in value.items():
            _text(key)
            _json_value(item, depth + 1)
    elif type(value) is int:
        _int(value)
    return value


def _headers(value: Any) -> Any:
    if type(value) is not dict:
        raise _Unsure
    return {_text(k): _text(v) for k, v in value.items()}


def _target(doc: Any) -> dict[str, Any]:
    if type(doc) is not dict:
        raise _Unsure
    if doc.get("type") == "TASK":
        return _fields(doc, {"type": str, "task": lambda v: _text(v, min_length=1, max_length=200)}, ("type", "task"))
    if doc.get("type") == "HTTP_WEBHOOK":
        checks: dict[str, Callable[[Any], Any]] = {
            "type": str,
            "endpoint": lambda v: _text(v, min_length=1, max_length=2048),
            "method": lambda v: _choice(v, WEBHOOK_METHODS),
            "headers": _headers,
            "timeout_seconds": lambda v: _number(v, high=900, above=0),
        }
        return _fields(doc, checks, ("type", "endpoint"))
    raise _Unsure  # no tag, or an unknown one: pydantic's discriminator decides


def _schedule(doc: Any) -> dict[str, Any]:
    checks = {
        "type": lambda v: _choice(v, SCHEDULE_TYPES),
        "at_ms": _opt_int,
        "cron": _opt_text,
        "cron_source": _opt_text,
        "timezone": _text,
        "dst_gap": lambda v: _choice(v, DST_GAPS),
        "dst_overlap": lambda v: _choice(v, DST_OVERLAPS),
    }
    return _fields(doc, checks, ("type",))


#: Every field of `jobq.models.Job` as stored, with its check (the `corrupt` field is never stored).
_JOB_CHECKS: dict[str, Callable[[Any], Any]] = {
    "job_id": _text,
    "tenant_id": _text,
    "name": _text,
    "target": _target,
    "payload": lambda v: _json_value(v, 0),
    "schedule": _schedule,
    "priority": lambda v: _choice(v, PRIORITY_RANKS),
    "retry": _retry,
    "misfire_policy": lambda v: _choice(v, MISFIRE_POLICIES),
    "catchup_window_s": _int,
    "overlap_policy": lambda v: _choice(v, OVERLAP_POLICIES),
    "jitter_s": _int,
    "timeout_s": lambda v: None if v is None else _number(v),
    "status": lambda v: _choice(v, JOB_STATUSES),
    "status_reason": _opt_text,
    "next_fire_ms": _opt_int,
    "last_run_id": _opt_text,
    "paused_ms": _opt_int,
    "trace": _opt_text,
    "created_ms": _int,
    "updated_ms": _int,
    "version": _int,
    "declared_by": _opt_text,
    "spec_fingerprint": _opt_text,
}
_JOB_REQUIRED = ("job_id", "name", "target", "schedule", "created_ms", "updated_ms")


def row_from_doc(doc: str | bytes) -> JobRow | None:
    """The row of a stored job document, or None when this module cannot vouch for the document
    (the caller then decodes it through `jobq.models.Job`)."""
    try:
        data = json.loads(doc, parse_constant=_nan)
        job = _fields(data, _JOB_CHECKS, _JOB_REQUIRED)
    except (_Unsure, ValueError, RecursionError):
        return None
    schedule, target = job["schedule"], job["target"]
    return JobRow(
        job_id=job["job_id"],
        tenant_id=job.get("tenant_id", DEFAULT_TENANT),
        name=job["name"],
        status=job.get("status", "ACTIVE"),
        status_reason=job.get("status_reason"),
        schedule_type=schedule["type"],
        cron=schedule.get("cron"),
        cron_source=schedule.get("cron_source"),
        at_ms=schedule.get("at_ms"),
        timezone=schedule.get("timezone", "UTC"),
        priority=job.get("priority", "DEFAULT"),
        task=target["task"] if target["type"] == "TASK" else None,
        created_ms=job["created_ms"],
        updated_ms=job["updated_ms"],
    )


# -- choosing what to list ------------------------------------------------------------------------


#: A page reader: cursor -> (rows, next cursor).
PageReader = Callable[[str | None], tuple[list[JobRow], str | None]]
#: Outcomes of rows: FAILED for a COMPLETED one-off whose run was dead-lettered.
OutcomeReader = Callable[[list[JobRow]], dict[tuple[str, str], str]]


def newest_matching(
    read_page: PageReader,
    outcomes: OutcomeReader,
    *,
    task: str | None,
    wanted: str | None,
    limit: int,
    cursor: str | None,
    scan: int,
) -> tuple[list[JobRow], str | None, bool]:
    """The jobs to list: with a cursor, that page in id order; otherwise the newest `limit` of every
    match (read page by page, at most `scan` jobs), newest first. `wanted` is a shown status
    (`FAILED` included). Returns (rows, next cursor, scan cut short)."""

    def keep(row: JobRow, outcome: dict[tuple[str, str], str]) -> bool:
        if task is not None and row.task != task:
            return False
        return wanted is None or outcome.get(row.key, row.status) == wanted

    def judged(rows: list[JobRow]) -> dict[tuple[str, str], str]:
        return outcomes(rows) if wanted in ("FAILED", "COMPLETED") else {}

    if cursor is not None:
        rows, next_cursor = read_page(cursor)
        outcome = judged(rows)
        return [r for r in rows if keep(r, outcome)], next_cursor, False
    found: list[JobRow] = []
    seen, at = 0, None
    while True:
        rows, at = read_page(at)
        seen += len(rows)
        outcome = judged(rows)
        found += [r for r in rows if keep(r, outcome)]
        found = sorted(found, key=lambda r: (r.created_ms, r.job_id), reverse=True)[:limit]
        if at is None or seen >= scan:
            return found, None, at is not None
