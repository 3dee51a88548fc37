"""The embedded default store: jobs, runs, idempotency keys and workers in one SQLite file.

Runs are rows with a column per field, so the claim, the transitions and the lease and due
queries are single indexed statements. Jobs are a JSON document plus the columns that are
queried, keyed by (tenant_id, job_id). Every write runs in `BEGIN IMMEDIATE`, so concurrent
processes serialise on the file lock rather than failing. Every row is decoded on its own: one
that does not decode is read as a corrupt marker (`jobq.records`).

A file written before job ids were scoped by tenant (jobs keyed by `job_id` alone) is upgraded
in place when the store opens it: the jobs table is rebuilt with the composite key, in one
transaction, keeping its column order (so a process of the previous version still running
against the file keeps working until it is restarted).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

from jobq.errors import (
    Conflict,
    DuplicateJob,
    IdempotencyConflict,
    JobNotFound,
    JobqError,
    StoreError,
    StoreUnavailable,
)
from jobq.models import (
    PRIORITIES_BY_RANK,
    RUN_FIELDS,
    ApiToken,
    IdempotencyRecord,
    Job,
    JobKey,
    JobStatus,
    Run,
    RunState,
    TaskInfo,
    Transition,
)
from jobq.ports import CreateRequest, CreateResult, JobQuery, Page, RunQuery
from jobq.records import DECODE_ERRORS, corrupt_job, corrupt_run, decode_tasks, priority_of
from jobq.registry import Census, DaemonRecord, census_from_rows, decode_daemons, expiring
from jobq.sharding import job_shard
from jobq.sqlitedb import SqliteDatabase, placeholders
from jobq.store.batches import key_rounds, shape, transition_groups
from jobq.store.memory import job_cursor, parse_run_cursor, refuse_corrupt, run_cursor
from jobq.store.sqlite_listing import JOB_COLUMNS, job_list_sql

# The column order is the previous version's (it inserts positionally); only the key changed.
_JOBS_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    job_id       TEXT NOT NULL,
    tenant_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    status       TEXT NOT NULL,
    priority     INTEGER NOT NULL,
    next_fire_ms INTEGER,
    version      INTEGER NOT NULL,
    doc          TEXT NOT NULL,
    PRIMARY KEY (tenant_id, job_id)
)"""
_JOBS_INDEXES = (
    # Beat: due jobs tier by tier (one range scan per priority), earliest first within a tier.
    "CREATE INDEX IF NOT EXISTS jobq_jobs_due_tier ON jobq_jobs (priority, next_fire_ms, job_id) "
    "WHERE status = 'ACTIVE' AND next_fire_ms IS NOT NULL",
    # The previous version's index by fire time alone, replaced by the one above.
    "DROP INDEX IF EXISTS jobq_jobs_due",
    # Listings across tenants are ordered by job id, then tenant.
    "CREATE INDEX IF NOT EXISTS jobq_jobs_id ON jobq_jobs (job_id, tenant_id)",
    # The primary key serves a tenant's listing; this index of the previous version is redundant.
    "DROP INDEX IF EXISTS jobq_jobs_tenant",
)

SCHEMA = (
    _JOBS_TABLE.format(name="jobq_jobs")
    + ";\n"
    + ";\n".join(_JOBS_INDEXES)
    + """;

CREATE TABLE IF NOT EXISTS jobq_runs (
    run_id            TEXT PRIMARY KEY,
    job_id            TEXT NOT NULL,
    tenant_id         TEXT NOT NULL,
    nominal_ms        INTEGER NOT NULL,
    due_ms            INTEGER NOT NULL,
    priority          INTEGER NOT NULL,
    state             TEXT NOT NULL,
    attempt           INTEGER NOT NULL,
    fence             INTEGER NOT NULL,
    version           INTEGER NOT NULL,
    lease_owner       TEXT,
    lease_expires_ms  INTEGER,
    last_heartbeat_ms INTEGER,
    last_error        TEXT,
    deadline_ms       INTEGER,
    prev_run_id       TEXT,
    blocked_by        TEXT,
    dead_letter       INTEGER NOT NULL DEFAULT 0,
    result            TEXT,
    created_ms        INTEGER NOT NULL,
    updated_ms        INTEGER NOT NULL,
    dispatched_ms     INTEGER,
    started_ms        INTEGER,
    finished_ms       INTEGER,
    handbacks         INTEGER NOT NULL DEFAULT 0,
    trace             TEXT,
    attempt_base      INTEGER NOT NULL DEFAULT 0
);
-- The scanner's (and beat's repair) query: due runs of one tier, earliest first, ties by id.
DROP INDEX IF EXISTS jobq_runs_due;
CREATE INDEX IF NOT EXISTS jobq_runs_scheduled ON jobq_runs (priority, due_ms, run_id) WHERE state = 'SCHEDULED';
-- The reaper's query: leases that ran out.
CREATE INDEX IF NOT EXISTS jobq_runs_lease ON jobq_runs (lease_expires_ms)
    WHERE state IN ('CLAIMED', 'DISPATCHED', 'RUNNING');
-- A job's runs (list_runs, run_counts): the previous version's index had no tenant.
DROP INDEX IF EXISTS jobq_runs_job;
CREATE INDEX IF NOT EXISTS jobq_runs_job_key ON jobq_runs (tenant_id, job_id, nominal_ms);
CREATE INDEX IF NOT EXISTS jobq_runs_dead ON jobq_runs (tenant_id, nominal_ms) WHERE dead_letter = 1;
-- The reaper's result expiry: finished runs that still hold a result, oldest first.
CREATE INDEX IF NOT EXISTS jobq_runs_result ON jobq_runs (finished_ms)
    WHERE result IS NOT NULL AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED');

CREATE TABLE IF NOT EXISTS jobq_idempotency (
    tenant_id   TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    response    TEXT,
    created_ms  INTEGER NOT NULL,
    expires_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key)
);

CREATE TABLE IF NOT EXISTS jobq_tokens (
    token_id   TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    name       TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL,
    revoked_ms INTEGER
);

CREATE TABLE IF NOT EXISTS jobq_tenants (
    tenant_id      TEXT PRIMARY KEY,
    webhook_secret TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS jobq_workers (
    worker_id TEXT PRIMARY KEY,
    tasks     TEXT NOT NULL,
    queues    TEXT NOT NULL,
    seen_ms   INTEGER NOT NULL
);

-- The daemon registry: one row per live daemon process; expired rows are removed by heartbeats.
CREATE TABLE IF NOT EXISTS jobq_daemons (
    daemon_id  TEXT PRIMARY KEY,
    role       TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    doc        TEXT NOT NULL
);

-- The task catalogue: each task's latest declaration (a TaskInfo document). Created in place in
-- a file of an earlier version when the store opens it.
CREATE TABLE IF NOT EXISTS jobq_tasks (
    name         TEXT PRIMARY KEY,
    doc          TEXT NOT NULL,
    published_ms INTEGER NOT NULL
);
"""
)

RUN_COLUMNS = RUN_FIELDS  # the table has a column per field
# Run columns added after the table's first version, in the order they were added, with their DDL.
_ADDED_RUN_COLUMNS = {
    "handbacks": "INTEGER NOT NULL DEFAULT 0",
    "trace": "TEXT",
    "attempt_base": "INTEGER NOT NULL DEFAULT 0",
}
_INSERT_RUN = (
    f"INSERT OR IGNORE INTO jobq_runs ({', '.join(RUN_COLUMNS)}) VALUES ({placeholders(len(RUN_COLUMNS))}) RETURNING *"
)
_INSERT_RUN_QUIETLY = _INSERT_RUN.removesuffix(" RETURNING *")
_LEASED = "('CLAIMED', 'DISPATCHED', 'RUNNING')"
# A one-off's final outcome completes its job in the same transaction; the JSON document and the
# queried columns change together. A document that is not a JSON object (a corrupt row) is left as
# it is: its columns are what a corrupt marker shows.
# A job's new status in its document too (a document that is not a JSON object is left as it is:
# quarantine reads it); `{status}` and `{at}` name the new status and the time, if any.
_STATUS_DOC = """CASE WHEN NOT json_valid(doc) THEN doc WHEN json_type(doc) <> 'object' THEN doc
               ELSE json_set(doc, '$.status', {status}, '$.version', version + 1,
                             '$.updated_ms', coalesce({at}, json_extract(doc, '$.updated_ms')){reason}) END"""
_SET_STATUS = (
    "UPDATE jobq_jobs SET status = ?1, version = version + 1, doc = "
    + _STATUS_DOC.replace("{status}", "?1").replace("{at}", "?2")
    + " WHERE tenant_id = ?3 AND job_id = ?4 AND status IN ({expect})"
)
_FINISH_JOB = _SET_STATUS.format(reason="", expect="'ACTIVE', 'COMPLETED'")
_CHUNK = 500  # ids per IN (...) list
# Entries are kept this long past their expiry (a `jobq workers` a moment late still sees who left).
DAEMON_KEEP_MS = 3_600_000
# The census. Runs waiting or leased are counted exactly through the partial indexes that serve the
# scanner and the reaper (the WHERE clauses repeat theirs, so SQLite can use them); dead letters
# through theirs. Finished runs have no index on their state (it would cost every transition a
# write): they are counted by a scan at most every FINISHED_EVERY_MS.
_CENSUS_ACTIVE = """
SELECT state, priority, COUNT(*) AS n,
       SUM(CASE WHEN due_ms <= ?1 THEN 1 ELSE 0 END) AS due,
       MIN(CASE WHEN due_ms <= ?1 THEN due_ms END) AS oldest_due_ms,
       NULL AS oldest_dispatched_ms
FROM jobq_runs WHERE state = 'SCHEDULED' GROUP BY state, priority
UNION ALL
SELECT state, priority, COUNT(*) AS n,
       SUM(CASE WHEN state = 'CLAIMED' AND due_ms <= ?1 THEN 1 ELSE 0 END) AS due,
       MIN(CASE WHEN state = 'CLAIMED' AND due_ms <= ?1 THEN due_ms END) AS oldest_due_ms,
       MIN(CASE WHEN state = 'DISPATCHED' THEN coalesce(dispatched_ms, updated_ms) END) AS oldest_dispatched_ms
FROM jobq_runs WHERE state IN ('CLAIMED', 'DISPATCHED', 'RUNNING') GROUP BY state, priority
"""
_CENSUS_DEAD = "SELECT COUNT(*) AS n FROM jobq_runs WHERE dead_letter = 1"
_CENSUS_FINISHED = (
    "SELECT state, COUNT(*) AS n FROM jobq_runs WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') GROUP BY state"
)
FINISHED_EVERY_MS = 60_000


def _run_values(run: Run) -> tuple[Any, ...]:
    row = run.model_dump(mode="json")
    row["priority"] = run.priority.rank
    row["dead_letter"] = int(run.dead_letter)
    row["result"] = None if run.result is None else json.dumps(run.result)
    return tuple(row[c] for c in RUN_COLUMNS)


def run_from_row(row: sqlite3.Row) -> Run:
    """The run in `row`; a corrupt marker when the row does not decode."""
    data = dict(zip(row.keys(), row, strict=True))  # a quarter of the cost of dict(row), same dict
    try:
        data["priority"] = priority_of(data["priority"])
        data["dead_letter"] = bool(data["dead_letter"])
        if data["result"] is not None:
            data["result"] = json.loads(data["result"])
        return Run.from_store(data)
    except DECODE_ERRORS as exc:
        raw = dict(row)
        raw["priority"] = priority_of(raw["priority"])
        raw.pop("result", None)  # shown only when the row decodes
        return corrupt_run(raw, exc)


def job_from_row(row: sqlite3.Row) -> Job:
    """The job in `row` (`JOB_COLUMNS`); a corrupt marker when its document does not decode."""
    try:
        return Job.model_validate_json(row["doc"])
    except DECODE_ERRORS as exc:
        columns = {k: row[k] for k in ("job_id", "tenant_id", "name", "status", "next_fire_ms", "version")}
        columns["priority"] = priority_of(row["priority"])
        return corrupt_job(row["doc"], columns, exc)


def _job_row(job: Job) -> tuple[Any, ...]:
    return (
        job.job_id,
        job.tenant_id,
        job.name,
        job.status.value,
        job.priority.rank,
        job.next_fire_ms,
        job.version,
        job.model_dump_json(),
    )


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _keyed_by_tenant(conn: sqlite3.Connection) -> bool:
    """Whether jobq_jobs has the (tenant_id, job_id) key, not the previous version's job_id."""
    key = [r["name"] for r in sorted(conn.execute("PRAGMA table_info(jobq_jobs)"), key=lambda r: r["pk"]) if r["pk"]]
    return key == ["tenant_id", "job_id"]


class SqliteStore:
    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._finished: tuple[int, dict[str, int]] | None = None  # (when, count per terminal state)
        db.executescript(SCHEMA)
        if not _keyed_by_tenant(db.connection()):
            self._upgrade()
        self._add_run_columns()

    def _upgrade(self) -> None:
        """Rebuild a jobs table of the previous version (key `job_id`) with the key (tenant_id,
        job_id), in one transaction; another process may have done it first (checked again under
        the write lock)."""
        with self.db.write() as conn:
            if _keyed_by_tenant(conn):
                return
            conn.execute(_JOBS_TABLE.format(name="jobq_jobs_keyed"))
            conn.execute(f"INSERT INTO jobq_jobs_keyed ({JOB_COLUMNS}) SELECT {JOB_COLUMNS} FROM jobq_jobs")
            conn.execute("DROP TABLE jobq_jobs")
            conn.execute("ALTER TABLE jobq_jobs_keyed RENAME TO jobq_jobs")
            for statement in _JOBS_INDEXES:
                conn.execute(statement)

    def _add_run_columns(self) -> None:
        """Add the run columns a file of an earlier version lacks (`handbacks`, `trace`, `attempt_base`): looked at
        first, then again under the write lock, which is taken only when one is missing."""

        def missing(conn: sqlite3.Connection) -> list[str]:
            present = {row[1] for row in conn.execute("PRAGMA table_info(jobq_runs)")}
            return [name for name in _ADDED_RUN_COLUMNS if name not in present]

        if not missing(self.db.connection()):
            return
        with self.db.write() as conn:
            for name in missing(conn):
                conn.execute(f"ALTER TABLE jobq_runs ADD COLUMN {name} {_ADDED_RUN_COLUMNS[name]}")

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        return cls(SqliteDatabase.from_url(url))

    # -- jobs ---------------------------------------------------------------------------------

    def create_job(self, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None = None) -> CreateResult:
        with self.db.write() as conn:
            return self._create(conn, job, runs, idempotency)

    def create_job_group(self, requests: Sequence[CreateRequest]) -> list[CreateResult | JobqError]:
        """One `BEGIN IMMEDIATE` and one commit for the group; each request under a savepoint of its
        own, so a refused one (a duplicate, a conflicting key, a row SQLite rejects) is rolled back
        alone. A lock or I/O error fails the whole group: nothing is committed."""
        if len(requests) == 1:  # a lone caller's: its own transaction is all the savepoint it needs
            [request] = requests
            try:
                return [self.create_job(request.job, request.runs, request.idempotency)]
            except StoreUnavailable:
                raise
            except JobqError as exc:
                return [exc]
        out: list[CreateResult | JobqError] = []
        with self.db.write() as conn:
            for request in requests:
                conn.execute("SAVEPOINT jobq_submit")
                try:
                    out.append(self._create(conn, request.job, request.runs, request.idempotency))
                except (JobqError, sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError) as exc:
                    conn.execute("ROLLBACK TO jobq_submit")
                    out.append(exc if isinstance(exc, JobqError) else StoreError(f"{self.db.path}: {exc}"))
                conn.execute("RELEASE jobq_submit")
        return out

    @staticmethod
    def _create(
        conn: sqlite3.Connection, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None
    ) -> CreateResult:
        """`create_job` inside the caller's write transaction."""
        if idempotency is not None:
            known = conn.execute(
                "SELECT fingerprint, job_id, response, expires_ms FROM jobq_idempotency "
                "WHERE tenant_id = ? AND key = ?",
                (idempotency.tenant_id, idempotency.key),
            ).fetchone()
            if known is not None and known["expires_ms"] > idempotency.created_ms:
                if known["fingerprint"] != idempotency.fingerprint:
                    raise IdempotencyConflict(idempotency.key)
                original = conn.execute(
                    f"SELECT {JOB_COLUMNS} FROM jobq_jobs WHERE tenant_id = ? AND job_id = ?",
                    (idempotency.tenant_id, known["job_id"]),
                ).fetchone()
                if original is not None:
                    return CreateResult(job_from_row(original), False, known["response"])
        try:
            conn.execute(f"INSERT INTO jobq_jobs ({JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _job_row(job))
        except sqlite3.IntegrityError:
            raise DuplicateJob(job.job_id) from None
        conn.executemany(_INSERT_RUN.removesuffix(" RETURNING *"), [_run_values(r) for r in runs])
        if idempotency is not None:
            conn.execute(
                "INSERT OR REPLACE INTO jobq_idempotency VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    idempotency.tenant_id,
                    idempotency.key,
                    idempotency.fingerprint,
                    idempotency.job_id,
                    idempotency.response,
                    idempotency.created_ms,
                    idempotency.expires_ms,
                ),
            )
        return CreateResult(job, created=True)

    def create_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        out: list[bool] = []
        with self.db.write() as conn:
            for job, runs in items:
                created = conn.execute(
                    f"INSERT OR IGNORE INTO jobq_jobs ({JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _job_row(job)
                )
                out.append(created.rowcount == 1)
                if created.rowcount == 1 and runs:
                    conn.executemany(_INSERT_RUN.removesuffix(" RETURNING *"), [_run_values(r) for r in runs])
        return out

    def get_jobs(self, keys: Sequence[JobKey]) -> dict[JobKey, Job]:
        by_tenant: dict[str, list[str]] = {}
        for key in dict.fromkeys(keys):
            by_tenant.setdefault(key.tenant_id, []).append(key.job_id)
        found: dict[JobKey, Job] = {}
        for tenant_id, job_ids in by_tenant.items():
            for chunk in _chunks(job_ids):
                sql = (
                    f"SELECT {JOB_COLUMNS} FROM jobq_jobs WHERE tenant_id = ? "
                    f"AND job_id IN ({placeholders(len(chunk))})"
                )
                for row in self.db.read(sql, [tenant_id, *chunk]):
                    job = job_from_row(row)
                    found[JobKey(row["tenant_id"], row["job_id"])] = job
        return found

    def list_jobs(self, query: JobQuery) -> Page[Job]:
        sql, params = job_list_sql(
            tenant_id=query.tenant_id,
            status=None if query.status is None else query.status.value,
            priority_rank=None if query.priority is None else query.priority.rank,
            name_prefix=query.name_prefix,
            id_prefix=query.id_prefix,
            cursor=query.cursor,
            limit=query.limit,
            newest_first=query.newest_first,
        )
        rows = self.db.read(sql, params)
        jobs = [job_from_row(r) for r in rows[: query.limit]]
        return Page(jobs, job_cursor(jobs[-1]) if len(rows) > query.limit and jobs else None)

    def update_job(self, job: Job) -> Job:
        refuse_corrupt(job)
        stored = job.model_copy(update={"version": job.version + 1})
        row = _job_row(stored)
        with self.db.write() as conn:
            cur = conn.execute(
                "UPDATE jobq_jobs SET name=?, status=?, priority=?, next_fire_ms=?, version=?, doc=? "
                "WHERE tenant_id=? AND job_id=? AND version=?",
                (*row[2:], job.tenant_id, job.job_id, job.version),
            )
            if cur.rowcount == 0:
                exists = conn.execute(
                    "SELECT version FROM jobq_jobs WHERE tenant_id=? AND job_id=?", (job.tenant_id, job.job_id)
                ).fetchone()
                if exists is None:
                    raise JobNotFound(str(job.key))
                raise Conflict(f"job {str(job.key)!r} changed (version {exists['version']}, expected {job.version})")
        return stored

    def set_job_status(
        self, key: JobKey, status: JobStatus, expect: frozenset[JobStatus], now_ms: int, reason: str | None = None
    ) -> bool:
        if not expect:
            return False
        sql = _SET_STATUS.format(reason=", '$.status_reason', ?5", expect=placeholders(len(expect)))
        with self.db.write() as conn:
            params = (status.value, now_ms, key.tenant_id, key.job_id, reason, *sorted(s.value for s in expect))
            return conn.execute(sql, params).rowcount == 1

    def due_jobs(self, before_ms: int, limit: int, shards: Collection[int] | None = None) -> list[Job]:
        """One range scan of `jobq_jobs_due_tier` per tier, CRITICAL first, stopping at `limit`.
        Shards are filtered here, row by row (SQLite has no stable hash function of its own)."""
        wanted = None if shards is None else frozenset(shards)
        jobs: list[Job] = []
        for rank in range(len(PRIORITIES_BY_RANK)):
            if len(jobs) >= limit:
                break
            rows = self._due_rows(rank, before_ms, limit - len(jobs), wanted)
            jobs.extend(job_from_row(r) for r in rows)
        return jobs

    def _due_rows(self, rank: int, before_ms: int, limit: int, shards: frozenset[int] | None) -> list[sqlite3.Row]:
        where = "status = 'ACTIVE' AND next_fire_ms IS NOT NULL AND priority = ? AND next_fire_ms <= ?"
        order = " ORDER BY next_fire_ms, job_id, tenant_id LIMIT ?"
        if shards is None:
            return self.db.read(f"SELECT {JOB_COLUMNS} FROM jobq_jobs WHERE {where}{order}", (rank, before_ms, limit))
        rows: list[sqlite3.Row] = []
        page = max(limit, 200)
        after: tuple[int, str, str] | None = None
        while len(rows) < limit:  # pages in index order, keeping the rows of the wanted shards
            more = "" if after is None else " AND (next_fire_ms, job_id, tenant_id) > (?, ?, ?)"
            params = (rank, before_ms, *(after or ()), page)
            batch = self.db.read(f"SELECT {JOB_COLUMNS} FROM jobq_jobs WHERE {where}{more}{order}", params)
            rows.extend(r for r in batch if job_shard(r["job_id"]) in shards)
            if len(batch) < page:
                break
            after = (batch[-1]["next_fire_ms"], batch[-1]["job_id"], batch[-1]["tenant_id"])
        return rows[:limit]

    def advance_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        """One `BEGIN IMMEDIATE` transaction: each job's compare-and-set, then its runs when it applied."""
        advanced: list[bool] = []
        if not items:
            return advanced
        with self.db.write() as conn:
            for job, runs in items:
                if job.corrupt is not None:
                    advanced.append(False)
                    continue
                row = _job_row(job.model_copy(update={"version": job.version + 1}))
                cur = conn.execute(
                    "UPDATE jobq_jobs SET name=?, status=?, priority=?, next_fire_ms=?, version=?, doc=? "
                    "WHERE tenant_id=? AND job_id=? AND version=?",
                    (*row[2:], job.tenant_id, job.job_id, job.version),
                )
                advanced.append(cur.rowcount == 1)
                if cur.rowcount == 1 and runs:
                    conn.executemany(_INSERT_RUN_QUIETLY, [_run_values(run) for run in runs])
        return advanced

    # -- runs ---------------------------------------------------------------------------------

    def add_runs(self, runs: Sequence[Run]) -> list[Run]:
        if not runs:
            return []
        added: list[Run] = []
        with self.db.write() as conn:
            for run in runs:
                added.extend(run_from_row(r) for r in conn.execute(_INSERT_RUN, _run_values(run)).fetchall())
        return added

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        found: dict[str, Run] = {}
        for chunk in _chunks(list(dict.fromkeys(run_ids))):
            for row in self.db.read(f"SELECT * FROM jobq_runs WHERE run_id IN ({placeholders(len(chunk))})", chunk):
                run = run_from_row(row)
                found[run.run_id] = run
        return found

    def list_runs(self, query: RunQuery) -> Page[Run]:
        where: list[str] = []
        params: list[Any] = []
        if query.job is not None:
            where.append("tenant_id = ? AND job_id = ?")
            params.extend(query.job)
        if query.tenant_id is not None:
            where.append("tenant_id = ?")
            params.append(query.tenant_id)
        if query.states:
            where.append(f"state IN ({placeholders(len(query.states))})")
            params.extend(sorted(s.value for s in query.states))
        if query.dead_letter is not None:
            where.append("dead_letter = ?")
            params.append(int(query.dead_letter))
        if query.cursor:
            nominal, run_id = parse_run_cursor(query.cursor)
            where.append("(nominal_ms < ? OR (nominal_ms = ? AND run_id < ?))")
            params.extend([nominal, nominal, run_id])
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT * FROM jobq_runs {clause} ORDER BY nominal_ms DESC, run_id DESC LIMIT ?"
        rows = self.db.read(sql, [*params, query.limit + 1])
        runs = [run_from_row(r) for r in rows[: query.limit]]
        return Page(runs, run_cursor(runs[-1]) if len(rows) > query.limit and runs else None)

    def run_counts(self, job: JobKey) -> dict[RunState, int]:
        rows = self.db.read(
            "SELECT state, COUNT(*) FROM jobq_runs WHERE tenant_id = ? AND job_id = ? GROUP BY state", tuple(job)
        )
        counts: dict[RunState, int] = {}
        for state, n in rows:
            if state in RunState.__members__:  # a corrupt row's unknown state is not a state
                counts[RunState(state)] = n
        return counts

    def claim(
        self, run_ids: Sequence[str], now_ms: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        claimed: list[Run] = []
        if not run_ids:
            return claimed
        with self.db.write() as conn:
            for chunk in _chunks(run_ids):
                rows = conn.execute(
                    "UPDATE jobq_runs SET state = 'CLAIMED', fence = fence + 1, version = version + 1, "
                    "lease_owner = ?, lease_expires_ms = ?, updated_ms = ? "
                    f"WHERE run_id IN ({placeholders(len(chunk))}) AND state = 'SCHEDULED' AND due_ms <= ? "
                    "RETURNING *",
                    (owner, now_ms + lease_ms, now_ms, *chunk, now_ms if due_by_ms is None else due_by_ms),
                ).fetchall()
                claimed.extend(run_from_row(r) for r in rows)
        claimed.sort(key=lambda r: (r.priority.rank, r.due_ms))
        return claimed

    def claim_due(
        self, now_ms: int, limit: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        """Find and claim runs due by `due_by_ms` (default `now_ms`) in one transaction, CRITICAL
        first: one indexed UPDATE per tier."""
        due_by = now_ms if due_by_ms is None else due_by_ms
        claimed: list[Run] = []
        with self.db.write() as conn:
            for priority in PRIORITIES_BY_RANK:
                if len(claimed) >= limit:
                    break
                rows = conn.execute(
                    "UPDATE jobq_runs SET state = 'CLAIMED', fence = fence + 1, version = version + 1, "
                    "lease_owner = ?, lease_expires_ms = ?, updated_ms = ? WHERE run_id IN ("
                    "SELECT run_id FROM jobq_runs WHERE state = 'SCHEDULED' AND priority = ? AND due_ms <= ? "
                    "ORDER BY due_ms, run_id LIMIT ?) RETURNING *",
                    (owner, now_ms + lease_ms, now_ms, priority.rank, due_by, limit - len(claimed)),
                ).fetchall()
                claimed.extend(sorted((run_from_row(r) for r in rows), key=lambda r: (r.due_ms, r.run_id)))
        return claimed

    def transition(self, transitions: Sequence[Transition]) -> list[Run | None]:
        """One UPDATE per group of same-shaped transitions (the per-row values as one JSON array
        read by `json_each`) and one for the jobs they finish, in one transaction. A run named
        twice in one batch keeps its order: its second transition goes into a later round."""
        if not transitions:
            return []
        rows: list[sqlite3.Row | None] = [None] * len(transitions)
        with self.db.write() as conn:
            for group in transition_groups(transitions):
                statement = _transition_statement(transitions[group[0]])
                if len(group) == 1:  # a lone run: its own row needs no JSON to carry it
                    [i] = group
                    rows[i] = conn.execute(statement.one, statement.values(transitions[i])).fetchone()
                    continue
                values = json.dumps([statement.values(transitions[i]) for i in group])
                applied = {row["run_id"]: row for row in conn.execute(statement.many, (values,)).fetchall()}
                for i in group:
                    rows[i] = applied.get(transitions[i].run_id)
            finished = [
                (t.job_status.value, t.at_ms, row["tenant_id"], row["job_id"])
                for t, row in zip(transitions, rows, strict=True)
                if row is not None and t.job_status is not None
            ]
            if finished:
                _finish_jobs(conn, finished)
        return [None if row is None else run_from_row(row) for row in rows]

    def expired_leases(self, now_ms: int, limit: int) -> list[Run]:
        rows = self.db.read(
            f"SELECT * FROM jobq_runs WHERE state IN {_LEASED} AND lease_expires_ms < ? "
            "ORDER BY lease_expires_ms LIMIT ?",
            (now_ms, limit),
        )
        return [run_from_row(r) for r in rows]

    def expire_results(self, finished_before_ms: int, limit: int) -> int:
        with self.db.write() as conn:
            cursor = conn.execute(
                "UPDATE jobq_runs SET result = NULL WHERE run_id IN (SELECT run_id FROM jobq_runs "
                "WHERE result IS NOT NULL AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND finished_ms < ?1 "
                "ORDER BY finished_ms LIMIT ?2)",
                (finished_before_ms, limit),
            )
            return cursor.rowcount

    def overdue_runs(self, before_ms: int, limit: int) -> list[Run]:
        return [run_from_row(r) for r in self.overdue_rows("*", before_ms, limit)]

    def overdue_rows(self, columns: str, before_ms: int, limit: int) -> list[sqlite3.Row]:
        """SCHEDULED rows due by `before_ms`, CRITICAL first: one indexed range read per tier."""
        rows: list[sqlite3.Row] = []
        for priority in PRIORITIES_BY_RANK:
            if len(rows) >= limit:
                break
            rows.extend(
                self.db.read(
                    f"SELECT {columns} FROM jobq_runs WHERE state = 'SCHEDULED' AND priority = ? AND due_ms <= ? "
                    "ORDER BY due_ms, run_id LIMIT ?",
                    (priority.rank, before_ms, limit - len(rows)),
                )
            )
        return rows

    def next_due_ms(self) -> int | None:
        found = [
            r[0]
            for p in PRIORITIES_BY_RANK
            for r in self.db.read(
                "SELECT MIN(due_ms) FROM jobq_runs WHERE state = 'SCHEDULED' AND priority = ?", (p.rank,)
            )
            if r[0] is not None
        ]
        return min(found) if found else None

    # -- idempotency and workers -------------------------------------------------------------

    def idempotency(self, tenant_id: str, key: str, now_ms: int) -> IdempotencyRecord | None:
        rows = self.db.read(
            "SELECT * FROM jobq_idempotency WHERE tenant_id = ? AND key = ? AND expires_ms > ?",
            (tenant_id, key, now_ms),
        )
        return IdempotencyRecord.model_validate(dict(rows[0])) if rows else None

    def register_worker(self, worker_id: str, tasks: Sequence[str], queues: Sequence[str], now_ms: int) -> None:
        with self.db.write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO jobq_workers VALUES (?, ?, ?, ?)",
                (worker_id, json.dumps(sorted(tasks)), json.dumps(list(queues)), now_ms),
            )

    def known_tasks(self) -> set[str]:
        names: set[str] = set()
        for row in self.db.read("SELECT tasks FROM jobq_workers"):
            names.update(json.loads(row["tasks"]))
        return names

    # -- the daemon registry and the census ----------------------------------------------------

    def heartbeat(self, records: Sequence[DaemonRecord], ttl_ms: int) -> None:
        if not records:
            return
        rows = [(r.daemon_id, r.role.value, r.seen_ms + ttl_ms, expiring(r, ttl_ms).to_json()) for r in records]
        oldest = min(r.seen_ms for r in records) - DAEMON_KEEP_MS
        with self.db.write() as conn:
            conn.executemany("INSERT OR REPLACE INTO jobq_daemons VALUES (?, ?, ?, ?)", rows)
            conn.execute("DELETE FROM jobq_daemons WHERE expires_ms < ?", (oldest,))

    def live_daemons(self, now_ms: int) -> list[DaemonRecord]:
        rows = self.db.read("SELECT doc FROM jobq_daemons WHERE expires_ms > ? ORDER BY role, daemon_id", (now_ms,))
        return decode_daemons(row["doc"] for row in rows)

    def deregister(self, daemon_ids: Sequence[str]) -> None:
        if not daemon_ids:
            return
        with self.db.write() as conn:
            conn.execute(f"DELETE FROM jobq_daemons WHERE daemon_id IN ({placeholders(len(daemon_ids))})", daemon_ids)

    def census(self, now_ms: int) -> Census:
        """Waiting and leased runs and dead letters exactly (indexed); finished runs as counted by a
        scan at most `FINISHED_EVERY_MS` ago."""
        active = [dict(row) for row in self.db.read(_CENSUS_ACTIVE, (now_ms,))]
        dead = int(self.db.read(_CENSUS_DEAD)[0]["n"])
        if self._finished is None or abs(now_ms - self._finished[0]) >= FINISHED_EVERY_MS:
            counts = {row["state"]: int(row["n"]) for row in self.db.read(_CENSUS_FINISHED)}
            self._finished = (now_ms, counts)
        return census_from_rows(now_ms, active, dead, self._finished[1])

    def publish_tasks(self, tasks: Sequence[TaskInfo]) -> None:
        with self.db.write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO jobq_tasks VALUES (?, ?, ?)",
                [(t.name, t.model_dump_json(), t.published_ms) for t in tasks],
            )

    def task_catalogue(self, names: Sequence[str] | None = None) -> dict[str, TaskInfo]:
        if names is None:
            return decode_tasks(r["doc"] for r in self.db.read("SELECT doc FROM jobq_tasks ORDER BY name"))
        docs = []
        for chunk in _chunks(sorted(set(names))):
            docs += [
                r["doc"]
                for r in self.db.read(f"SELECT doc FROM jobq_tasks WHERE name IN ({placeholders(len(chunk))})", chunk)
            ]
        return decode_tasks(docs)

    # -- tokens and tenants -------------------------------------------------------------------

    def put_token(self, token: ApiToken) -> None:
        try:
            with self.db.write() as conn:
                conn.execute(
                    "INSERT INTO jobq_tokens VALUES (?, ?, ?, ?, ?, ?)",
                    (token.token_id, token.tenant_id, token.name, token.token_hash, token.created_ms, token.revoked_ms),
                )
        except StoreError as exc:
            raise Conflict(f"token {token.token_id!r} exists") from exc

    def find_token(self, token_hash: str) -> ApiToken | None:
        rows = self.db.read("SELECT * FROM jobq_tokens WHERE token_hash = ?", (token_hash,))
        return ApiToken.model_validate(dict(rows[0])) if rows else None

    def list_tokens(self, tenant_id: str | None = None) -> list[ApiToken]:
        if tenant_id is None:
            rows = self.db.read("SELECT * FROM jobq_tokens ORDER BY created_ms, token_id")
        else:
            rows = self.db.read(
                "SELECT * FROM jobq_tokens WHERE tenant_id = ? ORDER BY created_ms, token_id", (tenant_id,)
            )
        return [ApiToken.model_validate(dict(r)) for r in rows]

    def revoke_token(self, token_id: str, now_ms: int) -> bool:
        with self.db.write() as conn:
            cur = conn.execute(
                "UPDATE jobq_tokens SET revoked_ms = ? WHERE token_id = ? AND revoked_ms IS NULL", (now_ms, token_id)
            )
            return cur.rowcount == 1

    def tenant_secret(self, tenant_id: str, candidate: str) -> str:
        with self.db.write() as conn:
            conn.execute("INSERT OR IGNORE INTO jobq_tenants VALUES (?, ?)", (tenant_id, candidate))
            row = conn.execute("SELECT webhook_secret FROM jobq_tenants WHERE tenant_id = ?", (tenant_id,)).fetchone()
        return str(row[0])

    def close(self) -> None:
        self.db.close()


class _Statement(NamedTuple):
    """The UPDATE for transitions of one shape (`jobq.store.batches.shape`), built once per shape.

    `values(t)` lays out one transition's values in the order of the statement's columns: the run
    id, then what it sets, then what it compares. `one` takes them as its parameters (?1, ?2, ...);
    `many` takes one parameter, a JSON array of such rows read by `json_each`, joined with the runs
    by id: a scan of the rows and a primary key lookup of each run. Either way each run is held
    to its own expected fence, owner and version; RETURNING gives the runs that moved, in no
    particular order."""

    one: str
    many: str
    values: Callable[[Transition], list[Any]]


_STATEMENTS: dict[tuple[Any, ...], _Statement] = {}


def _transition_statement(t: Transition) -> _Statement:
    """The statement for transitions shaped like `t` (cached)."""
    key = shape(t)
    found = _STATEMENTS.get(key)
    if found is not None:
        return found
    changed = sorted(t.changes)
    guards = [("fence", t.expect_fence), ("lease_owner", t.expect_owner), ("version", t.expect_version)]
    columns = ["run_id"]
    if t.at_ms is not None:
        columns.append("updated_ms")
    columns += changed  # names are whitelisted by Transition
    columns += [f"expect_{name}" for name, value in guards if value is not None]
    expected = ", ".join(f"'{s.value}'" for s in sorted(t.expect))

    def update(ref: Callable[[str], str]) -> str:
        sets = [f"state = '{t.to_state.value}'", "version = r.version + 1"]
        if t.bump_fence:
            sets.append("fence = r.fence + 1")
        sets += [f"{c} = {ref(c)}" for c in columns[1:] if not c.startswith("expect_")]
        where = [f"r.run_id = {ref('run_id')}", f"r.state IN ({expected})"]
        where += [f"r.{c.removeprefix('expect_')} = {ref(c)}" for c in columns if c.startswith("expect_")]
        return f"SET {', '.join(sets)} {{source}}WHERE {' AND '.join(where)} RETURNING *"

    one = "UPDATE jobq_runs AS r " + update(lambda c: f"?{columns.index(c) + 1}").format(source="")
    unpacked = ", ".join(f"json_extract(value, '$[{i}]') AS {c}" for i, c in enumerate(columns))
    source = f"FROM (SELECT {unpacked} FROM json_each(?)) AS t "
    many = "UPDATE jobq_runs AS r " + update(lambda c: f"t.{c}").format(source=source)
    at = t.at_ms is not None
    fence, owner, version = (value is not None for _, value in guards)

    def values(move: Transition) -> list[Any]:
        row: list[Any] = [move.run_id]
        if at:
            row.append(move.at_ms)
        for name in changed:
            value = move.changes[name]
            if name == "result":
                value = None if value is None else json.dumps(value)
            elif name == "dead_letter":
                value = int(value)
            row.append(value)
        if fence:
            row.append(move.expect_fence)
        if owner:
            row.append(move.expect_owner)
        if version:
            row.append(move.expect_version)
        return row

    statement = _Statement(one, many, values)
    _STATEMENTS[key] = statement
    return statement


# `_FINISH_JOB` for many jobs at once: (status, at_ms, tenant_id, job_id) per row of a JSON array.
_FINISH_JOBS = (
    "UPDATE jobq_jobs AS j SET status = t.status, version = j.version + 1, doc = "
    + _STATUS_DOC.replace("{status}", "t.status").replace("{at}", "t.at_ms").format(reason="")
    + " FROM (SELECT json_extract(value, '$[0]') AS status, json_extract(value, '$[1]') AS at_ms, "
    "json_extract(value, '$[2]') AS tenant_id, json_extract(value, '$[3]') AS job_id FROM json_each(?)) AS t "
    "WHERE j.tenant_id = t.tenant_id AND j.job_id = t.job_id AND j.status IN ('ACTIVE', 'COMPLETED')"
)


def _finish_jobs(conn: sqlite3.Connection, finished: Sequence[tuple[str, int | None, Any, Any]]) -> None:
    """Set each (status, at_ms, tenant_id, job_id)'s job status, in order: a job named twice is
    written twice, in a later statement. A run row whose key columns are not text (a corrupt row)
    gets `_FINISH_JOB` on its own, as before."""
    batched = [f for f in finished if type(f[2]) is str and type(f[3]) is str]
    for f in finished:
        if not (type(f[2]) is str and type(f[3]) is str):
            conn.execute(_FINISH_JOB, f)
    if len(batched) == 1:
        conn.execute(_FINISH_JOB, batched[0])
        return
    for group in key_rounds([(f[2], f[3]) for f in batched]):
        conn.execute(_FINISH_JOBS, (json.dumps([batched[i] for i in group]),))
