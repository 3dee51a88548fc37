"""Every error jobq raises, in one tree.

    JobqError
    ├── ConfigError                 a setting or URL is wrong (names the key and the value)
    │   ├── MissingExtra            an optional backend's extra is not installed
    │   └── StoreMissing            a read-only command found no store (it never creates one)
    ├── InvalidJob                  input is refused (at the edge: nothing was written)
    │   ├── InvalidQuery            a list filter or cursor holding text no store can hold
    │   ├── ScheduleError
    │   │   ├── InvalidCron
    │   │   ├── UnknownTimezone
    │   │   └── MissedWindow        a one-off due before its catch-up window
    │   ├── UnknownTask
    │   ├── PayloadTooLarge
    │   └── EndpointRefused     a webhook endpoint the network policy refuses (SSRF guard)
    ├── StoreError                  `retryable` says whether trying again may help
    │   ├── NotFound
    │   │   ├── JobNotFound
    │   │   └── RunNotFound
    │   ├── Conflict
    │   │   ├── DuplicateJob
    │   │   ├── IdempotencyConflict
    │   │   └── TransitionRejected  a compare-and-set lost: state or fence moved
    │   └── StoreUnavailable
    ├── TransportError
    │   └── TransportUnavailable
    ├── IllegalTransition           a bug: code asked for a transition the table forbids
    ├── ResultError                 a run's result cannot be returned (`JobHandle.get`, `Client.result`)
    │   ├── TaskFailed              the run failed for good: the task's error type and message
    │   ├── TaskCancelled           the run was cancelled before it finished
    │   ├── ResultExpired           the run succeeded, but its result outlived `result_ttl_s`
    │   ├── ResultNotKept           the task returned a value that is not JSON, or is too large
    │   └── ResultTimeout           (also a TimeoutError) the run did not finish in time
    └── TaskError                   raised by task code to steer the outcome
        ├── Retry
        ├── Fail
        ├── SoftTimeLimitExceeded   raised inside a task at its soft time limit, so it can clean up
        └── WebhookFailed           a webhook attempt failed; says if it is retryable

Foreign exceptions (sqlite3, redis, botocore, kombu, psycopg) are translated into this tree
at the backend that meets them and never escape it.
"""

from __future__ import annotations

from typing import Any

from jobq.instants import to_iso
from jobq.redaction import redact_text, redact_value


class JobqError(Exception):
    """Root of every error jobq raises on purpose."""

    retryable: bool = False


class ConfigError(JobqError):
    """`key` and `value` as given, but a secret never: passwords and secret parameters in the value
    and the reason are redacted (`jobq.redaction`) before they reach the message or `value`."""

    def __init__(self, key: str, value: object, reason: str) -> None:
        shown = redact_value(key, value)
        super().__init__(redact_text(f"{key}={shown!r}: {reason}"))
        self.key = key
        self.value = shown


class StoreMissing(ConfigError):
    def __init__(self, where: str) -> None:
        JobqError.__init__(self, f"no jobq store at {where} (start `jobq dev`, or run `jobq init`)")
        self.key = "store"
        self.value = where


class MissingExtra(ConfigError):
    def __init__(self, feature: str, extra: str, module: str) -> None:
        JobqError.__init__(self, f"{feature} needs the '{module}' package: pip install 'jobq[{extra}]'")
        self.key = feature
        self.value = extra
        self.extra = extra


class InvalidJob(JobqError):
    """Input was refused at the edge (a submission, or a query's text); nothing was written.
    `field` names the offending input when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidQuery(InvalidJob):
    """A query's text (name prefix, tenant, cursor) holds NUL or a lone surrogate: no stored
    value can match it, and PostgreSQL refuses to compare it."""


class ScheduleError(InvalidJob):
    pass


class InvalidCron(ScheduleError):
    pass


class UnknownTimezone(ScheduleError):
    pass


class MissedWindow(ScheduleError):
    pass


class UnknownTask(InvalidJob):
    pass


class PayloadTooLarge(InvalidJob):
    pass


class EndpointRefused(InvalidJob):
    """A webhook endpoint the network policy refuses (bad scheme, credentials, or a refused address)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="target.endpoint")


class StoreError(JobqError):
    pass


class NotFound(StoreError):
    pass


class JobNotFound(NotFound):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r}")
        self.job_id = job_id


class RunNotFound(NotFound):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}")
        self.run_id = run_id


class Conflict(StoreError):
    pass


class DuplicateJob(Conflict):
    """`different`: raised by `Task.schedule`, which accepts an equal spec for an existing job id."""

    def __init__(self, job_id: str, *, different: bool = False) -> None:
        detail = " with a different spec (cancel it, or choose another job_id)" if different else ""
        super().__init__(f"a job with id {job_id!r} already exists{detail}")
        self.job_id = job_id


class IdempotencyConflict(Conflict):
    def __init__(self, key: str) -> None:
        super().__init__(f"Idempotency-Key {key!r} was already used with a different request body")
        self.key = key


class TransitionRejected(Conflict):
    """A compare-and-set found the run in another state or at another fence.

    `current` is the run as the store holds it (None when it does not exist).
    """

    def __init__(self, run_id: str, expected: str, current: Any = None) -> None:
        super().__init__(f"run {run_id!r}: expected {expected}, found {_describe(current)}")
        self.run_id = run_id
        self.current = current


def _describe(run: Any) -> str:
    if run is None:
        return "no such run"
    return f"state={run.state} fence={run.fence}"


class StoreUnavailable(StoreError):
    retryable = True


class TransportError(JobqError):
    pass


class TransportUnavailable(TransportError):
    retryable = True


class IllegalTransition(JobqError):
    pass


class ResultError(JobqError):
    """A run's result cannot be returned; `run_id` names the run."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class TaskFailed(ResultError):
    """The run ended FAILED (retries exhausted, or not retryable): `error_type` and `message` are
    the task's final error as the worker recorded it (`LeaseExpired` when a worker died holding it,
    `MISSED` when it was never dispatched in its window). `dead_letter` says whether it is on the
    dead-letter list; `result` is what the run kept (a webhook's `{status, body}`)."""

    def __init__(
        self, run_id: str, error_type: str, message: str, *, dead_letter: bool = False, result: Any = None
    ) -> None:
        super().__init__(f"run {run_id!r} failed: {error_type}: {message}", run_id=run_id)
        self.error_type = error_type
        self.message = message
        self.dead_letter = dead_letter
        self.result = result


class TaskCancelled(ResultError):
    def __init__(self, run_id: str, reason: str | None = None) -> None:
        super().__init__(f"run {run_id!r} was cancelled" + (f": {reason}" if reason else ""), run_id=run_id)
        self.reason = reason


class ResultExpired(ResultError):
    def __init__(self, run_id: str, expired_ms: int) -> None:
        super().__init__(f"the result of run {run_id!r} expired at {to_iso(expired_ms)}", run_id=run_id)
        self.expired_ms = expired_ms


class ResultNotKept(ResultError):
    """The run succeeded but its return value was not stored: `reason` says why."""

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"the result of run {run_id!r} was not kept: {reason}", run_id=run_id)
        self.reason = reason


class ResultTimeout(ResultError, TimeoutError):
    def __init__(self, run_id: str, timeout_s: float, state: str) -> None:
        super().__init__(f"run {run_id!r} did not finish within {timeout_s:g} s (state {state})", run_id=run_id)
        self.timeout_s = timeout_s
        self.state = state


class TaskError(JobqError):
    pass


class Retry(TaskError):
    """Raised by a task to retry this run after `delay_s` (or the policy's backoff when None).

    It still counts as an attempt; after the last one the run is dead-lettered.
    """

    retryable = True

    def __init__(self, reason: str = "retry requested", *, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class Fail(TaskError):
    """Raised by a task to fail this run now, with no further attempts."""


class SoftTimeLimitExceeded(TaskError):
    """Raised inside a running task when its soft time limit passes (`--soft-time-limit`), so it can
    clean up before the hard limit stops it. Caught or not, the attempt goes on; left uncaught it
    fails the attempt like any other exception (retried by the policy)."""

    retryable = True


class WebhookFailed(TaskError):
    """A webhook attempt failed. The worker reads `retryable`, `retry_after_s` and `result`
    (`{"status", "body"}` when the server answered) to decide and record the outcome."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after_s: float | None = None,
        result: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.result = result
