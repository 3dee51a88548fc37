"""Calling a task: arguments in, an `Outcome` out. No store, no broker: pools call this.

A task's exception becomes a failed outcome; an exception may say how it is to be treated
(webhook responses do): whether it is retryable, how long the server asked us to wait, and
what to keep on the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from jobq import logs, tracing
from jobq.daemons.worker.attempt import ERROR_MAX_CHARS, Outcome
from jobq.models import DEFAULT_TENANT, WEBHOOK_TASK, Job, WebhookTarget
from jobq.results import keepable
from jobq.tasks import TaskContext, TaskDef, WebhookCaller, bind_context, reset_context

RESULT_MAX_BYTES = 64 * 1024


def execute(task: TaskDef, ctx: TaskContext, payload: Any) -> Outcome:
    """Run `task` with the run's payload; never raises (but for BaseExceptions such as SystemExit).

    Every pool calls this, in the thread, greenlet, task or child process that runs the attempt,
    so this is where the attempt's context is set: the `jobq.execute` span (a child of the
    dispatch, `ctx.trace`) and the run's fields on every log line the task writes. An `async def`
    task runs to completion on an event loop of its own, in this thread (the asyncio pool awaits
    it on the pool's loop instead: `execute_async`)."""
    with _attempt(task, ctx) as finish:
        return finish(_call(task, ctx, payload))


async def execute_async(task: TaskDef, ctx: TaskContext, payload: Any) -> Outcome:
    """`execute` for the asyncio pool, on its running loop, with the same span and log context:
    an `async def` task is awaited there (a plain function must not block the loop, so the pool
    runs those through `execute` in a thread instead). Never raises an `Exception`; a
    cancellation (the hard time limit) propagates."""
    with _attempt(task, ctx) as finish:
        args, kwargs = arguments(payload)
        try:
            value = task.call(ctx, args, kwargs)
            if inspect.isawaitable(value):
                value = await _bound(ctx, value)
            outcome = Outcome(result=jsonable(value))
        except Exception as exc:
            outcome = failed(exc)
        return finish(outcome)


@contextlib.contextmanager
def _attempt(task: TaskDef, ctx: TaskContext) -> Iterator[Callable[[Outcome], Outcome]]:
    """The attempt's span and log context; yields `finish(outcome)`, which records a failure on
    the span and returns the outcome."""
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

        def finish(outcome: Outcome) -> Outcome:
            if outcome.exc is not None:
                tracing.record_error(span, outcome.exc, outcome.error or "")
            return outcome

        with logs.run_context({**fields, "trace_id": trace_id} if trace_id else fields):
            yield finish


def _call(task: TaskDef, ctx: TaskContext, payload: Any) -> Outcome:
    args, kwargs = arguments(payload)
    try:
        value = task.call(ctx, args, kwargs)
        if inspect.iscoroutine(value):
            value = asyncio.run(_bound(ctx, value))
        return Outcome(result=jsonable(value))
    except Exception as exc:
        return failed(exc)


def failed(exc: BaseException) -> Outcome:
    """The outcome of an execution that raised `exc`."""
    retryable = getattr(exc, "retryable", None)
    retry_after = getattr(exc, "retry_after_s", None)
    return Outcome(
        result=jsonable(getattr(exc, "result", None)),
        exc=exc,
        error=f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS],
        retryable=retryable if isinstance(retryable, bool) else None,
        retry_after_s=retry_after if isinstance(retry_after, int | float) else None,
    )


async def _bound(ctx: TaskContext, awaitable: Awaitable[Any]) -> Any:
    """Await with `ctx` as the current context (`jobq.current_context()` inside the coroutine)."""
    token = bind_context(ctx)
    try:
        return await awaitable
    finally:
        reset_context(token)


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
