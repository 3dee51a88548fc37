"""The Python API: an `App` holds registered tasks and a (lazily connected) deployment.

app = App(store="sqlite:///jobq.db")

@app.task(priority="HIGH", retry=RetryPolicy(max_retries=5), timeout_s=60)
def send_invoice(invoice_id: int) -> None: ...

send_invoice.delay(42)                                  # now
await send_invoice.adelay(42)                           # now, from asyncio code
send_invoice.schedule(delay_s=45, args=(42,))           # in 45 s
send_invoice.schedule(cron="0 2 1 * *", tz="America/New_York", args=(42,), job_id="monthly-42")

@app.periodic(cron="0 2 1 * *", tz="America/New_York")  # synced when workers or beat start
def monthly_billing() -> None: ...
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, ParamSpec, TypeVar, overload

from jobq.client import Client, Submitted
from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.deployment import Deployment
from jobq.errors import DuplicateJob, InvalidJob, ResultTimeout, TaskCancelled
from jobq.groupcommit import off_loop
from jobq.models import (
    DstGap,
    DstOverlap,
    JobKey,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    Priority,
    RetryPolicy,
    Run,
    ScheduleType,
)
from jobq.periodic import Periodic, SyncReport, check_entries, sync
from jobq.settings import Settings
from jobq.submission import JobSpec
from jobq.tasks import TaskDef, TaskRegistry

# The argument of `Task.schedule` that sets each JobSpec field, for error messages.
_ARGUMENTS = {
    "job_name": "name",
    "cron_expression": "cron",
    "timezone": "tz",
    "run_at": "at",
    "delay_seconds": "delay_s",
    "payload": "args/kwargs",
    "retry_policy": "retry",
    "catchup_window_seconds": "catchup_window_s",
    "jitter_seconds": "jitter_s",
    "misfire_policy": "misfire",
    "overlap_policy": "overlap",
}

P = ParamSpec("P")
R = TypeVar("R")


class JobHandle:
    """A submitted job: its id (and key: its tenant and id), and shortcuts to follow it."""

    def __init__(self, app: App, submitted: Submitted) -> None:
        self.app = app
        self.job = submitted.job
        self.job_id = submitted.job.job_id
        self.key = submitted.job.key
        self.created = submitted.created
        self.next_fire_times = submitted.next_fire_times
        self._run_id: str | None = None

    def wait(self, timeout_s: float = 30.0) -> Run:
        """Block until the job's current run finishes; returns the run (check `.state`, `.result`)."""
        return self.app.client.wait(self.key, timeout_s=timeout_s)

    def get(self, timeout: float | None = 30.0) -> Any:
        """The task's return value, waiting up to `timeout` seconds (None: forever) for the job's run
        to finish: for `delay()` and a one-off, its only run; for a cron job, its current run (the
        oldest unfinished one, waiting for the next fire when none is open).

        Raises `jobq.TaskFailed` with the task's final error (`error_type`, `message`) once retries
        are exhausted, `TaskCancelled`, `ResultExpired` (older than `result_ttl_s`), `ResultNotKept`
        (not JSON, or larger than 64 KiB), or `ResultTimeout` (a `TimeoutError`)."""
        client = self.app.client
        deadline = None if timeout is None else time.monotonic() + timeout
        run_id = self._run_id
        pause = 0.02
        while run_id is None:
            view = client.get(self.key)
            if view.current_run is not None:
                run_id = view.current_run.run_id
                break
            if view.job.status is JobStatus.CANCELLED:
                raise TaskCancelled(f"{self.key}:(no run yet)", "the job was cancelled before its first run")
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(f"{self.key}:(no run yet)", timeout or 0.0, "no run yet")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)
        if not self.job.recurring:
            self._run_id = run_id  # a one-off has one run: look it up once
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return client.result(run_id, timeout_s=left)

    def cancel(self) -> None:
        self.app.client.cancel(self.key)

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"


class Task(Generic[P, R]):
    """A registered task. Calling it runs it here; `delay` and `schedule` run it on a worker."""

    def __init__(self, app: App, definition: TaskDef) -> None:
        self.app = app
        self.definition = definition
        self.name = definition.name
        functools.update_wrapper(self, definition.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.definition.fn(*args, **kwargs)
        return result

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """Run as soon as a worker is free."""
        return self.schedule(args=args, kwargs=kwargs)

    async def adelay(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """`delay` for asyncio code: returns once the job is durable, without blocking the event
        loop (the submission runs on a submission thread and shares store transactions with
        concurrent ones: `jobq.groupcommit`)."""
        return await off_loop(functools.partial(self.schedule, args=args, kwargs=kwargs))

    async def aschedule(self, **options: Any) -> JobHandle:
        """`schedule` for asyncio code (same keyword arguments), as `adelay` runs `delay`."""
        return await off_loop(functools.partial(self.schedule, **options))

    def schedule(
        self,
        *,
        at: datetime | int | str | None = None,
        delay_s: float | None = None,
        cron: str | None = None,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        priority: Priority | str | None = None,
        retry: RetryPolicy | None = None,
        job_id: str | None = None,
        name: str | None = None,
        tenant_id: str = "default",
        misfire: MisfirePolicy | str = MisfirePolicy.FIRE_ONCE_NOW,
        catchup_window_s: int = 86_400,
        overlap: OverlapPolicy | str = OverlapPolicy.SKIP,
        jitter_s: int = 0,
        dst_gap: DstGap | str = DstGap.SKIP,
        dst_overlap: DstOverlap | str = DstOverlap.ONCE,
        idempotency_key: str | None = None,
    ) -> JobHandle:
        """Submit a job: `at` an instant, after `delay_s`, on a `cron` in `tz`, or now when none is given.

        Raises `InvalidJob` naming the argument (a bad cron, an unknown timezone, an instant
        outside 1970..9999 or missed, a negative, NaN or infinite delay, arguments that are not
        JSON or hold NUL or lone surrogates) having written nothing."""
        given = [x for x in (at, delay_s, cron) if x is not None]
        if len(given) > 1:
            raise InvalidJob("give at most one of at=, delay_s= and cron=")
        if cron is not None:
            kind = ScheduleType.CRON
        elif at is not None or delay_s is not None:
            kind = ScheduleType.ONE_OFF
        else:
            kind = ScheduleType.IMMEDIATE
        run_at: Any = at.isoformat() if isinstance(at, datetime) else at
        spec = JobSpec.parse(
            {
                "tenant_id": tenant_id,
                "job_id": job_id,
                "job_name": name or self.name,
                "schedule_type": kind,
                "cron_expression": cron,
                "timezone": tz,
                "run_at": run_at,
                "delay_seconds": delay_s,
                "priority": priority or self.definition.priority,
                "target": {"type": "TASK", "task": self.name},
                "payload": {"args": list(args), "kwargs": dict(kwargs or {})},
                "retry_policy": retry or self.definition.retry or RetryPolicy(),
                "misfire_policy": misfire,
                "catchup_window_seconds": catchup_window_s,
                "overlap_policy": overlap,
                "jitter_seconds": jitter_s,
                "dst_gap": dst_gap,
                "dst_overlap": dst_overlap,
                "timeout_seconds": self.definition.timeout_s,
            },
            names=_ARGUMENTS,
        )
        client = self.app.client
        try:
            submitted = client.submit_parsed(spec, idempotency_key=idempotency_key)
        except DuplicateJob:
            # A module that schedules a job id when imported is imported again by every worker: the
            # same spec names the job that exists; another spec is a real clash.
            key = JobKey(spec.tenant_id, spec.job_id or "")
            existing = client.store.get_jobs([key]).get(key)
            if existing is None or existing.spec_fingerprint != spec.fingerprint():
                raise DuplicateJob(spec.job_id or "", different=True) from None
            submitted = Submitted(existing, False)
        return JobHandle(self.app, submitted)

    def __repr__(self) -> str:
        return f"<jobq task {self.name}>"


class App:
    def __init__(
        self,
        name: str = "jobq",
        *,
        store: str | None = None,
        settings: Settings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        schedules: Sequence[Periodic] = (),
        **overrides: Any,
    ) -> None:
        """`name` identifies the app's declared schedules in the store (their job ids are
        `<name>.<entry>`): give every code base that shares a store its own."""
        self.name = name
        self.schedules: list[Periodic] = list(schedules)
        check_entries(name, self.schedules)  # a bad entry fails here, naming its argument
        self.registry = TaskRegistry()
        self.clock = clock
        self._settings = settings
        self._overrides = {"store": store, **overrides}
        self._deployment: Deployment | None = None
        self._lock = threading.Lock()
        self.dev_hooks: list[Callable[[App], None]] = []

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.load(self._overrides)
        return self._settings

    @property
    def deployment(self) -> Deployment:
        with self._lock:
            if self._deployment is None:
                from jobq.wiring import connect  # the composition root, only when first needed

                self._deployment = connect(self.settings, self.clock)
            return self._deployment

    def use(self, deployment: Deployment) -> None:
        """Share an existing deployment (the CLI connects once and hands it to the app)."""
        with self._lock:
            self._deployment = deployment
            self._settings = deployment.settings

    @property
    def client(self) -> Client:
        return Client(self.deployment)

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        priority: Priority | str = Priority.DEFAULT,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        bind: bool = False,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        priority: Priority | str = Priority.DEFAULT,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        bind: bool = False,
    ) -> Any:
        """Register a function as a task, named `module.function` unless `name` is given."""

        def register(func: Callable[..., Any]) -> Task[..., Any]:
            task_name = name or f"{func.__module__}.{func.__qualname__}"
            definition = TaskDef(task_name, func, Priority.parse(priority), retry, timeout_s, bind)
            self.registry.add(definition)
            return Task(self, definition)

        return register(fn) if fn is not None else register

    def periodic(
        self,
        *,
        cron: str,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        **options: Any,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register the function as a task (unless it is one already) and declare a schedule for it:
        `@app.periodic(cron="0 2 1 * *", tz="America/New_York")`. `options` are `Periodic`'s
        (priority, retry, tenant_id, misfire, overlap, ...). Workers and beat sync the declared
        schedules when they start (`sync_schedules`). Raises `InvalidJob` naming the argument."""

        def declare(fn: Callable[P, R]) -> Task[P, R]:
            registration = {k: options[k] for k in ("priority", "retry", "timeout_s") if options.get(k) is not None}
            registered: Task[P, R] = fn if isinstance(fn, Task) else self.task(**registration)(fn)
            entry = Periodic(registered.name, cron, tz, tuple(args), kwargs, name, **options)
            check_entries(self.name, [*self.schedules, entry])
            self.schedules.append(entry)
            return registered

        return declare

    def sync_schedules(self) -> SyncReport:
        """Make the store hold exactly this app's declared schedules: create the absent, update the
        changed, pause the removed (`jobq.periodic`). Idempotent; safe from many processes at once."""
        return sync(self.client, self.name, self.schedules, self.registry)

    def on_dev_start(self, fn: Callable[[App], None]) -> Callable[[App], None]:
        """Register `fn(app)` to run when `jobq dev` starts, e.g. to seed example jobs.
        Workers never call it, so importing the module stays free of side effects."""
        self.dev_hooks.append(fn)
        return fn

    def close(self) -> None:
        with self._lock:
            if self._deployment is not None:
                self._deployment.close()
                self._deployment = None


default_app = App()


def task(fn: Callable[P, R] | None = None, /, **options: Any) -> Any:
    """`@jobq.task` registers on the default app (configured from `JOBQ_*` variables)."""
    return default_app.task(fn, **options) if fn is not None else default_app.task(**options)
