"""The job listing query of the SQLite store, and the light reader `jobq list` uses on it.

`job_list_sql` is the one query both `SqliteStore.list_jobs` and `SqliteJobLister` run, so the
two paths page, filter and order alike. The lister is read-only and imports no pydantic (see
`jobq.joblist`): it never creates or upgrades a table, and it answers None (use the full path)
for a file it is not sure of: missing, of another schema version, or holding a row it cannot
vouch for.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jobq.joblist import PRIORITY_RANKS, JobRow, job_cursor_of, parse_job_cursor, row_from_doc
from jobq.sqlitedb import placeholders

JOB_COLUMNS = "job_id, tenant_id, name, status, priority, next_fire_ms, version, doc"
_CHUNK = 500  # ids per IN (...) list


def job_list_sql(
    *,
    tenant_id: str | None,
    status: str | None,
    priority_rank: int | None,
    name_prefix: str | None,
    id_prefix: str | None,
    cursor: str | None,
    limit: int,
    newest_first: bool,
) -> tuple[str, list[Any]]:
    """The SELECT of one page of jobs (`limit + 1` rows: the extra one says there is a next page)."""
    where: list[str] = []
    params: list[Any] = []
    past = "<" if newest_first else ">"
    if cursor:
        job_id, tenant = parse_job_cursor(cursor)
        if tenant is None:
            where.append(f"job_id {past} ?")
            params.append(job_id)
        else:
            where.append(f"(job_id {past} ? OR (job_id = ? AND tenant_id {past} ?))")
            params.extend([job_id, job_id, tenant])
    if tenant_id is not None:
        where.append("tenant_id = ?")
        params.append(tenant_id)
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if priority_rank is not None:
        where.append("priority = ?")
        params.append(str(priority_rank))
    if name_prefix:
        where.append("substr(name, 1, ?) = ?")
        params.extend([str(len(name_prefix)), name_prefix])
    if id_prefix:
        # A range on the key (BINARY collation: the ids with the prefix sort in [prefix, next)), so
        # a tenant's declared jobs are an index range, not a scan of the tenant.
        where.append("job_id >= ? AND substr(job_id, 1, ?) = ?")
        params.extend([id_prefix, str(len(id_prefix)), id_prefix])
        if ord(id_prefix[-1]) < 0x10FFFF:
            where.append("job_id < ?")
            params.append(id_prefix[:-1] + chr(ord(id_prefix[-1]) + 1))
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    order = "job_id DESC, tenant_id DESC" if newest_first else "job_id, tenant_id"
    return f"SELECT {JOB_COLUMNS} FROM jobq_jobs {clause} ORDER BY {order} LIMIT ?", [*params, limit + 1]


class _NotSure(Exception):
    """A row or a file the light reader cannot vouch for: the caller takes the full path."""


class SqliteJobLister:
    """Read-only pages of `JobRow`s from a jobq SQLite file. `open` returns None when the file is
    missing or not of this version's schema; `page` raises `NotSure` for a row it cannot decode."""

    NotSure = _NotSure

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @classmethod
    def open(cls, path: str) -> SqliteJobLister | None:
        if not Path(path).is_file():
            return None
        try:
            # Read-only: this reader never creates or changes a file. The path is quoted (`?`, `#`, `%`).
            conn = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error:
            return None
        try:
            key = [r[1] for r in sorted(conn.execute("PRAGMA table_info(jobq_jobs)"), key=lambda r: r[5]) if r[5]]
            runs = {r[1] for r in conn.execute("PRAGMA table_info(jobq_runs)")}
        except sqlite3.Error:
            conn.close()
            return None
        if key != ["tenant_id", "job_id"] or not {"run_id", "state"} <= runs:
            conn.close()
            return None
        return cls(conn)

    def close(self) -> None:
        self.conn.close()

    def page(
        self,
        *,
        tenant_id: str | None,
        status: str | None,
        priority: str | None,
        name_prefix: str | None,
        cursor: str | None,
        limit: int,
    ) -> tuple[list[JobRow], str | None]:
        sql, params = job_list_sql(
            tenant_id=tenant_id,
            status=status,
            priority_rank=None if priority is None else PRIORITY_RANKS[priority],
            name_prefix=name_prefix,
            id_prefix=None,
            cursor=cursor,
            limit=limit,
            newest_first=False,
        )
        rows = self._read(sql, params)
        found: list[JobRow] = []
        for row in rows[:limit]:
            decoded = row_from_doc(row[7]) if isinstance(row[7], str) else None
            # The columns the query filtered on must say what the document says.
            if decoded is None or (decoded.tenant_id, decoded.job_id, decoded.status) != (row[1], row[0], row[3]):
                raise _NotSure
            found.append(decoded)
        more = len(rows) > limit and found
        return found, job_cursor_of(found[-1].job_id, found[-1].tenant_id) if more else None

    def failed_runs(self, run_ids: Sequence[str]) -> set[str]:
        """Which of `run_ids` are FAILED (an unknown state is not sure)."""
        failed: set[str] = set()
        ids = list(dict.fromkeys(run_ids))
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i : i + _CHUNK]
            sql = f"SELECT run_id, state FROM jobq_runs WHERE run_id IN ({placeholders(len(chunk))})"
            for run_id, state in self._read(sql, chunk):
                if state not in _RUN_STATES:
                    raise _NotSure
                if state == "FAILED":
                    failed.add(run_id)
        return failed

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _NotSure from exc


# jobq.models.RunState's values (tests/test_joblist.py checks they agree).
_RUN_STATES = frozenset({"SCHEDULED", "CLAIMED", "DISPATCHED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"})
