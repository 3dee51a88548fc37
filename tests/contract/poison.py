"""Records that do not decode, written straight into each backend as an older version, a hand-made
row or a bug could leave them (raw SQL, a raw DynamoDB item), for the quarantine tests."""

from __future__ import annotations

import json
from typing import Any

from jobq.models import Job, Run
from jobq.ports import JobStore


def poison_document(job: Job) -> dict[str, Any]:
    """`job`'s stored document with a retry policy no version of jobq accepts (issue 9's example)."""
    doc = job.model_dump(mode="json")
    doc["retry"]["max_retries"] = -1
    return doc


def write_poison_job(store: JobStore, job: Job) -> None:
    """Store `job` with the document `poison_document(job)`; its plain columns are `job`'s."""
    from jobq.store.memory import MemoryStore
    from jobq.store.sqlite import SqliteStore

    doc = poison_document(job)
    row = (job.job_id, job.tenant_id, job.name, job.status.value, job.priority.rank, job.next_fire_ms, job.version)
    if isinstance(store, MemoryStore):
        store.put_raw_job(doc)
    elif isinstance(store, SqliteStore):
        with store.db.write() as conn:
            conn.execute(
                "INSERT INTO jobq_jobs (job_id, tenant_id, name, status, priority, next_fire_ms, version, doc) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, json.dumps(doc)),
            )
    elif _is_postgres(store):
        sql = store.db.sql(  # type: ignore[attr-defined]
            "INSERT INTO {jobs} (job_id, tenant_id, name, status, priority, next_fire_ms, version, doc) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb)"
        )
        store.db.run(lambda conn: conn.execute(sql, [*row, json.dumps(doc)]))  # type: ignore[attr-defined]
    else:
        from jobq.store.dynamodb import DynamoStore
        from jobq.store.dynamodb_items import as_s, job_item

        assert isinstance(store, DynamoStore)
        item = job_item(job)
        item["doc"] = as_s(json.dumps(doc))
        store.table.call("put_item", TableName=store.table.name, Item=item)


def write_poison_run(store: JobStore, run: Run) -> str:
    """Store `run` with one column its backend can hold but no `Run` decodes; returns which."""
    from jobq.store.memory import MemoryStore
    from jobq.store.sqlite import SqliteStore

    if isinstance(store, MemoryStore):
        store.put_raw_run({**run.model_dump(), "attempt": "many"})
        return "attempt"
    if isinstance(store, SqliteStore):
        from jobq.store.sqlite import _INSERT_RUN, RUN_COLUMNS, _run_values

        values = list(_run_values(run))
        values[RUN_COLUMNS.index("attempt")] = "many"  # SQLite keeps text in an INTEGER column
        with store.db.write() as conn:
            conn.execute(_INSERT_RUN, values).fetchall()
        return "attempt"
    if _is_postgres(store):  # typed columns: a tier rank that a CHECK (dropped here) used to forbid
        from jobq.postgresdb import RUN_COLUMNS as PG_COLUMNS
        from jobq.store.postgres import _INSERT_RUN as PG_INSERT
        from jobq.store.postgres import PostgresStore
        from jobq.store.postgres import _run_values as pg_values

        assert isinstance(store, PostgresStore)
        values = pg_values(run)
        values[PG_COLUMNS.index("priority")] = 9
        db = store.db

        def body(conn: Any) -> None:
            conn.execute(db.sql("ALTER TABLE {runs} DROP CONSTRAINT IF EXISTS jobq_runs_priority_check"))
            conn.execute(db.sql(PG_INSERT), values)

        db.run(body)
        return "priority"
    from jobq.store.dynamodb import DynamoStore
    from jobq.store.dynamodb_items import as_s, run_item

    assert isinstance(store, DynamoStore)
    item = run_item(run)
    item["attempt"] = as_s("many")
    store.table.call("put_item", TableName=store.table.name, Item=item)
    return "attempt"


def _is_postgres(store: JobStore) -> bool:
    try:
        from jobq.store.postgres import PostgresStore
    except ImportError:
        return False
    return isinstance(store, PostgresStore)
