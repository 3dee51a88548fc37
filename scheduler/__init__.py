"""jobq: a fault-tolerant job scheduler for Python.

Delayed, cron and instant jobs in four priority tiers, dispatched at-least-once and executed
effectively-once under fenced leases, with retries, a dead-letter queue and an HTTP API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobq.app import App, JobHandle, Task, default_app, task
    from jobq.client import Client, JobView, Submitted
    from jobq.clock import Clock, ManualClock, SystemClock
    from jobq.deployment import Deployment
    from jobq.errors import (
        ConfigError,
        Conflict,
        Fail,
        IdempotencyConflict,
        InvalidCron,
        InvalidJob,
        JobNotFound,
        JobqError,
        MissingExtra,
        ResultError,
        ResultExpired,
        ResultNotKept,
        ResultTimeout,
        Retry,
        ScheduleError,
        SoftTimeLimitExceeded,
        StoreError,
        TaskCancelled,
        TaskError,
        TaskFailed,
        TransportError,
        UnknownTask,
        UnknownTimezone,
    )
    from jobq.models import (
        DstGap,
        DstOverlap,
        Job,
        JobStatus,
        MisfirePolicy,
        OverlapPolicy,
        Priority,
        RetryPolicy,
        Run,
        RunState,
        ScheduleType,
        TaskTarget,
        WebhookTarget,
    )
    from jobq.periodic import Periodic, SyncReport
    from jobq.results import ResultState, RunResult
    from jobq.schedules import CronSchedule, next_fire_times
    from jobq.settings import Settings
    from jobq.submission import JobSpec
    from jobq.tasks import TaskContext, current_context

# The public names are imported when first used (PEP 562), so `import jobq.cli` (every `jobq`
# command) and `import jobq.daemons...` pay only for what they use: `jobq --help` stays fast.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("App", "JobHandle", "Task", "default_app", "task"), "jobq.app"),
    **dict.fromkeys(("Client", "JobView", "Submitted"), "jobq.client"),
    **dict.fromkeys(("Clock", "ManualClock", "SystemClock"), "jobq.clock"),
    **dict.fromkeys(("Deployment",), "jobq.deployment"),
    **dict.fromkeys(
        (
            "ConfigError",
            "Conflict",
            "Fail",
            "IdempotencyConflict",
            "InvalidCron",
            "InvalidJob",
            "JobNotFound",
            "JobqError",
            "MissingExtra",
            "ResultError",
            "ResultExpired",
            "ResultNotKept",
            "ResultTimeout",
            "Retry",
            "ScheduleError",
            "SoftTimeLimitExceeded",
            "StoreError",
            "TaskCancelled",
            "TaskError",
            "TaskFailed",
            "TransportError",
            "UnknownTask",
            "UnknownTimezone",
        ),
        "jobq.errors",
    ),
    **dict.fromkeys(
        (
            "DstGap",
            "DstOverlap",
            "Job",
            "JobStatus",
            "MisfirePolicy",
            "OverlapPolicy",
            "Priority",
            "RetryPolicy",
            "Run",
            "RunState",
            "ScheduleType",
            "TaskTarget",
            "WebhookTarget",
        ),
        "jobq.models",
    ),
    **dict.fromkeys(("Periodic", "SyncReport"), "jobq.periodic"),
    **dict.fromkeys(("ResultState", "RunResult"), "jobq.results"),
    **dict.fromkeys(("CronSchedule", "next_fire_times"), "jobq.schedules"),
    **dict.fromkeys(("Settings",), "jobq.settings"),
    **dict.fromkeys(("JobSpec",), "jobq.submission"),
    **dict.fromkeys(("TaskContext", "current_context"), "jobq.tasks"),
}

__version__ = "0.1.0"

__all__ = [
    # Python API
    "App",
    "JobHandle",
    "Task",
    "default_app",
    "task",
    "Periodic",
    "SyncReport",
    "TaskContext",
    "current_context",
    # control plane
    "Client",
    "JobView",
    "Submitted",
    "JobSpec",
    # results
    "RunResult",
    "ResultState",
    # model
    "Job",
    "Run",
    "JobStatus",
    "RunState",
    "Priority",
    "RetryPolicy",
    "ScheduleType",
    "MisfirePolicy",
    "OverlapPolicy",
    "DstGap",
    "DstOverlap",
    "TaskTarget",
    "WebhookTarget",
    # schedules
    "CronSchedule",
    "next_fire_times",
    # configuration and wiring
    "Settings",
    "Deployment",
    "connect",
    "Clock",
    "SystemClock",
    "ManualClock",
    # errors
    "JobqError",
    "ConfigError",
    "MissingExtra",
    "InvalidJob",
    "ScheduleError",
    "InvalidCron",
    "UnknownTimezone",
    "UnknownTask",
    "StoreError",
    "JobNotFound",
    "Conflict",
    "IdempotencyConflict",
    "TransportError",
    "TaskError",
    "Retry",
    "Fail",
    "ResultError",
    "TaskFailed",
    "TaskCancelled",
    "ResultExpired",
    "ResultNotKept",
    "ResultTimeout",
    "SoftTimeLimitExceeded",
    "__version__",
]


def __getattr__(name: str) -> object:
    # `jobq.connect` is the composition root's: imported when asked for, so that importing jobq
    # (or any daemon) never imports every backend's wiring.
    if name == "connect":
        from jobq.wiring import connect

        return connect
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jobq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
