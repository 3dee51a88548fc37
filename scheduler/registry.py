"""What the daemon registry and the run census hold: plain records, and their JSON form in a store.

Every daemon process (api, beat, scanner, reaper, worker) writes a `DaemonRecord` into the store
every few seconds (`jobq.daemons.registrar`); the record lives until `expires_ms`, so a daemon
that dies without deregistering drops out on its own. A `Census` is one store's count of runs,
read by `jobq status`, `jobq top` and the gauges (`jobq.gauges`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from jobq.models import PRIORITIES_BY_RANK, Priority, RunState

ERROR_MAX_CHARS = 500  # a record's `last_error` is cut to this: the registry is a view, not a log
RUNNING_MAX = 50  # at most this many running attempts are listed per daemon (`busy` counts them all)


class Role(enum.StrEnum):
    API = "api"
    BEAT = "beat"
    SCANNER = "scanner"
    REAPER = "reaper"
    WORKER = "worker"


#: The roles without which delayed and cron jobs never run (a worker alone only runs what is
#: already dispatched).
SCHEDULING_ROLES = (Role.SCANNER, Role.BEAT, Role.REAPER)


@dataclass(frozen=True, slots=True)
class Running:
    """One attempt a worker is executing now."""

    run_id: str
    task: str
    attempt: int
    started_ms: int


@dataclass(frozen=True, slots=True)
class DaemonRecord:
    """One live daemon as it last reported itself. `seen_ms` is when; `expires_ms` when the entry
    stops counting as live (set by `DaemonRegistry.heartbeat` from its `ttl_ms`)."""

    daemon_id: str
    role: Role
    host: str
    pid: int
    version: str
    started_ms: int
    seen_ms: int
    expires_ms: int = 0
    queues: tuple[str, ...] = ()
    pool: str | None = None
    concurrency: int = 0
    done: int = 0  # items handled: runs finished (worker), dispatched (scanner), created (beat)...
    failures: int = 0  # failed attempts (worker) or failed passes (every role)
    busy: int = 0
    free: int = 0
    lost: int = 0
    last_error: str | None = None
    last_error_ms: int | None = None
    running: tuple[Running, ...] = field(default_factory=tuple)
    # The process's start-lateness histogram per tier (`Histogram.snapshot` of
    # `jobq_start_lateness_seconds`: cumulative bucket counts, count, sum), on one worker per process:
    # `jobq top` turns the differences between two reads into throughput and p50/p99 per tier.
    start_lateness: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        data["role"] = self.role.value
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> DaemonRecord:
        """Raises `ValueError`, `KeyError` or `TypeError` for text that is not a record."""
        data: dict[str, Any] = json.loads(text)
        data["role"] = Role(data["role"])
        data["queues"] = tuple(data.get("queues") or ())
        data["running"] = tuple(Running(**r) for r in data.get("running") or ())
        data["start_lateness"] = {str(k): tuple(v) for k, v in (data.get("start_lateness") or {}).items()}
        return cls(**data)


#: What a registry row that does not decode raises (skipped: the entry expires on its own).
RECORD_ERRORS = (ValueError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class TierFigures:
    """Runs of one priority tier the dispatch path is holding."""

    due: int = 0  # SCHEDULED or CLAIMED with due_ms <= now: due but not yet published
    oldest_due_ms: int | None = None
    dispatched: int = 0  # published, not yet started by a worker: the broker's backlog, as the store sees it
    oldest_dispatched_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Census:
    """Runs counted by one store read as of `at_ms`. `exact` is False where the store sampled
    (DynamoDB: some of its 16 shards, scaled up); `states` then omits what it cannot count."""

    at_ms: int
    states: dict[RunState, int]
    dead_letters: int
    tiers: dict[Priority, TierFigures]
    exact: bool = True


def expiring(record: DaemonRecord, ttl_ms: int) -> DaemonRecord:
    """The record as a registry holds it: live until `seen_ms + ttl_ms`."""
    return replace(record, expires_ms=record.seen_ms + ttl_ms)


def decode_daemons(docs: Iterable[str | bytes]) -> list[DaemonRecord]:
    """The records among `docs` that decode, by role then id; the others are skipped (they expire)."""
    records = []
    for doc in docs:
        try:
            records.append(DaemonRecord.from_json(doc))
        except RECORD_ERRORS:
            continue
    records.sort(key=lambda r: (r.role.value, r.daemon_id))
    return records


def census_from_rows(
    now_ms: int,
    active: Sequence[dict[str, Any]],
    dead_letters: int,
    finished: dict[str, int],
    *,
    exact: bool = True,
) -> Census:
    """A `Census` from the SQL stores' reads: `active` rows of (state, priority rank, n, due,
    oldest_due_ms, oldest_dispatched_ms) for the non-terminal states grouped by state and tier,
    the dead-letter count, and the terminal states' counts (by state name)."""
    states: dict[RunState, int] = {}
    tiers: dict[Priority, list[Any]] = {p: [0, None, 0, None] for p in Priority}
    for row in active:
        if row["state"] not in RunState.__members__ or row["priority"] not in range(len(PRIORITIES_BY_RANK)):
            continue  # a corrupt row's unknown state or tier is not counted
        state, tier, n = RunState(row["state"]), PRIORITIES_BY_RANK[row["priority"]], int(row["n"])
        states[state] = states.get(state, 0) + n
        figures = tiers[tier]
        figures[0] += int(row["due"] or 0)
        figures[1] = _min(figures[1], row["oldest_due_ms"])
        if state is RunState.DISPATCHED:
            figures[2] += n
            figures[3] = _min(figures[3], row["oldest_dispatched_ms"])
    for name, n in finished.items():
        if name in RunState.__members__ and n > 0:
            states[RunState(name)] = states.get(RunState(name), 0) + int(n)
    return Census(
        at_ms=now_ms,
        states=states,
        dead_letters=dead_letters,
        tiers={p: TierFigures(f[0], f[1], f[2], f[3]) for p, f in tiers.items()},
        exact=exact,
    )


def _min(a: int | None, b: int | None) -> int | None:
    if a is None or b is None:
        return a if b is None else int(b)
    return min(a, int(b))
