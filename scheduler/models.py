"""The domain records: jobs, runs, their states and the one table of allowed transitions.

A *job* is what a user submits (target, payload, schedule, priority, policies), identified by
its `JobKey`, the pair (tenant, job id): two tenants may hold the same job id. A *run* is one
firing of it, identified by `Run.make_id(key, nominal_ms)` (`f"{job_id}:{nominal_ms}"` for the
tenant `default`, `f"{tenant}/{job_id}:{nominal_ms}"` otherwise), so creating the same run
twice is a no-op. Times are integer milliseconds since the epoch, UTC.

A record read back from a store that does not decode is returned as a *corrupt marker*: a `Job`
or `Run` whose `corrupt` says why (see `jobq.records`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from jobq.errors import IllegalTransition, InvalidJob


class Priority(enum.StrEnum):
    CRITICAL = "CRITICAL"
    HIGH = "HIGH"
    DEFAULT = "DEFAULT"
    LOW = "LOW"

    @property
    def rank(self) -> int:
        """0 for CRITICAL up to 3 for LOW: lower ranks are served first."""
        return _PRIORITY_RANK[self]

    @property
    def queue(self) -> str:
        """The transport queue of this tier: `critical`, `high`, `default` or `low`."""
        return self.value.lower()

    @classmethod
    def parse(cls, value: str | Priority) -> Priority:
        try:
            return cls(str(value).upper())
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise InvalidJob(f"unknown priority {value!r}; use one of {names}", field="priority") from None

    @classmethod
    def from_queue(cls, queue: str) -> Priority:
        return cls.parse(queue)


_PRIORITY_RANK = {Priority.CRITICAL: 0, Priority.HIGH: 1, Priority.DEFAULT: 2, Priority.LOW: 3}
PRIORITIES_BY_RANK = sorted(Priority, key=lambda p: p.rank)


class RunState(enum.StrEnum):
    SCHEDULED = "SCHEDULED"
    CLAIMED = "CLAIMED"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


# A paused job's unstarted runs wait this long between looks at their job: the scanner claims
# one when it comes due, finds the job still paused and puts it back for as long again, so a
# resume (or a cancel) that was interrupted half-way is finished by the daemons within this time.
PAUSED_RECHECK_MS = 300_000
PAUSED = "paused"  # the `blocked_by` of a run held back because its job is paused
TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
LEASED_STATES = frozenset({RunState.CLAIMED, RunState.DISPATCHED, RunState.RUNNING})

S = RunState
# The only place that says which state may follow which. Every store change goes through a
# compare-and-set that names one of these edges.
TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    # claim; missed (past its misfire deadline); cancel
    S.SCHEDULED: frozenset({S.CLAIMED, S.FAILED, S.CANCELLED, S.SCHEDULED}),
    # publish; a worker faster than the scanner's DISPATCHED write; lease expired or overlap wait
    S.CLAIMED: frozenset({S.DISPATCHED, S.RUNNING, S.SCHEDULED, S.FAILED, S.CANCELLED}),
    # start; lease expired (reaper)
    S.DISPATCHED: frozenset({S.RUNNING, S.SCHEDULED, S.FAILED, S.CANCELLED}),
    # outcome; retry (attempt+1) or reclaimed (reaper)
    S.RUNNING: frozenset({S.RUNNING, S.SUCCEEDED, S.SCHEDULED, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    # redrive from the dead-letter list (or its purge, which stays FAILED)
    S.FAILED: frozenset({S.SCHEDULED, S.FAILED}),
    S.CANCELLED: frozenset(),
}
del S


def check_transition(from_states: frozenset[RunState], to_state: RunState) -> None:
    for state in from_states:
        if to_state not in TRANSITIONS[state]:
            raise IllegalTransition(f"{state} -> {to_state} is not an allowed run transition")


class JobStatus(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"  # its schedule is exhausted: no further runs will be created
    CANCELLED = "CANCELLED"
    # Its stored record did not decode: a daemon took it out of circulation (no runs are created,
    # its open runs were dead-lettered as Corrupt). `jobq resume` brings it back once it decodes.
    QUARANTINED = "QUARANTINED"


DEFAULT_TENANT = "default"
TENANT_SEPARATOR = "/"  # in run ids and `T/JOB_ID` references; never in a tenant or job id


class JobKey(NamedTuple):
    """What names a job: job ids are scoped by tenant, so tenants can neither see nor take each
    other's ids. `str(key)` is the job id for the tenant `default`, else `tenant/job_id`."""

    tenant_id: str
    job_id: str

    def __str__(self) -> str:
        if self.tenant_id == DEFAULT_TENANT:
            return self.job_id
        return f"{self.tenant_id}{TENANT_SEPARATOR}{self.job_id}"

    @classmethod
    def parse(cls, text: str, tenant_id: str = DEFAULT_TENANT) -> JobKey:
        """`JOB_ID` (in `tenant_id`) or `TENANT/JOB_ID`, the form `str` gives."""
        tenant, sep, job_id = text.rpartition(TENANT_SEPARATOR)
        return cls(tenant, job_id) if sep else cls(tenant_id, text)


class ScheduleType(enum.StrEnum):
    ONE_OFF = "ONE_OFF"
    CRON = "CRON"
    IMMEDIATE = "IMMEDIATE"


class MisfirePolicy(enum.StrEnum):
    FIRE_ONCE_NOW = "fire_once_now"
    SKIP = "skip"
    FIRE_ALL = "fire_all"


class OverlapPolicy(enum.StrEnum):
    SKIP = "SKIP"
    BUFFER_ONE = "BUFFER_ONE"
    BUFFER_ALL = "BUFFER_ALL"
    CANCEL_OTHER = "CANCEL_OTHER"
    ALLOW_ALL = "ALLOW_ALL"


class DstGap(enum.StrEnum):
    SKIP = "skip"
    SHIFT = "shift"


class DstOverlap(enum.StrEnum):
    ONCE = "once"
    TWICE = "twice"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False, use_enum_values=False)


# The parts of a job a user hands over as objects (`retry=RetryPolicy(...)`, targets): validated
# again whenever one is placed in another model, because an instance made by
# `model_copy(update=...)` or `model_construct` was never checked; and never NaN or infinite.
_USER_PART = ConfigDict(extra="forbid", allow_inf_nan=False, revalidate_instances="always")


class RetryPolicy(_Record):
    """Full-jitter exponential backoff: attempt n waits uniform(0, min(max, initial * mult^(n-1)))."""

    model_config = ConfigDict(**_USER_PART, frozen=True)

    max_retries: int = Field(default=3, ge=0, le=1000)
    initial_interval_sec: float = Field(default=1.0, ge=0, le=86_400)
    backoff_multiplier: float = Field(default=2.0, ge=1.0, le=100)
    max_interval_sec: float = Field(default=300.0, ge=0, le=7 * 86_400)
    non_retryable_errors: tuple[str, ...] = ()
    max_age_sec: float | None = Field(default=None, gt=0)

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1


class TaskTarget(_Record):
    model_config = _USER_PART

    type: Literal["TASK"] = "TASK"
    task: str = Field(min_length=1, max_length=200)


class WebhookTarget(_Record):
    model_config = _USER_PART

    type: Literal["HTTP_WEBHOOK"] = "HTTP_WEBHOOK"
    endpoint: str = Field(min_length=1, max_length=2048)
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    # Values are often credentials (Authorization): kept out of reprs; `jobq.redaction` hides them in views.
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    timeout_seconds: float = Field(default=30.0, gt=0, le=900)


Target = Annotated[TaskTarget | WebhookTarget, Field(discriminator="type")]


class Schedule(_Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: ScheduleType
    at_ms: int | None = None  # ONE_OFF and IMMEDIATE: the nominal fire time
    cron: str | None = None  # CRON: the canonical expression, `H` resolved: what fires
    cron_source: str | None = None  # CRON: as submitted (aliases, `H`), for display only
    timezone: str = "UTC"
    dst_gap: DstGap = DstGap.SKIP
    dst_overlap: DstOverlap = DstOverlap.ONCE


WEBHOOK_TASK = "jobq.webhook"  # the built-in task that calls a job's HTTP_WEBHOOK target


class Job(_Record):
    job_id: str
    tenant_id: str = "default"
    name: str
    target: Target
    payload: Any = None
    schedule: Schedule
    priority: Priority = Priority.DEFAULT
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE_NOW
    catchup_window_s: int = 86_400
    overlap_policy: OverlapPolicy = OverlapPolicy.SKIP
    jitter_s: int = 0
    timeout_s: float | None = None
    status: JobStatus = JobStatus.ACTIVE
    status_reason: str | None = None  # why a daemon set the status (a quarantine); cleared by the next change
    next_fire_ms: int | None = None  # the next nominal fire time not yet materialised as a run
    last_run_id: str | None = None  # the newest materialised run (overlap policies look at it)
    paused_ms: int | None = None  # when the job was last paused, while it is paused
    # The W3C traceparent of the request or `Client` call that submitted the job (`jobq.tracing`).
    # Left out of the stored document when None, so processes of the previous version read it.
    trace: str | None = Field(default=None, exclude_if=lambda value: value is None)
    created_ms: int
    updated_ms: int
    version: int = 0
    # The `App` whose declared schedule this job is (`App.periodic`, `App(schedules=...)`): its
    # schedule sync creates, updates and pauses it. None for jobs submitted any other way.
    declared_by: str | None = None
    # A hash of the submission the job was made from (`JobSpec.fingerprint`): a resubmission of the
    # same job id with an equal spec is recognised as the same job, not a duplicate.
    spec_fingerprint: str | None = None
    # Set only on a record read back that did not decode (`jobq.records`): why. Never stored.
    corrupt: str | None = Field(default=None, exclude=True)

    @model_serializer(mode="wrap")
    def _omit_unset_declaration(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Stored documents hold the two fields above only when set, so a job document written here
        stays readable by a process of the previous version (which forbids unknown fields)."""
        data: dict[str, Any] = handler(self)
        for name in ("declared_by", "spec_fingerprint"):
            if data.get(name, False) is None:
                del data[name]
        return data

    @property
    def key(self) -> JobKey:
        return JobKey(self.tenant_id, self.job_id)

    @property
    def task_name(self) -> str:
        return self.target.task if isinstance(self.target, TaskTarget) else WEBHOOK_TASK

    @property
    def recurring(self) -> bool:
        return self.schedule.type is ScheduleType.CRON

    def completed_by(self, nominal_ms: int) -> bool:
        """Whether the final outcome of the run firing at `nominal_ms` completes this job: a one-off's
        (or an instant job's) own run does; a run triggered at another time never does."""
        return not self.recurring and self.schedule.at_ms == nominal_ms


class Run(_Record):
    run_id: str
    job_id: str
    tenant_id: str = "default"
    nominal_ms: int  # the fire time the run stands for (part of its id)
    due_ms: int  # when it may next be claimed: nominal + jitter, or a retry's backoff
    priority: Priority = Priority.DEFAULT
    state: RunState = RunState.SCHEDULED
    attempt: int = 1
    fence: int = 0
    version: int = 0
    lease_owner: str | None = None
    lease_expires_ms: int | None = None
    last_heartbeat_ms: int | None = None
    last_error: str | None = None
    deadline_ms: int | None = None  # not dispatched after this: a misfire beyond the window
    prev_run_id: str | None = None  # the job's previous run, for overlap policies
    blocked_by: str | None = None  # the run whose overlap made this one skip or wait, or PAUSED
    dead_letter: bool = False
    result: Any = None
    created_ms: int
    updated_ms: int
    dispatched_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    # Times the run was given back without using an attempt: a worker shut down while it ran, or
    # no worker that took it served its task. Past a bound, a hand-back counts as an attempt.
    handbacks: int = 0
    # The W3C traceparent the run's spans continue: its job's for a one-off, a fire's own trace
    # (linked to the job's) for a recurring job; None when nothing traced it (`jobq.tracing`).
    trace: str | None = None
    # Attempts made before the run's current attempt budget began: a redrive grants a fresh budget
    # of `retry.max_attempts` from the attempt it creates (attempt numbers keep counting up).
    attempt_base: int = 0
    # Set only on a record read back that did not decode (`jobq.records`): why. Never stored.
    corrupt: str | None = Field(default=None, exclude=True)

    @property
    def job_key(self) -> JobKey:
        return JobKey(self.tenant_id, self.job_id)

    @property
    def held(self) -> bool:
        """Held back because its job is paused: its due time is when the scanner looks at the job
        again (`PAUSED_RECHECK_MS`), not a time it will run."""
        return self.blocked_by == PAUSED

    @staticmethod
    def make_id(job: JobKey, nominal_ms: int) -> str:
        """The run id of `job`'s fire at `nominal_ms`: `job_id:ms` for the tenant `default` (the
        form runs had before job ids were scoped by tenant), `tenant/job_id:ms` otherwise. Neither
        id may hold `/` or `:`, so the id names its job and fire unambiguously (`parse_id`)."""
        return f"{job}:{nominal_ms}"

    @staticmethod
    def parse_id(run_id: str) -> tuple[JobKey, int] | None:
        """The job key and nominal time `make_id` built `run_id` from; None for another form."""
        head, sep, nominal = run_id.rpartition(":")
        if not sep or not head or not nominal.isdigit() or str(int(nominal)) != nominal:
            return None
        key = JobKey.parse(head)
        if not key.tenant_id or not key.job_id:
            return None
        return key, int(nominal)

    @classmethod
    def from_store(cls, fields: dict[str, Any]) -> Run:
        """A run read back from a store (`fields` holds one value per stored field, the priority as
        a `Priority`, `dead_letter` as a bool and `result` decoded; the dict is taken over).

        Trusted: a row jobq wrote is built without pydantic's validation once a check of each
        value's exact type passes (the only constraints a `Run` has), about 4x cheaper than
        `model_validate` (`model_construct`, which fills defaults field by field in Python, is
        slower than either). A row that fails the check goes through `model_validate`, so it
        decodes exactly as before or raises the same `ValidationError` (a corrupt marker)."""
        raw_state = fields.get("state")
        state = _RUN_STATES.get(raw_state) if isinstance(raw_state, str) else None
        if state is None or type(fields.get("priority")) is not Priority or not _well_typed(fields):
            return cls.model_validate(fields)
        fields["state"] = state
        fields["corrupt"] = None
        run = _new_object(cls)
        _set_attribute(run, "__dict__", fields)
        _set_attribute(run, "__pydantic_fields_set__", set(_STORED_RUN_FIELDS))
        _set_attribute(run, "__pydantic_extra__", None)
        _set_attribute(run, "__pydantic_private__", None)
        return run


#: Every stored field of a run, in the order the SQL stores keep their columns.
RUN_FIELDS: tuple[str, ...] = tuple(name for name in Run.model_fields if name != "corrupt")

# `Run.from_store`'s trusted path: the exact type each stored field must have (None allowed where
# the field is optional). `bool` is not an `int` here: pydantic would accept it, so it takes the
# validated path. Kept in step with the model by a test that walks `Run.model_fields`.
_STORED_RUN_FIELDS = frozenset(RUN_FIELDS)
_RUN_STATES: dict[str, RunState] = {state.value: state for state in RunState}
_RUN_TYPES: tuple[tuple[type, tuple[str, ...]], ...] = (
    (
        int,
        (
            "nominal_ms",
            "due_ms",
            "attempt",
            "fence",
            "version",
            "created_ms",
            "updated_ms",
            "handbacks",
            "attempt_base",
        ),
    ),
    (str, ("run_id", "job_id", "tenant_id")),
    (bool, ("dead_letter",)),
)
_OPTIONAL_RUN_TYPES: tuple[tuple[type, tuple[str, ...]], ...] = (
    (int, ("lease_expires_ms", "last_heartbeat_ms", "deadline_ms", "dispatched_ms", "started_ms", "finished_ms")),
    (str, ("lease_owner", "last_error", "prev_run_id", "blocked_by", "trace")),
)
_new_object = object.__new__
_set_attribute = object.__setattr__


def _well_typed(fields: dict[str, Any]) -> bool:
    """Whether `fields` holds exactly the stored run fields, in the model's order (which is what
    serialisation follows), each with exactly its type (`result` is any decoded JSON)."""
    if tuple(fields) != RUN_FIELDS:
        return False
    for kind, names in _RUN_TYPES:
        for name in names:
            if type(fields[name]) is not kind:
                return False
    for kind, names in _OPTIONAL_RUN_TYPES:
        for name in names:
            value = fields[name]
            if value is not None and type(value) is not kind:
                return False
    return True


# The fields a transition may change besides state and fence. Backends whitelist these.
MUTABLE_RUN_FIELDS = frozenset(
    {
        "attempt",
        "due_ms",
        "lease_owner",
        "lease_expires_ms",
        "last_heartbeat_ms",
        "last_error",
        "deadline_ms",
        "blocked_by",
        "dead_letter",
        "result",
        "dispatched_ms",
        "started_ms",
        "finished_ms",
        "handbacks",
        "attempt_base",
    }
)


@dataclass(frozen=True, slots=True)
class Transition:
    """A compare-and-set on one run: applied only while `state in expect` and `fence == expect_fence`
    (and the lease owner and version, when given).

    `bump_fence` adds one to the fence in the same write. `expect_fence=None` matches any fence.
    `job_status` moves the run's job between ACTIVE and COMPLETED with the run (a one-off's last
    outcome); a PAUSED or CANCELLED job is left as it is.
    """

    run_id: str
    expect: frozenset[RunState]
    to_state: RunState
    expect_fence: int | None
    changes: Mapping[str, Any] = field(default_factory=dict)
    bump_fence: bool = False
    expect_owner: str | None = None
    expect_version: int | None = None  # the reaper's guard: a heartbeat moved the lease, not the fence
    at_ms: int | None = None  # when it happens: stamped as the run's updated_ms
    job_status: JobStatus | None = None  # also set the job's status (ACTIVE/COMPLETED) in the same write

    def __post_init__(self) -> None:
        check_transition(self.expect, self.to_state)
        unknown = set(self.changes) - MUTABLE_RUN_FIELDS
        if unknown:
            raise IllegalTransition(f"a transition cannot change {sorted(unknown)}")

    def describe(self) -> str:
        states = "|".join(sorted(self.expect))
        fence = "any" if self.expect_fence is None else str(self.expect_fence)
        return f"state in {states} and fence={fence}"


class RunEvent(_Record):
    """One line of a run's history: what happened to which attempt, when, and by whom."""

    run_id: str
    job_id: str
    tenant_id: str = "default"
    attempt: int
    fence: int
    kind: str  # DISPATCHED, STARTED, SUCCEEDED, RETRYING, FAILED, RECLAIMED, CANCELLED, MISSED, SKIPPED, ...
    at_ms: int
    worker: str | None = None
    error: str | None = None
    duration_ms: int | None = None

    @property
    def job_key(self) -> JobKey:
        return JobKey(self.tenant_id, self.job_id)

    @classmethod
    def trusted(cls, fields: dict[str, Any]) -> RunEvent:
        """An event built by jobq from a run it holds (`jobq.daemons.base.event`): constructed
        without validation when every field is present with exactly its type, validated (and
        rejected like any input) otherwise. The dict is taken over."""
        if tuple(fields) != _EVENT_FIELDS:  # every field, in the model's order (serialisation follows it)
            return cls.model_validate(fields)
        for name, allowed in _EVENT_TYPES.items():
            if type(fields[name]) not in allowed:
                return cls.model_validate(fields)
        event = _new_object(cls)
        _set_attribute(event, "__dict__", fields)
        _set_attribute(event, "__pydantic_fields_set__", set(_EVENT_FIELDS))
        _set_attribute(event, "__pydantic_extra__", None)
        _set_attribute(event, "__pydantic_private__", None)
        return event


_EVENT_FIELDS = tuple(RunEvent.model_fields)
_EVENT_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "job_id": (str,),
    "tenant_id": (str,),
    "attempt": (int,),
    "fence": (int,),
    "kind": (str,),
    "at_ms": (int,),
    "worker": (str, type(None)),
    "error": (str, type(None)),
    "duration_ms": (int, type(None)),
}


class TaskInfo(_Record):
    """A task as a worker declared it: its entry in the task catalogue (`JobStore.publish_tasks`).

    A submission by name takes `priority`, `retry` and `timeout_s` from here unless it sets them;
    `queue` is the tier's queue the task's runs go to; `parameters` are the function's, as text
    (`"customer_id: int"`), for listings. The newest publication of a name wins."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # a newer worker may add fields

    name: str = Field(min_length=1, max_length=200)
    priority: Priority = Priority.DEFAULT
    retry: RetryPolicy | None = None  # None: the submission's (default) policy
    timeout_s: float | None = None
    queue: str = "default"
    parameters: tuple[str, ...] = ()
    worker_id: str = ""  # the worker that published this declaration last
    published_ms: int = 0


class IdempotencyRecord(_Record):
    """An Idempotency-Key, written in the same transaction as the job it created."""

    tenant_id: str
    key: str
    fingerprint: str  # hash of the request body: the same key with another body is a conflict
    job_id: str
    response: str | None = None  # the original response, replayed verbatim
    created_ms: int
    expires_ms: int

    @property
    def job_key(self) -> JobKey:
        """The job the key created: a key is per tenant, and so is that job's id."""
        return JobKey(self.tenant_id, self.job_id)


OPERATOR_TENANT = "*"
"""The tenant of an operator token: no tenant id can be `*`, so an operator token belongs to no tenant
and sees them all (`ApiToken.operator`). A process that does not know operators confines such a token
to a tenant that holds nothing."""


class ApiToken(_Record):
    """An HTTP API token: only its SHA-256 is stored; the secret is shown once, at creation. A token
    belongs to one tenant, or is an operator's (`tenant_id == OPERATOR_TENANT`), which sees all."""

    token_id: str
    tenant_id: str
    name: str = ""
    token_hash: str
    created_ms: int
    revoked_ms: int | None = None

    @property
    def active(self) -> bool:
        return self.revoked_ms is None

    @property
    def operator(self) -> bool:
        return self.tenant_id == OPERATOR_TENANT

    @property
    def scope(self) -> str | None:
        """The tenant this token is confined to, or None for an operator token (every tenant)."""
        return None if self.operator else self.tenant_id
