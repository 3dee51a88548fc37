"""Registered task functions, and the context a running task can read.

@app.task(name="billing.aggregate", priority="HIGH", retry=RetryPolicy(max_retries=5))
def aggregate(cycle: str) -> None:
    ctx = jobq.current_context()      # run_id, attempt, fence, lease_lost
"""

from __future__ import annotations

import contextvars
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from jobq.models import Job, Priority, RetryPolicy, TaskInfo

_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar("jobq_task_context", default=None)


class Flag:
    """A `threading.Event` that costs nothing until something waits on it: every run carries two
    (`lease_lost`, `cancelled`) and almost none is ever waited on, while an Event allocates a
    Condition and a lock up front. `set`, `is_set`, `clear` and `wait` behave as the Event's.

    Its truth is its state, so `if ctx.lease_lost:` reads as it should (an Event is always
    truthy, which made that natural check always true)."""

    __slots__ = ("_event", "_set")
    _creating = threading.Lock()

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def __bool__(self) -> bool:
        return self._set

    def __repr__(self) -> str:
        return f"Flag({'set' if self._set else 'clear'})"

    def set(self) -> None:
        self._set = True
        with Flag._creating:  # a waiter that created its Event before this sees it set
            event = self._event
        if event is not None:
            event.set()

    def clear(self) -> None:
        self._set = False
        with Flag._creating:
            event = self._event
        if event is not None:
            event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        with Flag._creating:  # a `set` before this point is seen here
            if self._event is None:
                self._event = threading.Event()
                if self._set:
                    self._event.set()
            event = self._event
        return event.wait(timeout)


@dataclass
class TaskContext:
    """What a running task knows about its run. Pass `fence` to downstream writes so a stale
    attempt cannot overwrite a newer one; stop early when `lease_lost` is set.

    `lease_lost` and `cancelled` are true once set (`if ctx.lease_lost: return`); a task that
    blocks can wait on either with `ctx.cancelled.wait(timeout_s)`."""

    run_id: str
    job_id: str
    attempt: int
    fence: int
    task: str
    worker_id: str
    lease_lost: Flag = field(default_factory=Flag)
    cancelled: Flag = field(default_factory=Flag)
    tenant_id: str = "default"  # the job's tenant: job ids are per tenant
    tier: str = "default"  # the queue it came from: critical, high, default, low
    lateness_ms: int = 0  # how long after its due time this attempt started
    trace: str | None = None  # the W3C traceparent its execution span continues (`jobq.tracing`)

    @property
    def should_stop(self) -> bool:
        return self.lease_lost.is_set() or self.cancelled.is_set()


def current_context() -> TaskContext:
    """The context of the task running in this thread; raises outside a task."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("current_context() is only available inside a running jobq task")
    return ctx


def bind_context(ctx: TaskContext | None) -> contextvars.Token[TaskContext | None]:
    return _current.set(ctx)


def reset_context(token: contextvars.Token[TaskContext | None]) -> None:
    _current.reset(token)


class WebhookCaller(Protocol):
    """Calls a job's HTTP_WEBHOOK target for one attempt. Returns what to keep on the run
    (status and the start of the body); raises an exception with `retryable`, `retry_after_s`
    and `result` attributes to steer the retry decision."""

    def __call__(self, job: Job, ctx: TaskContext) -> Any: ...


@dataclass(frozen=True)
class TaskDef:
    name: str
    fn: Callable[..., Any]
    priority: Priority = Priority.DEFAULT
    retry: RetryPolicy | None = None  # None: the job's (default) policy
    timeout_s: float | None = None
    bind: bool = False  # pass the TaskContext as the first argument

    def info(self, worker_id: str, now_ms: int) -> TaskInfo:
        """This task's entry in the task catalogue, as `worker_id` publishes it at `now_ms`."""
        return TaskInfo(
            name=self.name,
            priority=self.priority,
            retry=self.retry,
            timeout_s=self.timeout_s,
            queue=self.priority.queue,
            parameters=_parameters(self.fn, skip_first=self.bind),
            worker_id=worker_id,
            published_ms=now_ms,
        )

    def call(self, ctx: TaskContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
        token = bind_context(ctx)
        try:
            return self.fn(ctx, *args, **kwargs) if self.bind else self.fn(*args, **kwargs)
        finally:
            reset_context(token)


class TaskRegistry:
    def __init__(self) -> None:
        self._tasks: dict[str, TaskDef] = {}
        self._lock = threading.Lock()

    def add(self, task: TaskDef) -> None:
        with self._lock:
            existing = self._tasks.get(task.name)
            # The same function registered again (a module imported twice, a reload) is fine.
            if existing is not None and _qualname(existing.fn) != _qualname(task.fn):
                raise ValueError(f"task name {task.name!r} is already registered to {existing.fn!r}")
            self._tasks[task.name] = task

    def get(self, name: str) -> TaskDef | None:
        return self._tasks.get(name)

    def names(self) -> set[str]:
        return set(self._tasks)

    def __iter__(self) -> Iterator[TaskDef]:
        return iter(list(self._tasks.values()))

    def __len__(self) -> int:
        return len(self._tasks)


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


def _parameters(fn: Callable[..., Any], *, skip_first: bool) -> tuple[str, ...]:
    """The function's parameters as written (`"customer_id: int"`, `"dry_run: bool = False"`)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or a C callable without a signature
        return ()
    return tuple(_parameter(p) for p in params[1 if skip_first else 0 :])


def _parameter(p: inspect.Parameter) -> str:
    """As written in the source, whether annotations are objects or (postponed) strings."""
    prefix = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
    text = prefix + p.name
    if p.annotation is not p.empty:
        annotation: str = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
        text += f": {annotation}"
    if p.default is not p.empty:
        text += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
    return text
