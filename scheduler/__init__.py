"""jobq: a fault-tolerant job scheduler for Python.

Delayed, cron and instant jobs in four priority tiers, dispatched at-least-once and executed
effectively-once under fenced leases, with retries, a dead-letter queue and an HTTP API.
"""

from __future__ import annotations

from jobq.app import App, JobHandle, Task, default_app, task
from jobq.client import Client, JobView, Submitted
from jobq.clock import Clock, ManualClock, SystemClock
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
    Retry,
    ScheduleError,
    StoreError,
    TaskError,
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
from jobq.schedules import CronSchedule, next_fire_times
from jobq.settings import Settings
from jobq.submission import JobSpec
from jobq.tasks import TaskContext, current_context
from jobq.wiring import Deployment, connect

__version__ = "0.1.0"

__all__ = [
    # Python API
    "App",
    "JobHandle",
    "Task",
    "default_app",
    "task",
    "TaskContext",
    "current_context",
    # control plane
    "Client",
    "JobView",
    "Submitted",
    "JobSpec",
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
    "__version__",
]
