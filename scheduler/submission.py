"""Turning a submission into a job and its first runs, and materialising later runs.

`JobSpec` is the one input shape shared by the Python API, the CLI and `POST /v1/jobs`, and
`JobSpec.parse` the one way raw input becomes one: its fields are the bounded types of
`jobq.bounds` (text without NUL or lone surrogates, instants within 1970..9999, JSON payloads,
finite non-negative durations, retry values in range), and every refusal is an `InvalidJob`
naming the field. `Client.submit` parses whatever it is given again (a spec changed with
`model_copy(update=...)` or built with `model_construct` skipped validation), so nothing
invalid reaches a store. Then `build_job` applies the rules that need more than one field or
the clock (a bad cron, an unknown timezone, a missed one-off, an oversized payload, an unknown
task), also as `InvalidJob`, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from jobq.bounds import Instant, Payload, check_instant, check_text, invalid_job
from jobq.errors import InvalidCron, InvalidJob, MissedWindow, PayloadTooLarge, ScheduleError, UnknownTask
from jobq.ids import new_job_id
from jobq.instants import describe_range, in_range
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
    Schedule,
    ScheduleType,
    Target,
    TaskInfo,
    TaskTarget,
)
from jobq.schedules import cron_for, jitter_ms, next_fire, parse_cron, plan_fires, zone
from jobq.settings import Settings
from jobq.texts import text_problem
from jobq.tracing import fire_trace

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"  # visible ASCII: it travels in an HTTP header
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
_RUN_AT_TEXT_CHARS = 64

# Text fields: the length is checked first (so the message names it), then NUL and lone surrogates.
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_text)]
CronText = Annotated[str, Field(max_length=200), AfterValidator(check_text)]
Dialect = Annotated[str, Field(max_length=32), AfterValidator(check_text)]
ZoneName = Annotated[str, Field(max_length=64), AfterValidator(check_text)]


class JobSpec(BaseModel):
    """A job as submitted. Field names follow the HTTP API. Build one with `JobSpec.parse`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tenant_id: str = Field(default="default", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    job_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)
    job_name: Name | None = None
    schedule_type: ScheduleType
    cron_expression: CronText | None = None
    cron_dialect: Dialect = "unix"
    timezone: ZoneName = "UTC"
    # epoch ms or ISO 8601 (naive ISO is read in `timezone`); digits in a string are epoch ms
    run_at: Instant | Annotated[str, Field(min_length=1, max_length=_RUN_AT_TEXT_CHARS)] | None = None
    delay_seconds: float | None = Field(default=None, ge=0, le=366 * 86_400)
    priority: Priority = Priority.DEFAULT
    target: Target
    payload: Payload = None
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE_NOW
    catchup_window_seconds: int = Field(default=86_400, ge=0, le=366 * 86_400)
    overlap_policy: OverlapPolicy = OverlapPolicy.SKIP
    jitter_seconds: int = Field(default=0, ge=0, le=86_400)
    dst_gap: DstGap = DstGap.SKIP
    dst_overlap: DstOverlap = DstOverlap.ONCE
    timeout_seconds: float | None = Field(default=None, gt=0, le=7 * 86_400)

    @classmethod
    def parse(
        cls,
        raw: Mapping[str, Any] | JobSpec,
        *,
        tenant_id: str | None = None,
        names: Mapping[str, str] | None = None,
    ) -> JobSpec:
        """A validated spec from a mapping of fields, or from a spec (validated again: one changed
        with `model_copy(update=...)` or made by `model_construct` was never checked).

        `tenant_id` is used when the input names no tenant. `names` renames fields in the error
        message (`{"delay_seconds": "delay_s"}`). Raises `InvalidJob` naming the field."""
        fields = {name: getattr(raw, name) for name in raw.model_fields_set} if isinstance(raw, JobSpec) else dict(raw)
        if tenant_id is not None and fields.get("tenant_id") is None:
            fields["tenant_id"] = tenant_id
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise invalid_job(exc, names) from None

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("run_at", mode="before")
    @classmethod
    def _run_at(cls, value: Any) -> Any:
        """One clear message per kind of bad value (the union would report one per member)."""
        if isinstance(value, bool):
            raise PydanticCustomError("run_at", "run_at is epoch milliseconds or ISO 8601 text, not a boolean")
        if isinstance(value, str):
            check_text(value)
            if len(value) > _RUN_AT_TEXT_CHARS:
                raise PydanticCustomError(
                    "run_at", "ISO 8601 text is at most {n} characters", {"n": _RUN_AT_TEXT_CHARS}
                )
            digits = value.strip()
            if digits.isascii() and digits.isdigit():
                value = int(digits)
        return check_instant(value) if isinstance(value, int) else value

    @field_validator("target")
    @classmethod
    def _target_text(cls, target: TaskTarget | Any) -> Any:
        if isinstance(target, TaskTarget):
            _texts({"task": target.task})
        else:
            _texts({"endpoint": target.endpoint})
            for name, value in target.headers.items():
                _texts({"a header name": name, f"the value of header {name!r}": value})
        return target

    @field_validator("retry_policy")
    @classmethod
    def _retry_text(cls, policy: RetryPolicy) -> RetryPolicy:
        for name in policy.non_retryable_errors:
            _texts({"non_retryable_errors": name})
        return policy

    def fingerprint(self) -> str:
        """A hash of the request: the same Idempotency-Key with another body is a conflict."""
        body = self.model_dump(mode="json", exclude_none=True)
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _texts(values: Mapping[str, str]) -> None:
    for where, value in values.items():
        problem = text_problem(value)
        if problem is not None:
            raise PydanticCustomError("unstorable_text", "{where} {problem}", {"where": where, "problem": problem})


def check_idempotency_key(key: str) -> str:
    """The key, or `InvalidJob`: at most 255 visible ASCII characters, as its HTTP header allows."""
    if not _IDEMPOTENCY_KEY.match(key):
        raise InvalidJob("an Idempotency-Key is 1 to 255 visible ASCII characters", field="idempotency_key")
    return key


@dataclass(frozen=True, slots=True)
class Limits:
    max_payload_bytes: int = 256 * 1024
    horizon_ms: int = 60_000
    misfire_threshold_ms: int = 60_000

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_payload_bytes=settings.max_payload_bytes,
            horizon_ms=round(settings.horizon_s * 1000),
            misfire_threshold_ms=round(settings.misfire_threshold_s * 1000),
        )


def parse_instant(value: int | str, timezone: str, *, field: str = "run_at") -> int:
    """Epoch milliseconds from epoch ms or ISO 8601; a naive time is wall-clock in `timezone`.

    A wall time that does not exist (spring-forward gap) is refused; a repeated one (fall-back)
    means its first occurrence. An instant outside 1970..9999 (`jobq.instants`) is refused.
    Errors name `field`."""
    if isinstance(value, int):
        return _in_range(value, value, field)
    text = value.strip()
    if text.isascii() and text.isdigit():
        return _in_range(int(text), value, field)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ScheduleError(
            f"{field} {value!r} is neither epoch milliseconds nor ISO 8601 (e.g. 2026-12-01T09:00:00Z)",
            field=field,
        ) from None
    try:
        if moment.tzinfo is None:
            tz = zone(timezone)
            local = moment.replace(tzinfo=tz, fold=0)
            if local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != moment:
                raise ScheduleError(f"{field} {value!r} does not exist in {timezone} (a DST gap)", field=field)
            moment = local
        ms = round(moment.timestamp() * 1000)
    except OverflowError:  # a wall time at the very edge of year 1 or 9999, moved out by its offset
        raise ScheduleError(f"{field} {value!r} is outside {describe_range()}", field=field) from None
    return _in_range(ms, value, field)


def _in_range(ms: int, given: int | str, field: str) -> int:
    if not in_range(ms):
        raise ScheduleError(f"{field} {given!r} is outside the instants jobq accepts ({describe_range()})", field=field)
    return ms


def validate_payload(spec: JobSpec, limits: Limits) -> None:
    try:
        encoded = json.dumps(spec.payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"payload is not JSON: {exc}", field="payload") from None
    if len(encoded.encode()) > limits.max_payload_bytes:
        raise PayloadTooLarge(
            f"payload is {len(encoded.encode())} bytes; the limit is {limits.max_payload_bytes}", field="payload"
        )
    if isinstance(spec.target, TaskTarget) and spec.payload is not None:
        payload = spec.payload
        if not isinstance(payload, dict) or set(payload) - {"args", "kwargs"}:
            raise InvalidJob('a TASK payload is {"args": [...], "kwargs": {...}}', field="payload")
        if not isinstance(payload.get("args", []), list) or not isinstance(payload.get("kwargs", {}), dict):
            raise InvalidJob('a TASK payload is {"args": [...], "kwargs": {...}}', field="payload")


def with_declared(spec: JobSpec, declared: TaskInfo | None) -> JobSpec:
    """`spec` with its task's declared priority, retry policy and timeout (from the task catalogue)
    wherever the submission set none: a field the request gives, even at its default value, wins.
    Validated again, so a declaration out of range is an `InvalidJob` naming the field."""
    if declared is None or not isinstance(spec.target, TaskTarget):
        return spec
    given = spec.model_fields_set
    update: dict[str, Any] = {}
    if "priority" not in given:
        update["priority"] = declared.priority
    if "retry_policy" not in given and declared.retry is not None:
        update["retry_policy"] = declared.retry.model_dump()
    if "timeout_seconds" not in given and declared.timeout_s is not None:
        update["timeout_seconds"] = declared.timeout_s
    if not update:
        return spec
    return JobSpec.parse({**{name: getattr(spec, name) for name in given}, **update})


def unknown_task_message(task: str, known: set[str]) -> str:
    hint = ", ".join(sorted(known)[:10]) or "none registered yet"
    return f"unknown task {task!r}: no worker has registered it (known: {hint})"


def build_job(
    spec: JobSpec, now_ms: int, limits: Limits, known_tasks: set[str] | None = None, trace: str | None = None
) -> tuple[Job, list[Run], int]:
    """Validate `spec` and return the job, the runs to create with it, and the misfires counted.

    `known_tasks`, when given, is every task name a worker or the caller registered; a TASK
    target outside it is refused. `trace` is the submitter's traceparent (`jobq.tracing`).
    """
    validate_payload(spec, limits)
    zone(spec.timezone)
    job_id = spec.job_id or new_job_id(now_ms)  # before the schedule: `H` is picked from it
    kind = spec.schedule_type
    if kind is ScheduleType.CRON:
        if not spec.cron_expression:
            raise ScheduleError("a CRON job needs cron_expression", field="cron_expression")
        if spec.run_at is not None or spec.delay_seconds is not None:
            raise ScheduleError("a CRON job takes no run_at or delay_seconds", field="run_at")
        # `H` is resolved once, here: the stored expression is concrete, so every process fires alike.
        parsed = parse_cron(spec.cron_expression, spec.cron_dialect, job_id=job_id)
        schedule = Schedule(
            type=kind,
            cron=parsed.expression,
            cron_source=parsed.source,
            timezone=spec.timezone,
            dst_gap=spec.dst_gap,
            dst_overlap=spec.dst_overlap,
        )
        first = cron_for(schedule).next_after(now_ms)
    else:
        if spec.cron_expression is not None:
            raise ScheduleError(f"a {kind} job takes no cron_expression", field="cron_expression")
        if kind is ScheduleType.IMMEDIATE:
            if spec.run_at is not None or spec.delay_seconds is not None:
                raise ScheduleError("an IMMEDIATE job takes no run_at or delay_seconds", field="run_at")
            first = now_ms
        elif (spec.run_at is None) == (spec.delay_seconds is None):
            raise ScheduleError("a ONE_OFF job needs exactly one of run_at or delay_seconds", field="run_at")
        elif spec.delay_seconds is not None:
            first = now_ms + round(spec.delay_seconds * 1000)
        else:
            assert spec.run_at is not None
            first = parse_instant(spec.run_at, spec.timezone)
            if first < now_ms - spec.catchup_window_seconds * 1000:
                raise MissedWindow(
                    f"run_at is {(now_ms - first) / 1000:.0f} s in the past, beyond the catch-up window of "
                    f"{spec.catchup_window_seconds} s",
                    field="run_at",
                )
        schedule = Schedule(type=kind, at_ms=first, timezone=spec.timezone)
    if isinstance(spec.target, TaskTarget) and known_tasks is not None and spec.target.task not in known_tasks:
        raise UnknownTask(unknown_task_message(spec.target.task, known_tasks), field="target.task")
    job = Job(
        job_id=job_id,
        tenant_id=spec.tenant_id,
        name=spec.job_name or (spec.target.task if isinstance(spec.target, TaskTarget) else spec.target.endpoint),
        target=spec.target,
        payload=spec.payload,
        schedule=schedule,
        priority=spec.priority,
        retry=spec.retry_policy,
        misfire_policy=spec.misfire_policy,
        catchup_window_s=spec.catchup_window_seconds,
        overlap_policy=spec.overlap_policy,
        jitter_s=spec.jitter_seconds,
        timeout_s=spec.timeout_seconds,
        next_fire_ms=first,
        created_ms=now_ms,
        updated_ms=now_ms,
        # Only a chosen job id can be submitted again: then an equal spec names the same job.
        spec_fingerprint=spec.fingerprint() if spec.job_id else None,
        trace=trace,
    )
    return materialise(job, now_ms, limits)


def new_run(
    job: Job, nominal_ms: int, now_ms: int, limits: Limits, prev_run_id: str | None = None, trace: str | None = None
) -> Run:
    """The run of `job` firing at `nominal_ms`: due after its jitter, with its misfire deadline,
    continuing the trace `trace`."""
    skip_late = job.recurring and job.misfire_policy is MisfirePolicy.SKIP
    window_ms = limits.misfire_threshold_ms if skip_late else job.catchup_window_s * 1000
    return Run(
        run_id=Run.make_id(job.key, nominal_ms),
        job_id=job.job_id,
        tenant_id=job.tenant_id,
        nominal_ms=nominal_ms,
        due_ms=nominal_ms + jitter_ms(job.job_id, nominal_ms, job.jitter_s),
        priority=job.priority,
        deadline_ms=nominal_ms + max(window_ms, limits.misfire_threshold_ms),
        prev_run_id=prev_run_id,
        created_ms=now_ms,
        updated_ms=now_ms,
        trace=trace,
    )


def materialise(job: Job, now_ms: int, limits: Limits) -> tuple[Job, list[Run], int]:
    """The job's runs due within the horizon, and the job advanced past them.

    Idempotent: run ids derive from fire times, so doing it twice creates nothing new. Returns
    (job, runs, misfires). A one-off found beyond its catch-up window becomes a FAILED run
    (MISSED) on the dead-letter list."""
    if job.next_fire_ms is None or job.status is not JobStatus.ACTIVE:
        return job, [], 0
    if not job.recurring:
        if job.next_fire_ms > now_ms + limits.horizon_ms:
            return job, [], 0
        run = new_run(job, job.next_fire_ms, now_ms, limits, trace=job.trace)  # the submitter's trace
        missed = 0
        if run.deadline_ms is not None and now_ms > run.deadline_ms:
            missed = 1
            run = run.model_copy(
                update={
                    "state": RunState.FAILED,
                    "dead_letter": True,
                    "finished_ms": now_ms,
                    "last_error": "MISSED: the scheduler was down past the catch-up window",
                }
            )
        status = JobStatus.COMPLETED if run.state is RunState.FAILED else job.status
        advanced = job.model_copy(
            update={"next_fire_ms": None, "last_run_id": run.run_id, "status": status, "updated_ms": now_ms}
        )
        return advanced, [run], missed
    plan = plan_fires(job, now_ms, limits.horizon_ms, misfire_threshold_ms=limits.misfire_threshold_ms)
    runs: list[Run] = []
    prev = job.last_run_id
    for nominal in plan.fires:
        # Each fire is a trace of its own, linked to the submission (docs/tracing.md).
        run = new_run(job, nominal, now_ms, limits, prev, trace=fire_trace(job, nominal))
        if nominal == plan.collapsed_into:
            run = run.model_copy(
                update={"deadline_ms": max(run.deadline_ms or 0, now_ms + limits.misfire_threshold_ms)}
            )
        runs.append(run)
        prev = run.run_id
    status = JobStatus.COMPLETED if plan.next_fire_ms is None else job.status
    advanced = job.model_copy(
        update={"next_fire_ms": plan.next_fire_ms, "last_run_id": prev, "status": status, "updated_ms": now_ms}
    )
    return advanced, runs, plan.missed


def preview(job: Job, now_ms: int, n: int = 5) -> list[int]:
    """The next `n` nominal fire times from now (for create/update responses and `status`).

    A job stored before the cron dialect refused its syntax (`R`, `?`, a wrap-around range) has
    none: it does not fire (beat quarantines it), and it can still be shown and cancelled."""
    if job.recurring:
        try:
            return cron_for(job.schedule).fire_times(now_ms, n)
        except InvalidCron:
            return []
    first = job.schedule.at_ms
    return [first] if first is not None and n > 0 else []


def resume_fire(job: Job, now_ms: int) -> int | None:
    """Where a resumed job picks up: its next fire after now (fires during the pause are skipped)."""
    if not job.recurring:
        return job.next_fire_ms
    upcoming = next_fire(job.schedule, now_ms)
    if job.next_fire_ms is None or upcoming is None:
        return upcoming
    return max(job.next_fire_ms, upcoming)
