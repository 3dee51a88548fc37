"""History in the PostgreSQL store's database: one row per run event (table ``jobq_run_events``,
created by the store's migrations), read back per job in the order recorded."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobq.errors import StoreError
from jobq.metrics import METRICS
from jobq.models import JobKey, RunEvent
from jobq.postgresdb import PostgresDatabase
from jobq.records import decode_events

if TYPE_CHECKING:
    from jobq.postgresdb import Connection

log = logging.getLogger("jobq.history")

_COLUMNS = ("job_id", "run_id", "tenant_id", "attempt", "fence", "kind", "at_ms", "worker", "error", "duration_ms")
_TYPES = ("text", "text", "text", "integer", "bigint", "text", "bigint", "text", "text", "bigint")
# One statement per batch, the events as one array per column (binary: psycopg dumps a list in
# binary several times faster than as text).
_INSERT = (
    f"INSERT INTO {{events}} ({', '.join(_COLUMNS)}) SELECT * FROM unnest("
    + ", ".join(f"%b::{t}[]" for t in _TYPES)
    + ")"
)
_READ = f"SELECT {', '.join(_COLUMNS)} FROM {{events}} WHERE tenant_id = %s AND job_id = %s ORDER BY id LIMIT %s"


class PostgresHistory:
    """`HistorySink` on PostgreSQL. Writes synchronously (wrap it in `BufferedHistory` to take
    them off the hot path); `record` never raises: a failed write is logged and counted."""

    def __init__(self, db: PostgresDatabase, *, owns_db: bool = False) -> None:
        self.db = db
        self._owns_db = owns_db
        db.ensure_schema()

    @classmethod
    def from_url(cls, url: str) -> PostgresHistory:
        """A sink with its own pool (closed by `close`); to share the store's, pass `store.db`."""
        db = PostgresDatabase.from_url(url)
        try:
            return cls(db, owns_db=True)
        except BaseException:
            db.close()
            raise

    def record(self, events: Sequence[RunEvent]) -> None:
        if not events:
            return
        columns = [[getattr(e, c) for e in events] for c in _COLUMNS]
        sql = self.db.sql(_INSERT)

        def body(conn: Connection) -> None:
            conn.execute(sql, columns)

        try:
            self.db.run(body)
        except StoreError:
            METRICS.history_errors.inc(len(events))
            log.exception("history write failed; %d events dropped", len(events))

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        """The job's events, oldest first. Raises `StoreUnavailable` when the database is."""
        return decode_events(self.db.read(_READ, [job.tenant_id, job.job_id, limit]), f"history of {str(job)!r}")

    def flush(self) -> None:
        pass  # nothing is buffered here

    def close(self) -> None:
        if self._owns_db:
            self.db.close()
