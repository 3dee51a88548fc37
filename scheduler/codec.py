"""The wire envelope: the only place that knows what a transport message holds.

    {"v": 1, "run_id", "job_id", "tenant_id"?, "fence", "task", "priority", "attempt", "last"?, "payload"?,
     "trace"?, "not_before_ms"?}

`last` marks the run of a one-off or immediate job: its final outcome also completes the job.
`tenant_id` is the tenant of the job (job ids are per tenant); absent for the tenant `default`, so
messages of that tenant are what they were before job ids were scoped by tenant.

`not_before_ms` is set on a run handed over ahead of its due time (the scanner's look-ahead): the
worker holds the delivery and starts the run no earlier than that instant. A worker of a version
that does not know the field starts it at once, up to `dispatch_lookahead_s` early.

The payload travels inline when it is small; otherwise the worker reads it from the store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jobq.errors import TransportError
from jobq.models import DEFAULT_TENANT, Job, JobKey, Priority, Run

VERSION = 1
INLINE_PAYLOAD_MAX_BYTES = 8 * 1024
_MISSING = object()


class UndecodableMessage(TransportError):
    pass


@dataclass(frozen=True, slots=True)
class Envelope:
    run_id: str
    job_id: str
    fence: int
    task: str
    priority: Priority
    attempt: int
    payload: Any = _MISSING  # _MISSING: not inlined, read it from the store
    trace: str | None = None
    last: bool = False
    tenant_id: str = DEFAULT_TENANT
    not_before_ms: int | None = None  # handed over early: start no earlier than this

    @property
    def payload_inline(self) -> bool:
        return self.payload is not _MISSING

    @property
    def job_key(self) -> JobKey:
        return JobKey(self.tenant_id, self.job_id)


def envelope_for(run: Run, job: Job, trace: str | None = None, not_before_ms: int | None = None) -> Envelope:
    """The message that dispatches `run` (of `job`) at its current fence and attempt; `trace` is the
    traceparent the worker's spans continue (the dispatch span's); `not_before_ms`, for a run
    dispatched ahead of its due time, the instant before which it must not start."""
    return Envelope(
        run.run_id,
        run.job_id,
        run.fence,
        job.task_name,
        run.priority,
        run.attempt,
        job.payload,
        trace=trace,
        last=job.completed_by(run.nominal_ms),
        tenant_id=run.tenant_id,
        not_before_ms=not_before_ms,
    )


def encode(envelope: Envelope) -> bytes:
    doc: dict[str, Any] = {
        "v": VERSION,
        "run_id": envelope.run_id,
        "job_id": envelope.job_id,
        "fence": envelope.fence,
        "task": envelope.task,
        "priority": envelope.priority.value,
        "attempt": envelope.attempt,
    }
    if envelope.tenant_id != DEFAULT_TENANT:
        doc["tenant_id"] = envelope.tenant_id
    if envelope.trace:
        doc["trace"] = envelope.trace
    if envelope.last:
        doc["last"] = True
    if envelope.not_before_ms is not None:
        doc["not_before_ms"] = envelope.not_before_ms
    if envelope.payload is not _MISSING:
        payload = json.dumps(envelope.payload, separators=(",", ":"))
        if len(payload) <= INLINE_PAYLOAD_MAX_BYTES:
            doc["payload"] = envelope.payload
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(body: bytes) -> Envelope:
    try:
        doc = json.loads(body)
        if doc.get("v") != VERSION:
            raise UndecodableMessage(f"unsupported envelope version {doc.get('v')!r}")
        return Envelope(
            run_id=str(doc["run_id"]),
            job_id=str(doc["job_id"]),
            fence=int(doc["fence"]),
            task=str(doc["task"]),
            priority=Priority(doc["priority"]),
            attempt=int(doc["attempt"]),
            payload=doc.get("payload", _MISSING),
            trace=doc.get("trace"),
            last=bool(doc.get("last", False)),
            tenant_id=str(doc.get("tenant_id", DEFAULT_TENANT)),
            not_before_ms=None if doc.get("not_before_ms") is None else int(doc["not_before_ms"]),
        )
    except UndecodableMessage:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UndecodableMessage(f"not a jobq envelope: {exc}") from exc
