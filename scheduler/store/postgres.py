"""The PostgreSQL store: jobs, runs, idempotency keys, workers and tokens in one schema.

Connections, migrations and error translation live in `jobq.postgresdb`; the URL and its
parameters are documented there. Semantics mirror `SqliteStore` (the contract suite is the
judge). Every state change is one conditional ``UPDATE ... WHERE state = ANY(...) AND fence = ...
RETURNING``; a `transition` batch is one transaction sent as one pipeline, and a job status
carried by a transition is updated by the same statement. Rows are locked in run-id order
(batches are sorted), so concurrent batches do not deadlock.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from jobq.errors import (
    Conflict,
    DuplicateJob,
    IdempotencyConflict,
    JobNotFound,
    JobqError,
    StoreError,
    StoreUnavailable,
)
from jobq.joblist import parse_job_cursor
from jobq.models import ApiToken, IdempotencyRecord, Job, JobKey, JobStatus, Run, RunState, TaskInfo, Transition
from jobq.ports import CreateRequest, CreateResult, JobQuery, Page, RunQuery
from jobq.postgresdb import RUN_COLUMNS, PostgresDatabase
from jobq.records import DECODE_ERRORS, corrupt_job, corrupt_run, decode_tasks, priority_of
from jobq.registry import Census, DaemonRecord, census_from_rows, decode_daemons, expiring
from jobq.store.batches import transition_groups
from jobq.store.memory import job_cursor, parse_run_cursor, refuse_corrupt, run_cursor

if TYPE_CHECKING:
    import psycopg.types.json
    from psycopg.rows import DictRow

    from jobq.postgresdb import Connection
else:
    from jobq.postgresdb import psycopg  # imported lazily there, with the extra's name on failure

T = TypeVar("T")

# -- SQL ----------------------------------------------------------------------------------------
# Templates: {jobs}, {runs}, {idem}, {workers}, {tasks}, {events} are the schema-qualified tables, {cols}
# the run columns (named, never `*`, so a column added by a later migration cannot break `Run`).

DAEMON_KEEP_MS = 3_600_000  # expired registry entries are pruned this long after expiry
# The census. Waiting and leased runs are counted exactly through the scanner's and the reaper's
# partial indexes (the WHERE clauses repeat theirs), dead letters through theirs. Finished runs,
# the bulk of the table, are estimated from the planner's statistics (ANALYZE's sample: the share
# of each state times the row estimate), and counted only while the table has never been analysed.
_CENSUS_ACTIVE = (
    "SELECT state, priority, COUNT(*) AS n, COUNT(*) FILTER (WHERE due_ms <= %(now)s) AS due, "
    "MIN(due_ms) FILTER (WHERE due_ms <= %(now)s) AS oldest_due_ms, NULL::bigint AS oldest_dispatched_ms "
    "FROM {runs} WHERE state = 'SCHEDULED' GROUP BY state, priority "
    "UNION ALL "
    "SELECT state, priority, COUNT(*) AS n, "
    "COUNT(*) FILTER (WHERE state = 'CLAIMED' AND due_ms <= %(now)s) AS due, "
    "MIN(due_ms) FILTER (WHERE state = 'CLAIMED' AND due_ms <= %(now)s) AS oldest_due_ms, "
    "MIN(coalesce(dispatched_ms, updated_ms)) FILTER (WHERE state = 'DISPATCHED') AS oldest_dispatched_ms "
    "FROM {runs} WHERE state IN ('CLAIMED', 'DISPATCHED', 'RUNNING') GROUP BY state, priority"
)
_CENSUS_DEAD = "SELECT COUNT(*) AS n FROM {runs} WHERE dead_letter"
_CENSUS_STATISTICS = (
    "SELECT c.reltuples AS rows, s.most_common_vals::text AS vals, s.most_common_freqs AS freqs "
    "FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = %(schema)s AND s.tablename = 'jobq_runs' "
    "AND s.attname = 'state' WHERE c.oid = to_regclass(%(runs)s)"
)
_CENSUS_FINISHED = (
    "SELECT state, COUNT(*) AS n FROM {runs} WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') GROUP BY state"
)
_FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")

_TIERS = "(VALUES (0::smallint), (1::smallint), (2::smallint), (3::smallint)) AS tier(rank)"


_INSERT_JOB = (
    "INSERT INTO {jobs} (job_id, tenant_id, name, status, priority, next_fire_ms, version, doc) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb) ON CONFLICT (tenant_id, job_id) DO NOTHING RETURNING job_id"
)
_UPDATE_JOB = (
    "UPDATE {jobs} SET name = %s, status = %s, priority = %s, next_fire_ms = %s, version = %s, "
    "doc = %s::jsonb WHERE tenant_id = %s AND job_id = %s AND version = %s RETURNING job_id"
)
_JOB_COLUMNS = "job_id, tenant_id, name, status, priority, next_fire_ms, version, doc::text AS doc"
# The document's status, version and updated time follow the columns; a document that is not a
# JSON object (a corrupt row) is left as it is.
_DOC_STATUS = (
    "CASE WHEN jsonb_typeof({alias}doc) = 'object' THEN {alias}doc || jsonb_build_object("
    "'status', {status}::text, 'version', {alias}version + 1, 'updated_ms', {updated}{more}) ELSE {alias}doc END"
)
_SET_STATUS = (
    "UPDATE {jobs} SET status = %(status)s, version = version + 1, doc = "
    + _DOC_STATUS.format(
        alias="", status="%(status)s", updated="%(now)s::bigint", more=", 'status_reason', %(reason)s::text"
    )
    + " WHERE tenant_id = %(tenant_id)s AND job_id = %(job_id)s AND status = ANY(%(expect)s::text[]) RETURNING job_id"
)
_INSERT_JOBS = (
    "INSERT INTO {jobs} (job_id, tenant_id, name, status, priority, next_fire_ms, version, doc) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::smallint[], %b::bigint[], "
    "%b::bigint[], %b::text[]::jsonb[]) ON CONFLICT (tenant_id, job_id) DO NOTHING RETURNING tenant_id, job_id"
)
# Beat's advance of a batch of jobs: one compare-and-set per job on its version, in one statement.
# The rows are locked in key order first, so two beats advancing overlapping batches (while their
# views of who owns which shard differ) queue behind each other instead of deadlocking.
_ADVANCE_JOBS = (
    "WITH v AS (SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::smallint[], "
    "%b::bigint[], %b::bigint[], %b::text[]) AS v(job_id, tenant_id, name, status, priority, next_fire_ms, "
    "version, doc)), "
    "locked AS (SELECT j.tenant_id, j.job_id FROM {jobs} AS j JOIN v ON j.tenant_id = v.tenant_id "
    "AND j.job_id = v.job_id AND j.version = v.version ORDER BY j.tenant_id, j.job_id FOR UPDATE OF j) "
    "UPDATE {jobs} AS j SET name = v.name, status = v.status, priority = v.priority, "
    "next_fire_ms = v.next_fire_ms, version = v.version + 1, doc = v.doc::jsonb "
    "FROM v JOIN locked ON locked.tenant_id = v.tenant_id AND locked.job_id = v.job_id "
    "WHERE j.tenant_id = v.tenant_id AND j.job_id = v.job_id AND j.version = v.version "
    "RETURNING j.tenant_id, j.job_id"
)
# Due jobs, CRITICAL first: one range scan of jobq_jobs_due_tier per tier, in tier order, stopping
# at the limit (as `_OVERDUE` does for runs). A beat's shards are `hashtext(job_id) & 15`.
_DUE_JOBS_WHERE = (
    "status = 'ACTIVE' AND next_fire_ms IS NOT NULL AND priority = tier.rank AND next_fire_ms <= %(before)s"
)
_DUE_JOBS = (
    "SELECT j.* FROM " + _TIERS + " CROSS JOIN LATERAL ("
    f"SELECT {_JOB_COLUMNS} FROM {{jobs}} WHERE {_DUE_JOBS_WHERE} "
    "ORDER BY next_fire_ms, job_id LIMIT %(limit)s) AS j LIMIT %(limit)s"
)
_DUE_JOBS_SHARDED = _DUE_JOBS.replace(
    _DUE_JOBS_WHERE, _DUE_JOBS_WHERE + " AND (hashtext(job_id) & 15) = ANY(%(shards)s::int[])"
)
_INSERT_RUN = (
    "INSERT INTO {runs} ({cols}) VALUES ("
    + ", ".join("%s" for _ in RUN_COLUMNS)
    + ") ON CONFLICT (run_id) DO NOTHING RETURNING {cols}"
)
_INSERT_RUN_QUIETLY = _INSERT_RUN.removesuffix(" RETURNING {cols}")
# A new job and its first runs in one statement, so one round trip: the runs (a JSON array of rows,
# which PostgreSQL converts column by column) go in only when the job did, and `created` says which.
_CREATE_JOB = (
    "WITH job AS (" + _INSERT_JOB + "), "
    "runs AS (INSERT INTO {runs} ({cols}) SELECT {cols} FROM jsonb_populate_recordset(NULL::{runs}, %s::jsonb) "
    "WHERE EXISTS (SELECT 1 FROM job) ON CONFLICT (run_id) DO NOTHING) "
    "SELECT count(*) AS created FROM job"
)
_REPLACE_KEY = (
    "INSERT INTO {idem} AS i (tenant_id, key, fingerprint, job_id, response, created_ms, expires_ms) "
    "VALUES (%(tenant_id)s, %(key)s, %(fingerprint)s, %(job_id)s, %(response)s, %(created_ms)s, %(expires_ms)s) "
    "ON CONFLICT (tenant_id, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, job_id = EXCLUDED.job_id, "
    "response = EXCLUDED.response, created_ms = EXCLUDED.created_ms, expires_ms = EXCLUDED.expires_ms"
)
# Takes the key when it is free or expired; returns nothing when an unexpired record holds it. On a
# conflict with a transaction still in flight PostgreSQL waits for its outcome, so of two
# concurrent requests with one key exactly one creates a job.
_TAKE_KEY = _REPLACE_KEY + " WHERE i.expires_ms <= EXCLUDED.created_ms RETURNING i.key"
_CLAIM = (
    "UPDATE {runs} SET state = 'CLAIMED', fence = fence + 1, version = version + 1, "
    "lease_owner = %(owner)s, lease_expires_ms = %(expires)s, updated_ms = %(now)s "
    "WHERE run_id = ANY(%(ids)b::text[]) AND state = 'SCHEDULED' AND due_ms <= %(due_by)s RETURNING {cols}"
)
# Due runs, CRITICAL first: one tight range scan of jobq_runs_due per tier (priority = k AND
# due_ms <= now), in tier order, stopping at the limit. A single `ORDER BY priority, due_ms` over
# the same index would step over every future-due (and every parked) run of the higher tiers
# before it reached a due run of a lower one.
_OVERDUE = (
    "SELECT r.* FROM " + _TIERS + " CROSS JOIN LATERAL ("
    "SELECT {cols} FROM {runs} WHERE state = 'SCHEDULED' AND priority = tier.rank AND due_ms <= %(before)s "
    "ORDER BY due_ms, run_id LIMIT %(limit)s) AS r LIMIT %(limit)s"
)
# The fused claim: the same per-tier scan, locking with SKIP LOCKED (rows another scanner is
# claiming are passed over, never waited for) and then claimed by primary key. The ids go through
# an array so that the plan is an index lookup whatever the statistics say.
_CLAIM_DUE = (
    "WITH due AS (SELECT d.run_id FROM " + _TIERS + " CROSS JOIN LATERAL ("
    "SELECT run_id FROM {runs} WHERE state = 'SCHEDULED' AND priority = tier.rank AND due_ms <= %(due_by)s "
    "ORDER BY due_ms, run_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS d LIMIT %(limit)s) "
    "UPDATE {runs} SET state = 'CLAIMED', fence = fence + 1, version = version + 1, "
    "lease_owner = %(owner)s, lease_expires_ms = %(expires)s, updated_ms = %(now)s "
    "WHERE run_id = ANY(ARRAY(SELECT run_id FROM due)) AND state = 'SCHEDULED' RETURNING {cols}"
)
_NEXT_DUE = (
    "SELECT min(d.due_ms) AS due_ms FROM " + _TIERS + " CROSS JOIN LATERAL ("
    "SELECT due_ms FROM {runs} WHERE state = 'SCHEDULED' AND priority = tier.rank ORDER BY due_ms LIMIT 1) AS d"
)
_EXPIRED = (
    "SELECT {cols} FROM {runs} WHERE state IN ('CLAIMED', 'DISPATCHED', 'RUNNING') AND lease_expires_ms < %s "
    "ORDER BY lease_expires_ms, run_id LIMIT %s"
)
# Finished runs that still hold a result, oldest first (migration 8's partial index); rows another
# reaper is clearing are skipped, not waited for.
_EXPIRE_RESULTS = (
    "UPDATE {runs} SET result = NULL WHERE run_id IN (SELECT run_id FROM {runs} WHERE result IS NOT NULL "
    "AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND finished_ms < %(before)s "
    "ORDER BY finished_ms LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING run_id"
)
# A job status carried by transitions moves their jobs in the same statement (ACTIVE or COMPLETED
# only), keeping the JSON document's status, version and updated time equal to the columns.
_FINISH_JOBS = (
    "moved AS ({update}), finished AS ("
    "UPDATE {jobs} AS j SET status = %(job_status)s, version = j.version + 1, doc = "
    + _DOC_STATUS.format(
        alias="j.",
        status="%(job_status)s",
        updated="coalesce(to_jsonb(moved.updated_ms), j.doc -> 'updated_ms')",
        more="",
    )
    + " FROM moved WHERE j.tenant_id = moved.tenant_id AND j.job_id = moved.job_id "
    "AND j.status IN ('ACTIVE', 'COMPLETED')) "
    "SELECT * FROM moved"
)
# `SET LOCAL` of three settings in one statement (one round of parse, bind and execute, not three).
_PLAN_FOR_BATCHES = (
    "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
)
_COLUMN_TYPES = {
    "attempt": "integer",
    "due_ms": "bigint",
    "lease_owner": "text",
    "lease_expires_ms": "bigint",
    "last_heartbeat_ms": "bigint",
    "last_error": "text",
    "deadline_ms": "bigint",
    "blocked_by": "text",
    "dead_letter": "boolean",
    "result": "text",  # JSON text, cast to jsonb in the SET
    "dispatched_ms": "bigint",
    "started_ms": "bigint",
    "finished_ms": "bigint",
    "handbacks": "integer",
    "attempt_base": "integer",
}


_INSERT_TOKEN = (
    "INSERT INTO {tokens} (token_id, tenant_id, name, token_hash, created_ms, revoked_ms) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
_SELECT_TOKENS = "SELECT token_id, tenant_id, name, token_hash, created_ms, revoked_ms FROM {tokens}"
# Insert-if-absent and read in one statement: the CTE's insert is invisible to the outer SELECT, so
# the UNION reads the row that was there before when the insert did nothing.
_TENANT_SECRET = (
    "WITH added AS (INSERT INTO {tenants} (tenant_id, webhook_secret) VALUES (%s, %s) "
    "ON CONFLICT (tenant_id) DO NOTHING RETURNING webhook_secret) "
    "SELECT webhook_secret FROM added UNION ALL SELECT webhook_secret FROM {tenants} WHERE tenant_id = %s LIMIT 1"
)

# -- rows ---------------------------------------------------------------------------------------


def _json(value: Any) -> Any:
    return None if value is None else psycopg.types.json.Jsonb(value)


def _run_row(run: Run) -> dict[str, Any]:
    """The run's columns by name, as JSON values (the priority as its rank)."""
    row = run.model_dump(mode="json")
    row["priority"] = run.priority.rank
    return row


def _run_values(run: Run) -> list[Any]:
    row = _run_row(run)
    row["result"] = _json(row["result"])
    return [row[c] for c in RUN_COLUMNS]


def run_from_row(row: DictRow) -> Run:
    """The run in `row`; a corrupt marker when the row does not decode."""
    data = dict(row)
    data["priority"] = priority_of(data["priority"])
    try:
        return Run.from_store(data)
    except DECODE_ERRORS as exc:
        return corrupt_run(data, exc)


def job_from_row(row: DictRow) -> Job:
    """The job in `row` (`_JOB_COLUMNS`); a corrupt marker when its document does not decode."""
    try:
        return Job.model_validate_json(row["doc"])
    except DECODE_ERRORS as exc:
        columns = {k: row[k] for k in ("job_id", "tenant_id", "name", "status", "next_fire_ms", "version")}
        columns["priority"] = priority_of(row["priority"])
        return corrupt_job(row["doc"], columns, exc)


def _job_values(job: Job) -> list[Any]:
    return [
        job.tenant_id,
        job.name,
        job.status.value,
        job.priority.rank,
        job.next_fire_ms,
        job.version,
        job.model_dump_json(),
    ]


def _insert_job(conn: Connection, db: PostgresDatabase, job: Job, runs: Sequence[Run]) -> bool:
    """Insert `job` and, when it is new, its `runs` (`_CREATE_JOB`); False when the key exists."""
    rows = json.dumps([_run_row(run) for run in runs], separators=(",", ":"))
    params = [job.job_id, *_job_values(job), rows]
    found = conn.execute(db.sql(_CREATE_JOB), params).fetchone()
    return found is not None and found["created"] == 1


def _job_columns(jobs: Sequence[Job]) -> list[list[Any]]:
    """The jobs as one array per column, for `_INSERT_JOBS`."""
    rows = [[job.job_id, *_job_values(job)] for job in jobs]
    return [list(column) for column in zip(*rows, strict=True)]


def _in_order(runs: Sequence[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.priority.rank, r.due_ms, r.run_id))


class PostgresStore:
    """`JobStore` on PostgreSQL. See the module docstring for the URL, migrations and errors."""

    # Submission groups writing at once: while one waits for its commit (its WAL flush), the
    # next is being sent; more than a few only queue on the same flush.
    concurrent_groups = 4

    def __init__(self, db: PostgresDatabase, *, owns_db: bool = True, check_schema: bool = True) -> None:
        """Use `db` (closed by `close` when `owns_db`). `check_schema` applies the URL's ``migrate``
        policy; `jobq init` passes False, because its job is to upgrade an outdated schema."""
        self.db = db
        self._owns_db = owns_db
        if check_schema:
            db.ensure_schema()

    @classmethod
    def from_url(cls, url: str, *, check_schema: bool = True) -> PostgresStore:
        db = PostgresDatabase.from_url(url)
        try:
            return cls(db, check_schema=check_schema)
        except BaseException:
            db.close()
            raise

    def migrate(self) -> list[int]:
        """Apply pending schema migrations (what `jobq init` runs); returns the versions applied."""
        return self.db.migrate()

    # -- jobs ------------------------------------------------------------------------------------

    def create_job(self, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None = None) -> CreateResult:
        return self.db.run(lambda conn: self._create(conn, job, runs, idempotency))

    def _create(
        self, conn: Connection, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None
    ) -> CreateResult:
        """`create_job` inside the caller's transaction (raising rolls back what it wrote)."""
        db = self.db
        if idempotency is not None:
            key = idempotency.model_dump()
            if conn.execute(db.sql(_TAKE_KEY), key).fetchone() is None:
                known = conn.execute(
                    db.sql("SELECT fingerprint, job_id, response FROM {idem} WHERE tenant_id = %s AND key = %s"),
                    [idempotency.tenant_id, idempotency.key],
                ).fetchone()
                if known is not None and known["fingerprint"] != idempotency.fingerprint:
                    raise IdempotencyConflict(idempotency.key)
                if known is not None:
                    original = conn.execute(
                        db.sql(f"SELECT {_JOB_COLUMNS} FROM {{jobs}} WHERE tenant_id = %s AND job_id = %s"),
                        [idempotency.tenant_id, known["job_id"]],
                    ).fetchone()
                    if original is not None:
                        return CreateResult(job_from_row(original), False, known["response"])
                # The key names a job that no longer exists: it now names this one (as in SQLite).
                conn.execute(db.sql(_REPLACE_KEY), key)
        if not _insert_job(conn, db, job, runs):
            raise DuplicateJob(job.job_id)  # raising rolls the idempotency key back too
        return CreateResult(job, created=True)

    def create_job_group(self, requests: Sequence[CreateRequest]) -> list[CreateResult | JobqError]:
        """One transaction in pipeline mode. The requests without an Idempotency-Key go in together:
        their jobs in one `INSERT ... SELECT FROM unnest` (an existing key is that request's
        `DuplicateJob`; of two in the group with one key the first wins), then the created jobs'
        runs, without waiting for each statement: with the commit, two round trips for the group.
        Those with a key follow one by one, each under a savepoint, exactly as `create_job` does
        them (a refused one rolls back alone; a second request with a key the group has just taken
        replays or conflicts with the first).

        A statement the server refuses (a row it cannot store) aborts the transaction, and nothing
        of the group is applied; then each request is written alone, so the refusal is its own."""
        if not requests:
            return []
        if len(requests) == 1:
            # A lone caller's: its transaction is all the savepoint it needs. Without a key it is
            # one statement, which pipeline mode would only slow down (its syncs cost a round trip).
            [one] = requests
            try:
                return [
                    self.db.run(
                        lambda conn: self._create(conn, one.job, one.runs, one.idempotency),
                        pipeline=one.idempotency is not None,
                    )
                ]
            except StoreUnavailable:
                raise
            except JobqError as exc:
                return [exc]
        try:
            return self.db.run(lambda conn: self._group(conn, requests), pipeline=True)
        except StoreUnavailable:
            raise
        except StoreError:
            return [self._alone(r) for r in requests]

    def _group(self, conn: Connection, requests: Sequence[CreateRequest]) -> list[CreateResult | JobqError]:
        db = self.db
        out: dict[int, CreateResult | JobqError] = {}
        first: dict[JobKey, int] = {}
        for i, request in enumerate(requests):
            if request.idempotency is not None:
                continue
            if request.job.key in first:
                out[i] = DuplicateJob(request.job.job_id)
            else:
                first[request.job.key] = i
        if len(first) == 1:  # a lone caller's: one plain statement (no arrays to build and dump)
            [i] = first.values()
            created = _insert_job(conn, db, requests[i].job, requests[i].runs)
            out[i] = CreateResult(requests[i].job, created=True) if created else DuplicateJob(requests[i].job.job_id)
        elif first:
            rows = conn.execute(db.sql(_INSERT_JOBS), _job_columns([requests[i].job for i in first.values()]))
            made = {JobKey(row["tenant_id"], row["job_id"]) for row in rows.fetchall()}
            runs: list[Run] = []
            for key, i in first.items():
                if key in made:
                    out[i] = CreateResult(requests[i].job, created=True)
                    runs.extend(requests[i].runs)
                else:
                    out[i] = DuplicateJob(requests[i].job.job_id)
            if runs:
                conn.cursor().executemany(db.sql(_INSERT_RUN), [_run_values(r) for r in runs])
        for i, request in enumerate(requests):
            if request.idempotency is None:
                continue
            try:
                with conn.transaction():  # a savepoint
                    out[i] = self._create(conn, request.job, request.runs, request.idempotency)
            except JobqError as exc:
                out[i] = exc
        return [out[i] for i in range(len(requests))]

    def _alone(self, request: CreateRequest) -> CreateResult | JobqError:
        try:
            return self.create_job(request.job, request.runs, request.idempotency)
        except JobqError as exc:
            return exc

    def create_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        """The jobs in one statement (`INSERT ... SELECT FROM unnest`, skipping existing ids) and
        the created jobs' runs in a second, in one transaction."""
        if not items:
            return []
        db = self.db
        jobs = [job for job, _ in items]

        def body(conn: Connection) -> set[JobKey]:
            rows = conn.execute(db.sql(_INSERT_JOBS), _job_columns(jobs)).fetchall()
            created = {JobKey(row["tenant_id"], row["job_id"]) for row in rows}
            runs = [run for job, job_runs in items if job.key in created for run in job_runs]
            if runs:
                conn.cursor().executemany(db.sql(_INSERT_RUN), [_run_values(r) for r in runs])
            return created

        created = db.run(body)
        return [job.key in created for job in jobs]

    def get_jobs(self, keys: Sequence[JobKey]) -> dict[JobKey, Job]:
        if not keys:
            return {}
        unique = list(dict.fromkeys(keys))
        rows = self.db.read(
            f"SELECT {_JOB_COLUMNS} FROM {{jobs}} WHERE (tenant_id, job_id) IN "
            "(SELECT * FROM unnest(%b::text[], %b::text[]))",
            [[k.tenant_id for k in unique], [k.job_id for k in unique]],
        )
        return {JobKey(r["tenant_id"], r["job_id"]): job_from_row(r) for r in rows}

    def list_jobs(self, query: JobQuery) -> Page[Job]:
        where: list[str] = []
        params: list[Any] = []
        past = "<" if query.newest_first else ">"
        if query.cursor:
            job_id, tenant = parse_job_cursor(query.cursor)
            if tenant is None:
                where.append(f"job_id {past} %s")
                params.append(job_id)
            else:
                where.append(f"(job_id, tenant_id) {past} (%s, %s)")
                params.extend([job_id, tenant])
        if query.tenant_id is not None:
            where.append("tenant_id = %s")
            params.append(query.tenant_id)
        if query.status is not None:
            where.append("status = %s")
            params.append(query.status.value)
        if query.priority is not None:
            where.append("priority = %s")
            params.append(query.priority.rank)
        if query.name_prefix:
            where.append("starts_with(name, %s)")  # not LIKE: a prefix may contain % or _
            params.append(query.name_prefix)
        if query.id_prefix:
            where.append("starts_with(job_id, %s)")
            params.append(query.id_prefix)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        order = "job_id DESC, tenant_id DESC" if query.newest_first else "job_id, tenant_id"
        sql = f"SELECT {_JOB_COLUMNS} FROM {{jobs}} {clause} ORDER BY {order} LIMIT %s"
        rows = self.db.read(sql, [*params, query.limit + 1])
        jobs = [job_from_row(r) for r in rows[: query.limit]]
        return Page(jobs, job_cursor(jobs[-1]) if len(rows) > query.limit and jobs else None)

    def update_job(self, job: Job) -> Job:
        refuse_corrupt(job)
        stored = job.model_copy(update={"version": job.version + 1})
        db = self.db

        def body(conn: Connection) -> None:
            params = [*_job_values(stored)[1:], job.tenant_id, job.job_id, job.version]
            if conn.execute(db.sql(_UPDATE_JOB), params).fetchone() is None:
                row = conn.execute(
                    db.sql("SELECT version FROM {jobs} WHERE tenant_id = %s AND job_id = %s"), [*job.key]
                ).fetchone()
                if row is None:
                    raise JobNotFound(str(job.key))
                raise Conflict(f"job {str(job.key)!r} changed (version {row['version']}, expected {job.version})")

        db.run(body)
        return stored

    def set_job_status(
        self, key: JobKey, status: JobStatus, expect: frozenset[JobStatus], now_ms: int, reason: str | None = None
    ) -> bool:
        params = {
            "status": status.value,
            "reason": reason,
            "now": now_ms,
            "tenant_id": key.tenant_id,
            "job_id": key.job_id,
            "expect": sorted(s.value for s in expect),
        }
        return bool(self.db.read(_SET_STATUS, params))

    def due_jobs(self, before_ms: int, limit: int, shards: Collection[int] | None = None) -> list[Job]:
        params: dict[str, Any] = {"before": before_ms, "limit": limit}
        sql = _DUE_JOBS
        if shards is not None:
            sql = _DUE_JOBS_SHARDED
            params["shards"] = sorted(shards)
        return [job_from_row(r) for r in self.db.read(sql, params)]

    def advance_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        """One transaction: the advances in one statement (`_ADVANCE_JOBS`), then the runs of the
        jobs it moved, in run-id order, in one pipelined `executemany`."""
        wanted = [(job, runs) for job, runs in items if job.corrupt is None]
        if not wanted:
            return [False] * len(items)
        db = self.db
        rows = [[job.job_id, *_job_values(job.model_copy(update={"version": job.version + 1}))] for job, _ in wanted]
        columns = [list(column) for column in zip(*rows, strict=True)]
        columns[6] = [job.version for job, _ in wanted]  # the version expected (the document holds the next)

        def body(conn: Connection) -> set[JobKey]:
            moved = {JobKey(r["tenant_id"], r["job_id"]) for r in conn.execute(db.sql(_ADVANCE_JOBS), columns)}
            runs = {run.run_id: run for job, job_runs in wanted if job.key in moved for run in job_runs}
            if runs:
                conn.cursor().executemany(db.sql(_INSERT_RUN_QUIETLY), [_run_values(runs[i]) for i in sorted(runs)])
            return moved

        moved = db.run(body)
        return [job.corrupt is None and job.key in moved for job, _ in items]

    # -- runs ------------------------------------------------------------------------------------

    def add_runs(self, runs: Sequence[Run]) -> list[Run]:
        if not runs:
            return []
        first: dict[str, Run] = {}
        for run in runs:
            first.setdefault(run.run_id, run)
        db = self.db

        def body(conn: Connection) -> dict[str, Run]:
            cur = conn.cursor()
            # Inserting in id order: two beats adding overlapping batches take the same locks in
            # the same order instead of deadlocking.
            ordered = [first[i] for i in sorted(first)]
            cur.executemany(db.sql(_INSERT_RUN), [_run_values(r) for r in ordered], returning=True)
            added: dict[str, Run] = {}
            while True:
                for row in cur.fetchall():
                    run = run_from_row(row)
                    added[run.run_id] = run
                if not cur.nextset():
                    return added

        added = db.run(body)
        return [added[i] for i in first if i in added]

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        if not run_ids:
            return {}
        rows = self.db.read("SELECT {cols} FROM {runs} WHERE run_id = ANY(%b::text[])", [list(set(run_ids))])
        runs = (run_from_row(r) for r in rows)
        return {r.run_id: r for r in runs}

    def list_runs(self, query: RunQuery) -> Page[Run]:
        where: list[str] = []
        params: list[Any] = []
        if query.job is not None:
            where.append("tenant_id = %s AND job_id = %s")
            params.extend(query.job)
        if query.tenant_id is not None:
            where.append("tenant_id = %s")
            params.append(query.tenant_id)
        if query.states:
            where.append("state = ANY(%s)")
            params.append(sorted(s.value for s in query.states))
        if query.dead_letter is not None:
            where.append("dead_letter = %s")
            params.append(query.dead_letter)
        if query.cursor:
            where.append("(nominal_ms, run_id) < (%s, %s)")
            params.extend(parse_run_cursor(query.cursor))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT {{cols}} FROM {{runs}} {clause} ORDER BY nominal_ms DESC, run_id DESC LIMIT %s"
        rows = self.db.read(sql, [*params, query.limit + 1])
        runs = [run_from_row(r) for r in rows[: query.limit]]
        return Page(runs, run_cursor(runs[-1]) if len(rows) > query.limit and runs else None)

    def run_counts(self, job: JobKey) -> dict[RunState, int]:
        rows = self.db.read(
            "SELECT state, count(*) AS n FROM {runs} WHERE tenant_id = %s AND job_id = %s GROUP BY state", [*job]
        )
        return {RunState(r["state"]): int(r["n"]) for r in rows}

    def claim(
        self, run_ids: Sequence[str], now_ms: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        """One conditional UPDATE for all ids. A row another claimer holds is waited for, then
        re-checked (READ COMMITTED): it is claimed here only if still SCHEDULED and due."""
        if not run_ids:
            return []
        due_by = now_ms if due_by_ms is None else due_by_ms
        params = {
            "ids": list(set(run_ids)),
            "now": now_ms,
            "due_by": due_by,
            "owner": owner,
            "expires": now_ms + lease_ms,
        }
        db = self.db
        rows = db.run(lambda conn: conn.execute(db.sql(_CLAIM), params).fetchall())
        return _in_order([run_from_row(r) for r in rows])

    def claim_due(
        self, now_ms: int, limit: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        """Find and claim up to `limit` runs due by `due_by_ms` (default `now_ms`) in one statement,
        CRITICAL first, then by due time. Rows locked by a concurrent claim are skipped, never
        waited for, so scanners running at once never block each other and never claim the same run."""
        if limit <= 0:
            return []
        due_by = now_ms if due_by_ms is None else due_by_ms
        params = {"now": now_ms, "due_by": due_by, "limit": limit, "owner": owner, "expires": now_ms + lease_ms}
        db = self.db
        rows = db.run(lambda conn: conn.execute(db.sql(_CLAIM_DUE), params).fetchall())
        return _in_order([run_from_row(r) for r in rows])

    def analyze(self) -> None:
        """Bring the planner's statistics of the jobq tables up to date. Autovacuum does this within
        about a minute of heavy writes; until then a table filled since its last ANALYZE is
        planned as if it were nearly empty, and batched transitions pick nested loops that compare
        every row of the batch with every run (hundreds of ms where a few ms is right). `jobq
        bench` calls this after submitting its runs, as an established deployment would be."""
        db = self.db
        db.run(lambda conn: conn.execute(db.sql("ANALYZE {jobs}, {runs}")))

    def explain_claim_due(self, now_ms: int, limit: int, *, analyze: bool = False) -> str:
        """The plan of `claim_due` (for operators and tests). With `analyze` the claim really
        runs, inside a transaction that is rolled back."""
        params = {"now": now_ms, "due_by": now_ms, "limit": limit, "owner": "explain", "expires": now_ms}
        options = "ANALYZE, BUFFERS, COSTS OFF" if analyze else "COSTS OFF"
        sql = self.db.sql(f"EXPLAIN ({options}) {_CLAIM_DUE}")
        with self.db.connection() as conn, conn.transaction(force_rollback=True):
            rows = conn.execute(sql, params).fetchall()
        return "\n".join(str(r["QUERY PLAN"]) for r in rows)

    def transition(self, transitions: Sequence[Transition]) -> list[Run | None]:
        """One statement per group of same-shaped transitions (per-row values as arrays through
        `unnest`), all in one transaction. A run named twice in one batch keeps its order: its
        second transition goes into a later round."""
        if not transitions:
            return []
        statements = [
            (*self._group_sql([transitions[i] for i in group]), group) for group in transition_groups(transitions)
        ]

        def body(conn: Connection) -> list[Any]:
            # The rows go in sorted by run id; a nested loop over them (the plan for any batch a
            # daemon sends) locks runs in that order. Ruling out hash and merge joins for this
            # transaction makes that the only plan, so every batch locks in one order and two
            # batches cannot deadlock. Planning cost is unchanged: it is the plan chosen anyway.
            # psycopg prepares a statement run often; PostgreSQL would still plan it again at every
            # execution (an array parameter's estimate makes the generic plan look dearer than a
            # custom one), a third of a millisecond of the server's CPU per statement. The generic
            # plan is that same nested loop (no condition compares a run with a constant).
            conn.execute(_PLAN_FOR_BATCHES)
            return [conn.execute(sql, params) for sql, params, _ in statements]

        # Pipelined: BEGIN, the statements and COMMIT go out together and the rows are read once
        # the commit is back (client-side cursors keep their results), so a batch is one round trip.
        cursors = self.db.run(body, pipeline=True)
        out: list[Run | None] = [None] * len(transitions)
        for cursor, (_, _, group) in zip(cursors, statements, strict=True):
            by_id = {row["run_id"]: row for row in cursor.fetchall()}
            for i in group:
                row = by_id.get(transitions[i].run_id)
                out[i] = None if row is None else run_from_row(row)
        return out

    def _group_sql(self, group: Sequence[Transition]) -> tuple[str, dict[str, Any]]:
        """The UPDATE for transitions of one shape, its rows sorted by run id (see `transition` for
        why that order is the locking order). A value every row sets (a worker's lease owner and
        start time) goes in once as a scalar; the rest go through `unnest`.

        Every condition on the run (expected states, fence, owner, version) compares it with a
        column of `t`, never with a constant: with no condition of its own to scan by, the runs
        table can only be reached through its primary key from each row of `t`, so the plan is that
        nested loop whatever the statistics say. A constant condition let the planner start from
        the lease index when it believed few runs were CLAIMED (stale statistics, the normal case
        for a state runs pass through) and compare every run with every row of `t`: 45 ms instead
        of 5 for a batch of 500. A CTE that locked in order first made large batches three times
        slower."""
        group = sorted(group, key=lambda t: t.run_id)
        t0 = group[0]
        columns: list[tuple[str, str, list[Any]]] = []
        if t0.at_ms is not None:
            columns.append(("updated_ms", "bigint", [t.at_ms for t in group]))
        for name in sorted(t0.changes):
            values = [t.changes[name] for t in group]
            if name == "result":
                values = [None if v is None else json.dumps(v) for v in values]
            columns.append((name, _COLUMN_TYPES[name], values))
        expected = [("fence", "bigint", "expect_fence"), ("lease_owner", "text", "expect_owner")]
        expected.append(("version", "bigint", "expect_version"))
        for column, kind, attribute in expected:
            if getattr(t0, attribute) is not None:
                columns.append((f"expect_{column}", kind, [getattr(t, attribute) for t in group]))

        params: dict[str, Any] = {"run_id": [t.run_id for t in group]}
        unnested = [("run_id", "text")]
        value: dict[str, str] = {}  # column -> its SQL: a scalar parameter or the unnested column
        for name, kind, values in columns:
            params[name] = values
            if not name.startswith("expect_") and all(v == values[0] for v in values):
                params[name] = values[0]
                value[name] = f"%({name})s::{kind}"
            else:
                unnested.append((name, kind))
                value[name] = f"t.{name}"
        sets = ["state = %(to_state)s", "version = r.version + 1"]
        if t0.bump_fence:
            sets.append("fence = r.fence + 1")
        for name, _, _ in columns:
            if not name.startswith("expect_"):
                sets.append(f"{name} = {value[name]}::jsonb" if name == "result" else f"{name} = {value[name]}")
        where = ["r.run_id = t.run_id", "r.state = ANY(string_to_array(t.expect_states, ','))"]
        where += [f"r.{name[7:]} = {value[name]}" for name, _, _ in columns if name.startswith("expect_")]
        update = (
            f"UPDATE {{runs}} AS r SET {', '.join(sets)} FROM t WHERE {' AND '.join(where)} "
            f"RETURNING {', '.join('r.' + c for c in RUN_COLUMNS)}"
        )
        params["expect_states"] = [",".join(sorted(s.value for s in t0.expect))] * len(group)
        unnested.append(("expect_states", "text"))
        arrays = ", ".join(f"%({name})b::{kind}[]" for name, kind in unnested)
        names = ", ".join(name for name, _ in unnested)
        head = f"WITH t AS (SELECT * FROM unnest({arrays}) AS t({names}))"
        params["to_state"] = t0.to_state.value
        if t0.job_status is None:
            return self.db.sql(f"{head} {update}"), params
        params["job_status"] = t0.job_status.value
        return self.db.sql(f"{head}, {_FINISH_JOBS.replace('{update}', update)}"), params

    def expired_leases(self, now_ms: int, limit: int) -> list[Run]:
        return [run_from_row(r) for r in self.db.read(_EXPIRED, [now_ms, limit])]

    def expire_results(self, finished_before_ms: int, limit: int) -> int:
        if limit <= 0:
            return 0
        return len(self.db.read(_EXPIRE_RESULTS, {"before": finished_before_ms, "limit": limit}))

    def overdue_runs(self, before_ms: int, limit: int) -> list[Run]:
        if limit <= 0:
            return []
        rows = self.db.read(_OVERDUE, {"before": before_ms, "limit": limit})
        return _in_order([run_from_row(r) for r in rows])

    def next_due_ms(self) -> int | None:
        """The earliest due time of any SCHEDULED run (four index probes, one per tier)."""
        due = self.db.read(_NEXT_DUE)[0]["due_ms"]
        return None if due is None else int(due)

    # -- idempotency and workers -----------------------------------------------------------------

    def idempotency(self, tenant_id: str, key: str, now_ms: int) -> IdempotencyRecord | None:
        rows = self.db.read(
            "SELECT tenant_id, key, fingerprint, job_id, response, created_ms, expires_ms FROM {idem} "
            "WHERE tenant_id = %s AND key = %s AND expires_ms > %s",
            [tenant_id, key, now_ms],
        )
        return IdempotencyRecord.model_validate(rows[0]) if rows else None

    def register_worker(self, worker_id: str, tasks: Sequence[str], queues: Sequence[str], now_ms: int) -> None:
        sql = self.db.sql(
            "INSERT INTO {workers} (worker_id, tasks, queues, seen_ms) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (worker_id) DO UPDATE SET tasks = EXCLUDED.tasks, queues = EXCLUDED.queues, "
            "seen_ms = EXCLUDED.seen_ms"
        )
        params = [worker_id, sorted(tasks), list(queues), now_ms]
        self.db.run(lambda conn: conn.execute(sql, params))

    def known_tasks(self) -> set[str]:
        return {r["task"] for r in self.db.read("SELECT DISTINCT unnest(tasks) AS task FROM {workers}")}

    # -- the daemon registry and the census ------------------------------------------------------

    def heartbeat(self, records: Sequence[DaemonRecord], ttl_ms: int) -> None:
        if not records:
            return
        upsert = self.db.sql(
            "INSERT INTO {daemons} (daemon_id, role, expires_ms, doc) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (daemon_id) DO UPDATE SET role = EXCLUDED.role, expires_ms = EXCLUDED.expires_ms, "
            "doc = EXCLUDED.doc"
        )
        prune = self.db.sql("DELETE FROM {daemons} WHERE expires_ms < %s")
        rows = [(r.daemon_id, r.role.value, r.seen_ms + ttl_ms, expiring(r, ttl_ms).to_json()) for r in records]
        oldest = min(r.seen_ms for r in records) - DAEMON_KEEP_MS

        def write(conn: Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(upsert, rows)
            conn.execute(prune, [oldest])

        self.db.run(write)

    def live_daemons(self, now_ms: int) -> list[DaemonRecord]:
        rows = self.db.read("SELECT doc FROM {daemons} WHERE expires_ms > %s ORDER BY role, daemon_id", [now_ms])
        return decode_daemons(r["doc"] for r in rows)

    def deregister(self, daemon_ids: Sequence[str]) -> None:
        if not daemon_ids:
            return
        sql = self.db.sql("DELETE FROM {daemons} WHERE daemon_id = ANY(%s)")
        self.db.run(lambda conn: conn.execute(sql, [list(daemon_ids)]))

    def census(self, now_ms: int) -> Census:
        """Waiting and leased runs and dead letters exactly (indexed); finished runs estimated from
        the planner's statistics once the table has been analysed (`Census.exact` is then False)."""
        active = [dict(r) for r in self.db.read(_CENSUS_ACTIVE, {"now": now_ms})]
        dead = int(self.db.read(_CENSUS_DEAD)[0]["n"])
        finished = self._finished_estimate()
        exact = finished is None
        if finished is None:
            finished = {r["state"]: int(r["n"]) for r in self.db.read(_CENSUS_FINISHED)}
        return census_from_rows(now_ms, active, dead, finished, exact=exact)

    def _finished_estimate(self) -> dict[str, int] | None:
        """Finished runs per state from `pg_stats` and `pg_class`; None before the first ANALYZE."""
        params = {"schema": self.db.schema, "runs": self.db.sql("{runs}")}
        rows = self.db.read(_CENSUS_STATISTICS, params)
        if not rows or rows[0]["rows"] is None or rows[0]["rows"] < 0 or rows[0]["vals"] is None:
            return None
        total = float(rows[0]["rows"])
        values = rows[0]["vals"].strip("{}").split(",")
        shares = dict(zip(values, rows[0]["freqs"], strict=False))
        return {state: round(float(shares.get(state, 0.0)) * total) for state in _FINISHED}

    def publish_tasks(self, tasks: Sequence[TaskInfo]) -> None:
        if not tasks:
            return
        sql = self.db.sql(
            "INSERT INTO {tasks} (name, doc, published_ms) VALUES (%s, %s, %s) "
            "ON CONFLICT (name) DO UPDATE SET doc = EXCLUDED.doc, published_ms = EXCLUDED.published_ms"
        )
        rows = [(t.name, t.model_dump_json(), t.published_ms) for t in sorted(tasks, key=lambda t: t.name)]

        def body(conn: Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(sql, rows)

        self.db.run(body)

    def task_catalogue(self, names: Sequence[str] | None = None) -> dict[str, TaskInfo]:
        if names is None:
            rows = self.db.read("SELECT doc FROM {tasks} ORDER BY name")
        else:
            rows = self.db.read("SELECT doc FROM {tasks} WHERE name = ANY(%s)", [sorted(set(names))])
        return decode_tasks(r["doc"] for r in rows)

    # -- tokens and tenants ----------------------------------------------------------------------

    def put_token(self, token: ApiToken) -> None:
        def body(conn: Connection) -> None:
            cur = conn.execute(
                self.db.sql(_INSERT_TOKEN),
                [token.token_id, token.tenant_id, token.name, token.token_hash, token.created_ms, token.revoked_ms],
            )
            if cur.rowcount != 1:
                raise Conflict(f"token {token.token_id!r} exists")

        self.db.run(body)

    def find_token(self, token_hash: str) -> ApiToken | None:
        rows = self.db.read(_SELECT_TOKENS + " WHERE token_hash = %s", [token_hash])
        return ApiToken.model_validate(rows[0]) if rows else None

    def list_tokens(self, tenant_id: str | None = None) -> list[ApiToken]:
        if tenant_id is None:
            rows = self.db.read(_SELECT_TOKENS + " ORDER BY created_ms, token_id")
        else:
            rows = self.db.read(_SELECT_TOKENS + " WHERE tenant_id = %s ORDER BY created_ms, token_id", [tenant_id])
        return [ApiToken.model_validate(r) for r in rows]

    def revoke_token(self, token_id: str, now_ms: int) -> bool:
        rows = self.db.read(
            "UPDATE {tokens} SET revoked_ms = %s WHERE token_id = %s AND revoked_ms IS NULL RETURNING token_id",
            [now_ms, token_id],
        )
        return bool(rows)

    def tenant_secret(self, tenant_id: str, candidate: str) -> str:
        rows = self.db.read(_TENANT_SECRET, [tenant_id, candidate, tenant_id])
        return str(rows[0]["webhook_secret"])

    def close(self) -> None:
        if self._owns_db:
            self.db.close()
