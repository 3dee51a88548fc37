"""PostgreSQL at 10M runs: do the scanner's, beat's and the reaper's queries stay index range scans?

    .venv/bin/python benchmarks/pg_scale.py [--runs 10000000] [--jobs 1000000] [--keep]

Creates a schema of its own with jobq's migrations, fills `jobq_runs` and `jobq_jobs` with
`INSERT ... SELECT generate_series` (secondary indexes dropped during the load and rebuilt from
their own definitions afterwards, as a restore would), runs `ANALYZE`, then prints
`EXPLAIN (ANALYZE, BUFFERS)` of the statements the store really sends: the SQL and parameters
are captured from `PostgresStore` itself (`claim_due`, `claim`, `overdue_runs`, `next_due_ms`,
`expired_leases`, `due_jobs`), so the plans cannot drift from the code. Each EXPLAIN ANALYZE runs
inside a transaction that is rolled back, so the claims change nothing. The schema is dropped at
the end (unless `--keep`). Output: `benchmarks/results/pg-scale-<runs>-<date>.json` and `.txt`.

The rows (run i belongs to job i // (runs/jobs), so run ids ascend as they would from
`jobq.ids`): 60% SUCCEEDED and 1% FAILED over the last 30 days (half of those dead-lettered), 2%
leased (CLAIMED, DISPATCHED or RUNNING; leases expiring within a minute either side of now), 37%
SCHEDULED and due uniformly over [now - 60 s, now + 2 h), so about 0.8% of them (~30,000 at 10M)
are due. Priorities 5% CRITICAL, 15% HIGH, 60% DEFAULT, 20% LOW. 95% of jobs are ACTIVE with a
next fire over the next 2 hours.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import uuid
from typing import Any

import psycopg
from stacks import machine, result_stem

from jobq.store.postgres import PostgresStore

POSTGRES = "postgresql://127.0.0.1:5432/test"

# Priority from i: 1 in 20 CRITICAL, 3 HIGH, 12 DEFAULT, 4 LOW.
_PRIORITY = (
    "(CASE WHEN (i * 31) %% 20 < 1 THEN 0 WHEN (i * 31) %% 20 < 4 THEN 1 WHEN (i * 31) %% 20 < 16 THEN 2 ELSE 3 END)"
)
_BUCKET = "((i * 7919) %% 100)"
_LOAD_RUNS = f"""
INSERT INTO {{schema}}.jobq_runs (run_id, job_id, tenant_id, nominal_ms, due_ms, priority, state, attempt, fence,
    version, lease_owner, lease_expires_ms, dead_letter, created_ms, updated_ms, dispatched_ms, started_ms, finished_ms)
SELECT job_id || ':' || due, job_id, 'default', due, due, {_PRIORITY}, state, 1,
    CASE WHEN state = 'SCHEDULED' THEN 0 ELSE 1 END, 3,
    CASE WHEN state IN ('CLAIMED', 'DISPATCHED', 'RUNNING') THEN 'worker-' || (i %% 50) END,
    CASE WHEN state IN ('CLAIMED', 'DISPATCHED', 'RUNNING') THEN %(now)s - 60000 + (i %% 120000) END,
    state = 'FAILED' AND i %% 2 = 0, due - 3600000, due,
    CASE WHEN state NOT IN ('SCHEDULED', 'CLAIMED') THEN due + 5 END,
    CASE WHEN state IN ('RUNNING', 'SUCCEEDED', 'FAILED') THEN due + 9 END,
    CASE WHEN state IN ('SUCCEEDED', 'FAILED') THEN due + 20 END
FROM (
    SELECT i, 'job_' || lpad(to_hex(i / %(per_job)s), 26, '0') AS job_id,
        CASE WHEN {_BUCKET} < 60 THEN 'SUCCEEDED' WHEN {_BUCKET} = 60 THEN 'FAILED'
             WHEN {_BUCKET} = 61 THEN (ARRAY['CLAIMED', 'DISPATCHED', 'RUNNING'])[1 + i %% 3]
             WHEN {_BUCKET} = 62 THEN 'RUNNING' ELSE 'SCHEDULED' END AS state,
        CASE WHEN {_BUCKET} < 61 THEN %(now)s - 1000 - (random() * 30 * 86400000)::bigint
             WHEN {_BUCKET} < 63 THEN %(now)s - (random() * 60000)::bigint
             ELSE %(now)s - 60000 + (random() * 7260000)::bigint END AS due
    FROM generate_series(%(start)s::bigint, %(stop)s::bigint - 1) AS i
) AS g
ON CONFLICT (run_id) DO NOTHING
"""
_LOAD_JOBS = f"""
INSERT INTO {{schema}}.jobq_jobs (job_id, tenant_id, name, status, priority, next_fire_ms, version, doc)
SELECT 'job_' || lpad(to_hex(i), 26, '0'), 'default', 'task.' || (i %% 100),
    CASE WHEN i %% 20 = 0 THEN 'COMPLETED' ELSE 'ACTIVE' END, {_PRIORITY},
    CASE WHEN i %% 20 = 0 THEN NULL ELSE %(now)s + (random() * 7200000)::bigint END, 2,
    jsonb_build_object('job_id', 'job_' || lpad(to_hex(i), 26, '0'), 'cron', '*/5 * * * *', 'payload',
                       jsonb_build_object('n', i, 'pad', repeat('x', 200)))
FROM generate_series(0::bigint, %(jobs)s::bigint - 1) AS i
"""


def capture(store: PostgresStore) -> tuple[Any, Any, list[tuple[str, Any]]]:
    """Point the store's database at a recorder: every statement it would send lands in the
    returned list (SQL with the schema filled in, parameters) instead of the server. Returns the
    real `read` and `run`, to put back."""
    db = store.db
    sent: list[tuple[str, Any]] = []

    class Conn:
        def execute(self, sql: str, params: Any = ()) -> Any:
            sent.append((sql, params))
            return self

        def fetchall(self) -> list[Any]:
            return []

    def read(template: str, params: Any = ()) -> list[Any]:
        sent.append((db.sql(template), params))
        return []

    real_read, real_run = db.read, db.run
    db.read = read  # type: ignore[method-assign]
    db.run = lambda body, pipeline=False: body(Conn())  # type: ignore[method-assign]
    return real_read, real_run, sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000_000)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--limit", type=int, default=500, help="the scanner's batch (scan_batch)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    schema = f"jobq_scale_{uuid.uuid4().hex[:8]}"
    url = f"{POSTGRES}?schema={schema}"
    now = time.time_ns() // 1_000_000
    report: dict[str, Any] = {"runs": args.runs, "jobs": args.jobs, "schema": schema, "now_ms": now, "plans": {}}
    text: list[str] = []
    store = PostgresStore.from_url(url, check_schema=False)
    store.migrate()
    try:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            indexes = conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename IN "
                "('jobq_runs', 'jobq_jobs') AND indexname NOT LIKE '%%pkey'",
                [schema],
            ).fetchall()
            for name, _ in indexes:
                conn.execute(f'DROP INDEX "{schema}"."{name}"')
            started = time.perf_counter()
            for start in range(0, args.runs, args.chunk):
                stop = min(args.runs, start + args.chunk)
                conn.execute(
                    _LOAD_RUNS.format(schema=f'"{schema}"'),
                    {"now": now, "per_job": max(1, args.runs // args.jobs), "start": start, "stop": stop},
                )
                print(f"  runs {stop:,} in {time.perf_counter() - started:.0f} s", flush=True)
            conn.execute(_LOAD_JOBS.format(schema=f'"{schema}"'), {"now": now, "jobs": args.jobs})
            report["load_s"] = time.perf_counter() - started
            started = time.perf_counter()
            for name, definition in indexes:
                conn.execute(definition)
                print(f"  index {name} in {time.perf_counter() - started:.0f} s", flush=True)
            report["index_build_s"] = time.perf_counter() - started
            conn.execute(f'VACUUM ANALYZE "{schema}".jobq_runs')
            conn.execute(f'VACUUM ANALYZE "{schema}".jobq_jobs')
            report["counts"] = dict(
                conn.execute(f'SELECT state, count(*) FROM "{schema}".jobq_runs GROUP BY state ORDER BY 1').fetchall()
            )
            report["due_now"] = conn.execute(
                f"SELECT count(*) FROM \"{schema}\".jobq_runs WHERE state = 'SCHEDULED' AND due_ms <= %s", [now]
            ).fetchone()[0]  # type: ignore[index]
            report["sizes"] = dict(
                conn.execute(
                    "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = "
                    "c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'i') ORDER BY 1",
                    [schema],
                ).fetchall()
            )
            due_ids = [
                r[0]
                for r in conn.execute(
                    f"SELECT run_id FROM \"{schema}\".jobq_runs WHERE state = 'SCHEDULED' AND due_ms <= %s "
                    "ORDER BY priority, due_ms LIMIT %s",
                    [now, args.limit],
                ).fetchall()
            ]
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN "
                    "('shared_buffers', 'work_mem', 'random_page_cost', 'server_version')"
                ).fetchall()
            )
            report["settings"] = settings

        # The statements exactly as the store sends them.
        real_read, real_run, sent = capture(store)
        calls = [
            ("scanner, store-native index: claim_due (find + claim, SKIP LOCKED)",
             lambda: store.claim_due(now, args.limit, "scanner-1", 30_000)),
            ("scanner, Redis index: claim of the ids the index returned",
             lambda: store.claim(due_ids, now, "scanner-1", 30_000)),
            ("repair / store-native index read: overdue_runs", lambda: store.overdue_runs(now, args.limit)),
            ("scanner sleep: next_due_ms", store.next_due_ms),
            ("reaper: expired_leases", lambda: store.expired_leases(now, args.limit)),
            ("beat: due_jobs (horizon 60 s)", lambda: store.due_jobs(now + 60_000, args.limit)),
        ]  # fmt: skip
        statements: list[tuple[str, str, Any]] = []
        for name, call in calls:
            sent.clear()
            with contextlib.suppress(IndexError, KeyError, TypeError):
                call()  # next_due_ms reads row 0 of the recorder's empty result
            statements += [(name, sql, params) for sql, params in sent]
        store.db.read, store.db.run = real_read, real_run  # type: ignore[method-assign]

        with psycopg.connect(POSTGRES) as conn:
            for name, sql, params in statements:
                for _ in range(2):  # the first warms the cache; the second is reported
                    with conn.transaction(force_rollback=True):
                        plan = [r[0] for r in conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params).fetchall()]
                plan = [line if len(line) <= 240 else line[:200] + f" ...({len(line):,} characters)" for line in plan]
                report["plans"][name] = {"sql": sql, "plan": plan}
                text += [f"== {name}", sql, *plan, ""]
                print(f"== {name}\n" + "\n".join(plan), flush=True)
    finally:
        store.close()
        if not args.keep:
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    report["machine"] = machine()
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stem = result_stem(f"pg-scale-{args.runs}")
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    stem.with_suffix(".txt").write_text("\n".join(text))
    print(f"wrote {stem}.json and .txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
