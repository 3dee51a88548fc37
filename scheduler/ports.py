"""The four ports daemons and clients depend on. Backends implement them; nothing else knows one.

Every method states its contract: what is atomic, what is idempotent, what it raises. Backends
translate their own exceptions into `jobq.errors` (`StoreUnavailable`, `TransportUnavailable`,
...) before they leave the backend.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, runtime_checkable

from jobq.errors import InvalidQuery, JobqError
from jobq.models import (
    ApiToken,
    IdempotencyRecord,
    Job,
    JobKey,
    JobStatus,
    Priority,
    Run,
    RunEvent,
    RunState,
    TaskInfo,
    Transition,
)
from jobq.registry import Census, DaemonRecord
from jobq.texts import text_problem

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None = None


def _check_texts(**texts: str | None) -> None:
    """Refuse text no store can compare (NUL, lone surrogates) before a query is built from it."""
    for name, value in texts.items():
        problem = None if value is None else text_problem(value)
        if problem is not None:
            raise InvalidQuery(f"{name} {problem}", field=name)


@dataclass(frozen=True, slots=True)
class JobQuery:
    """Raises `InvalidQuery` for text that cannot be stored (`jobq.bounds.text_problem`)."""

    tenant_id: str | None = None
    status: JobStatus | None = None
    priority: Priority | None = None
    name_prefix: str | None = None
    id_prefix: str | None = None  # job ids starting with this (declared schedules: `<app>.`)
    cursor: str | None = None  # opaque, from a previous Page
    limit: int = 100
    newest_first: bool = False  # descending job id: ids sort by creation, so the newest jobs first

    def __post_init__(self) -> None:
        _check_texts(
            tenant_id=self.tenant_id, name_prefix=self.name_prefix, id_prefix=self.id_prefix, cursor=self.cursor
        )


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Raises `InvalidQuery` for text that cannot be stored (`jobq.bounds.text_problem`)."""

    job: JobKey | None = None  # one job's runs (its tenant's: the key names it)
    tenant_id: str | None = None
    states: frozenset[RunState] = field(default_factory=frozenset)
    dead_letter: bool | None = None
    cursor: str | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        job = self.job or (None, None)
        _check_texts(job_tenant_id=job[0], job_id=job[1], tenant_id=self.tenant_id, cursor=self.cursor)


@dataclass(frozen=True, slots=True)
class CreateResult:
    job: Job
    created: bool  # False when an Idempotency-Key replayed an earlier creation
    response: str | None = None  # the stored response of that earlier creation


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """One submission in a group (`JobStore.create_job_group`): `create_job`'s arguments."""

    job: Job
    runs: Sequence[Run]
    idempotency: IdempotencyRecord | None = None


class JobStore(Protocol):
    """The source of truth for jobs, runs, idempotency keys and registered task names.

    Jobs are named by `JobKey` (tenant, job id): two tenants may hold the same job id, and nothing
    one tenant does can find, take or change the other's. Run ids are globally unique
    (`Run.make_id`). Every read decodes each record on its own: a stored record that does not
    decode comes back as a corrupt marker (`corrupt` set, see `jobq.records`), never as an error
    that fails the whole read.
    """

    def create_job(self, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None = None) -> CreateResult:
        """Write the job, its first runs and its idempotency key in one atomic step.

        With an idempotency key already stored for the tenant: the same fingerprint returns the
        original job (`created=False`), another fingerprint raises `IdempotencyConflict`; nothing
        is written in either case. A job whose key (tenant, job id) exists raises `DuplicateJob`;
        the same job id in another tenant is another job.
        """
        ...

    def create_job_group(self, requests: Sequence[CreateRequest]) -> list[CreateResult | JobqError]:
        """Each request as `create_job` would do it, in order, as if one after another: for each,
        its `CreateResult` or the `JobqError` that `create_job` would have raised for it
        (`DuplicateJob`, `IdempotencyConflict`, a `StoreError` for a row the store refuses). One
        request's failure writes nothing of it and leaves the others to commit. Two requests with
        one Idempotency-Key: the first creates, the second replays it (or conflicts).

        Durable together: SQL stores write the whole group in one transaction (one commit), so when
        this returns every created job is durable. Raises (nothing applied) only for what fails
        the whole group: `StoreUnavailable` (whose outcome may be unknown, as for `create_job`).

        A backend may set the attribute `concurrent_groups` (default 1): how many groups the
        client's group commit lets write at once (`jobq.groupcommit`)."""
        ...

    def create_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        """Bulk `create_job` without idempotency keys: each job with its runs, written if its key is
        absent (an existing key is skipped, not an error); True where created. Batched: SQL stores
        write the whole batch in one transaction."""
        ...

    def get_jobs(self, keys: Sequence[JobKey]) -> dict[JobKey, Job]:
        """The jobs that exist among `keys`, by key (one batch read)."""
        ...

    def list_jobs(self, query: JobQuery) -> Page[Job]:
        """Jobs matching every given filter, ordered by job id then tenant (both descending with
        `newest_first`: job ids sort by creation), paginated by an opaque cursor."""
        ...

    def update_job(self, job: Job) -> Job:
        """Replace the job if the stored version still equals `job.version`; returns it at version+1.

        Raises `Conflict` when the version moved or `job` is a corrupt marker (only `set_job_status`
        may change one), and `JobNotFound` when it does not exist.
        """
        ...

    def set_job_status(
        self, key: JobKey, status: JobStatus, expect: frozenset[JobStatus], now_ms: int, reason: str | None = None
    ) -> bool:
        """Set the job's status and `status_reason` (version+1, updated at `now_ms`) if its status
        is one of `expect`; True when this call changed it. Nothing else is rewritten, so it works
        on a record that does not decode: this is how a daemon quarantines one and how `cancel`
        ends one. A status other than ACTIVE takes the job out of `due_jobs`."""
        ...

    def due_jobs(self, before_ms: int, limit: int, shards: Collection[int] | None = None) -> list[Job]:
        """ACTIVE jobs whose `next_fire_ms <= before_ms`, CRITICAL first, then earliest first: a
        backlog of lower tiers larger than `limit` never hides a higher-tier job. With `shards`,
        only jobs in those shards (0..15, `jobq.sharding`; each store places a job in the same
        shard every time)."""
        ...

    def advance_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        """Beat's write: for each (job, runs), replace the job if the stored version still equals
        `job.version` (version+1, as `update_job`) and insert those of its runs whose id is absent
        (existing runs are left untouched). True at index i where item i's job advanced; a job whose
        compare-and-set fails (moved, gone, or a corrupt marker) is False, not an error. SQL stores:
        one transaction, the advances as one statement, and only the runs of jobs that advanced
        are inserted. DynamoDB (no conditional batch write): the runs are put first, then the
        advances, each conditional and concurrent; a run of a job that then fails to advance is
        the run the winner created (ids derive from fire times)."""
        ...

    def add_runs(self, runs: Sequence[Run]) -> list[Run]:
        """Insert the runs whose id is absent and return those; existing runs are left untouched."""
        ...

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """The runs that exist among `run_ids`, by id (one batch read)."""
        ...

    def list_runs(self, query: RunQuery) -> Page[Run]:
        """Runs matching the filters, newest nominal time first, paginated by an opaque cursor."""
        ...

    def run_counts(self, job: JobKey) -> dict[RunState, int]:
        """How many of the job's runs are in each state (states with none are omitted)."""
        ...

    def claim(
        self, run_ids: Sequence[str], now_ms: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        """Atomically, per run: if SCHEDULED and due by `due_by_ms` (default `now_ms`; the scanner's
        look-ahead claims ahead of now), move it to CLAIMED with fence+1 and a lease for `owner`
        from `now_ms`. Returns the runs this call claimed; the others were taken, cancelled or not
        yet due. Safe to call from many scanners at once."""
        ...

    def transition(self, transitions: Sequence[Transition]) -> list[Run | None]:
        """Apply each compare-and-set; the result at index i is the new run, or None when its
        condition failed (state, fence or lease owner moved, or no such run). Each transition is
        atomic on its own and bumps `version`; a batch may commit in one transaction."""
        ...

    def expired_leases(self, now_ms: int, limit: int) -> list[Run]:
        """CLAIMED, DISPATCHED and RUNNING runs whose `lease_expires_ms < now_ms`, oldest first."""
        ...

    def overdue_runs(self, before_ms: int, limit: int) -> list[Run]:
        """SCHEDULED runs with `due_ms <= before_ms`, by priority then due time."""
        ...

    def expire_results(self, finished_before_ms: int, limit: int) -> int:
        """Clear the result of up to `limit` finished runs (SUCCEEDED, FAILED or CANCELLED) that
        finished before `finished_before_ms` and still hold one; returns how many were cleared.
        Each clear is conditional on the run still being finished before the bound, so a run
        redriven meanwhile keeps its result. Not a state change: `version` and `updated_ms` stay.
        Idempotent; safe to call from many reapers at once."""
        ...

    def idempotency(self, tenant_id: str, key: str, now_ms: int) -> IdempotencyRecord | None:
        """The unexpired record of this key, if any."""
        ...

    def register_worker(self, worker_id: str, tasks: Sequence[str], queues: Sequence[str], now_ms: int) -> None:
        """Record that `worker_id` serves `tasks` (idempotent; refreshed by every call)."""
        ...

    def known_tasks(self) -> set[str]:
        """Every task name a worker has registered."""
        ...

    def publish_tasks(self, tasks: Sequence[TaskInfo]) -> None:
        """Store each task's declaration in the task catalogue, replacing the one of the same name
        (the newest publication wins). Idempotent; one batch (one transaction on SQL stores)."""
        ...

    def task_catalogue(self, names: Sequence[str] | None = None) -> dict[str, TaskInfo]:
        """The published declarations by task name: those among `names` when given, else all.
        An entry that does not decode is left out (the next publication of its name replaces it)."""
        ...

    def close(self) -> None: ...


class TenantStore(Protocol):
    """API tokens and per-tenant webhook signing secrets; implemented by the store backends."""

    def put_token(self, token: ApiToken) -> None:
        """Store a new token. Raises `Conflict` if its id or hash exists."""
        ...

    def find_token(self, token_hash: str) -> ApiToken | None:
        """The token with this hash, revoked or not."""
        ...

    def list_tokens(self, tenant_id: str | None = None) -> list[ApiToken]:
        """Tokens of one tenant (all when None), oldest first."""
        ...

    def revoke_token(self, token_id: str, now_ms: int) -> bool:
        """Revoke the token; False when no active token has this id. Idempotent."""
        ...

    def tenant_secret(self, tenant_id: str, candidate: str) -> str:
        """The tenant's webhook signing secret, atomically created as `candidate` if it has none."""
        ...


@runtime_checkable
class DaemonRegistry(Protocol):
    """Which daemons are alive and what they are doing; implemented by every store backend.

    An entry is a `DaemonRecord` keyed by `daemon_id`, live until its `expires_ms`. Nothing here is
    a source of truth for runs: the registry is what `jobq status`, `jobq workers` and the gauges
    show, and a lost or stale entry costs a view, never a run."""

    def heartbeat(self, records: Sequence[DaemonRecord], ttl_ms: int) -> None:
        """Write each record (insert or replace, by `daemon_id`) live until its `seen_ms + ttl_ms`.
        Idempotent: the last write wins. Entries expired long ago may be removed on the way (SQL);
        DynamoDB's TTL removes them there. Raises `StoreUnavailable`."""
        ...

    def live_daemons(self, now_ms: int) -> list[DaemonRecord]:
        """The entries with `expires_ms > now_ms`, by role then daemon id. An entry that does not
        decode is skipped (it expires on its own). Raises `StoreUnavailable`."""
        ...

    def deregister(self, daemon_ids: Sequence[str]) -> None:
        """Remove the entries (a clean shutdown); absent ids are ignored. Raises `StoreUnavailable`."""
        ...


@runtime_checkable
class RunCensus(Protocol):
    """Counts of runs for the operator views and gauges; implemented by every store backend."""

    def census(self, now_ms: int) -> Census:
        """Runs per state, dead letters, and per tier the runs due but not dispatched and the runs
        dispatched but not started, each with its oldest time, as of `now_ms`. One read (SQL: one
        aggregate statement); DynamoDB samples shards (`Census.exact` False). Read-only.
        Raises `StoreUnavailable`."""
        ...


@dataclass(frozen=True, slots=True)
class IndexEntry:
    run_id: str
    due_ms: int
    priority: Priority


class TimeIndex(Protocol):
    """Which runs are due when. An accelerator: the store stays the truth, beat repairs the index."""

    #: True when the index is a view of the store itself (nothing to add, nothing to repair).
    derived_from_store: bool

    def add(self, entries: Sequence[IndexEntry]) -> None:
        """Index the runs at their due time. Idempotent: adding an entry again only moves its time."""
        ...

    def claim_due(self, now_ms: int, limit: int) -> list[str]:
        """Up to `limit` run ids with `due_ms <= now_ms`, CRITICAL first, then by due time.
        Atomically removes them where the index holds its own copy, so two scanners rarely
        see the same id (and the store claim decides when they do)."""
        ...

    def discard(self, run_ids: Sequence[str]) -> None:
        """Remove the runs; absent ids are ignored."""
        ...

    def next_due_ms(self) -> int | None:
        """The earliest due time indexed, or None when empty (the scanner sleeps until then)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ClaimingIndex(Protocol):
    """Optional: an index that is a view of the store can find and claim due runs in one step
    (one SQL statement), saving the scanner a round trip. The scanner uses it when present."""

    def claim_runs(
        self, now_ms: int, limit: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        """Like `JobStore.claim(index.claim_due(due_by_ms or now_ms, limit), now_ms, ...)`, atomically:
        CRITICAL first. `due_by_ms` (the scanner's look-ahead) may lie ahead of `now_ms`, which
        stamps the claim and starts its lease."""
        ...


@runtime_checkable
class PartitionedIndex(Protocol):
    """Optional: an index whose buckets scanners share out among themselves (Redis, by rendezvous
    hashing over live scanners). Each scanner claims through its own view."""

    def for_scanner(self, scanner_id: str) -> TimeIndex:
        """A view of the same index that claims only the buckets `scanner_id` owns."""
        ...


@dataclass(frozen=True, slots=True)
class Delivery:
    queue: str
    body: bytes
    receipt: str  # opaque handle for ack/nack/extend
    delivery_count: int  # 1 on the first delivery


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """A queue's backlog as the broker sees it, cheaply (one or two broker calls, no consuming)."""

    waiting: int  # messages ready for a consumer now: not in flight, not delayed (approximate on SQS)
    oldest_age_s: float | None  # seconds since the oldest waiting message was published; None when
    # the queue has none waiting or the broker cannot tell (RabbitMQ, SQS: see each transport)


class Transport(Protocol):
    """Hands published messages to consumers; at-least-once; one queue per priority tier."""

    def publish(self, queue: str, bodies: Sequence[bytes]) -> None:
        """Enqueue every body (batched where the broker allows). Raises `TransportUnavailable`."""
        ...

    def consume(self, queues: Sequence[str], max_messages: int, wait_s: float) -> list[Delivery]:
        """Up to `max_messages` deliveries, taking from `queues[0]` first and later queues only
        when earlier ones are empty (strict priority). Waits up to `wait_s` when all are empty.
        A delivery is invisible to others until acked, nacked or its visibility timeout ends."""
        ...

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Delete the messages. Acking a message that was redelivered elsewhere is a no-op."""
        ...

    def nack(self, deliveries: Sequence[Delivery], delay_s: float = 0) -> None:
        """Return the messages to their queue, visible again after `delay_s`."""
        ...

    def extend(self, deliveries: Sequence[Delivery], visibility_s: float) -> None:
        """Keep the messages invisible for `visibility_s` more seconds (long tasks)."""
        ...

    def depth(self, queue: str) -> int:
        """Messages in the queue, visible or not (approximate on distributed brokers)."""
        ...

    def queue_depth(self, queue: str) -> QueueDepth:
        """The messages waiting in `queue` and the age of the oldest, for gauges and autoscaling.
        Cheap enough to call every few seconds; never consumes or hides a message. Raises
        `TransportUnavailable`."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class HealthCheck(Protocol):
    """Optional: a transport that can tell whether its consumer still reaches the broker."""

    def health_check(self, max_silence_s: float) -> bool:
        """True while open, the last broker call succeeded, and a consume came back from the broker
        within the last `max_silence_s` seconds."""
        ...


class HistorySink(Protocol):
    """Where every attempt's start and outcome is recorded for later reading."""

    def record(self, events: Sequence[RunEvent]) -> None:
        """Persist the events. May buffer; `flush` forces them out. Never raises on the hot path:
        failures are logged and counted."""
        ...

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        """The job's events (that tenant's job only), oldest first."""
        ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
