"""History in the store's own database: the default sink of the embedded deployment."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from jobq.errors import StoreError
from jobq.metrics import METRICS
from jobq.models import JobKey, RunEvent
from jobq.records import decode_events
from jobq.sqlitedb import SqliteDatabase

log = logging.getLogger("jobq.history")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobq_run_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    fence       INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    worker      TEXT,
    error       TEXT,
    duration_ms INTEGER
);
-- A job's events in the order recorded; the previous version's index had no tenant.
DROP INDEX IF EXISTS jobq_run_events_job;
CREATE INDEX IF NOT EXISTS jobq_run_events_job_key ON jobq_run_events (tenant_id, job_id, id);
"""
_COLUMNS = ("job_id", "run_id", "tenant_id", "attempt", "fence", "kind", "at_ms", "worker", "error", "duration_ms")


class SqliteHistory:
    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        db.executescript(SCHEMA)

    def record(self, events: Sequence[RunEvent]) -> None:
        if not events:
            return
        rows = [tuple(getattr(e, c) for c in _COLUMNS) for e in events]
        try:
            with self.db.write() as conn:
                conn.executemany(
                    f"INSERT INTO jobq_run_events ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                    rows,
                )
        except StoreError:
            # History must never fail the run it describes: count and log, as the port promises.
            METRICS.history_errors.inc(len(rows))
            log.exception("history write failed; %d events dropped", len(rows))

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        rows = self.db.read(
            f"SELECT {', '.join(_COLUMNS)} FROM jobq_run_events WHERE tenant_id = ? AND job_id = ? ORDER BY id LIMIT ?",
            (job.tenant_id, job.job_id, limit),
        )
        return decode_events(rows, f"history of {str(job)!r}")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.db.close()
