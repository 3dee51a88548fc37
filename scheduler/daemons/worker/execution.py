"""Calling a task: arguments in, an `Outcome` out. No store, no broker: pools call this.

A task's exception becomes a failed outcome; an exception may say how it is to be treated
(webhook responses do): whether it is retryable, how long the server asked us to wait, and
what to keep on the run.
"""

from __future__ import annotations

from typing import Any

from jobq import logs, tracing
from jobq.daemons.worker.attempt import ERROR_MAX_CHARS, Outcome
from jobq.models import DEFAULT_TENANT, WEBHOOK_TASK, Job, WebhookTarget
from jobq.results import keepable
from jobq.tasks import TaskContext, TaskDef, WebhookCaller

RESULT_MAX_BYTES = 64 * 1024


def execute(task: TaskDef, ctx: TaskContext, payload: Any) -> Outcome:
    """Run `task` with the run's payload; never raises (but for BaseExceptions such as SystemExit).

    Every pool calls this, in the thread, greenlet, task or child process that runs the attempt,
    so this is where the attempt's context is set: the `jobq.execute` span (a child of the
    dispatch, `ctx.trace`) and the run's fields on every log line the task writes."""
    fields: tracing.Attributes = {
        "job_id": ctx.job_id,
        "run_id": ctx.run_id,
        "attempt": ctx.attempt,
        "fence": ctx.fence,
    }
    if ctx.tenant_id != DEFAULT_TENANT:
        fields["tenant_id"] = ctx.tenant_id
    attributes: tracing.Attributes = {
        **{f"jobq.{k}": v for k, v in fields.items()},
        "jobq.task": ctx.task,
        "jobq.tier": ctx.tier,
        "jobq.lateness_ms": ctx.lateness_ms,
        "jobq.worker_id": ctx.worker_id,
        "messaging.system": "jobq",
        "messaging.operation.type": "process",
        "messaging.destination.name": ctx.tier,
        "messaging.message.id": ctx.run_id,
    }
    with tracing.span(f"jobq.execute {ctx.task}", parent=ctx.trace, kind="consumer", attributes=attributes) as span:
        trace_id = tracing.trace_id_of(tracing.traceparent_of(span) or ctx.trace)
        with logs.run_context({**fields, "trace_id": trace_id} if trace_id else fields):
            outcome = _call(task, ctx, payload)
        if outcome.exc is not None:
            tracing.record_error(span, outcome.exc, outcome.error or "")
        return outcome


def _call(task: TaskDef, ctx: TaskContext, payload: Any) -> Outcome:
    args, kwargs = arguments(payload)
    try:
        return Outcome(result=jsonable(task.call(ctx, args, kwargs)))
    except Exception as exc:
        retryable = getattr(exc, "retryable", None)
        retry_after = getattr(exc, "retry_after_s", None)
        return Outcome(
            result=jsonable(getattr(exc, "result", None)),
            exc=exc,
            error=f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS],
            retryable=retryable if isinstance(retryable, bool) else None,
            retry_after_s=retry_after if isinstance(retry_after, int | float) else None,
        )


def arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    """A TASK payload is `{"args": [...], "kwargs": {...}}`; anything else is one argument."""
    if payload is None:
        return [], {}
    if isinstance(payload, dict) and set(payload) <= {"args", "kwargs"}:
        return list(payload.get("args", [])), dict(payload.get("kwargs", {}))
    return [payload], {}


def jsonable(value: Any) -> Any:
    """What to keep of a task's return value on the run: itself when it is JSON of at most
    `RESULT_MAX_BYTES`, else a marker saying why it was not kept (`jobq.results.keepable`)."""
    return keepable(value, RESULT_MAX_BYTES)


def webhook_task(caller: WebhookCaller, job: Job) -> TaskDef:
    """The built-in task that calls the job's HTTP target (the caller reads target and payload)."""

    def call(ctx: TaskContext) -> Any:
        return caller(job, ctx)

    timeout = job.target.timeout_seconds + 5 if isinstance(job.target, WebhookTarget) else None
    return TaskDef(WEBHOOK_TASK, call, timeout_s=timeout, bind=True)
