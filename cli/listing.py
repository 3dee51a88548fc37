"""`jobq list`, with a fast path for the embedded default.

On a SQLite store, with settings that hold nothing but backend URLs, the command reads the file
itself through `jobq.store.sqlite_listing` and never loads pydantic, the settings model, the
client or the store backends (tests/test_cli_startup.py checks which modules stay unloaded). In
every other case (another store, a settings file or other `JOBQ_*` variables to validate, a filter
a store cannot hold, a file of another schema version, a row the light decoder cannot vouch for),
it takes the full path: settings, `connect_reader`, `Client`, which also produces every error
message. Both paths list the same `JobRow`s and print them with the same code, `print_table`,
which draws the table without importing rich (rich's import alone was a fifth of the command's
start-up).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import click

from jobq.cli.common import backend_options, fail, json_option, load_settings, print_json, print_table, reader
from jobq.errors import JobqError
from jobq.instants import to_iso
from jobq.joblist import JOB_STATUSES, PRIORITY_RANKS, JobRow, newest_matching
from jobq.texts import text_problem

_STATUSES = [*JOB_STATUSES, "FAILED"]
LIST_SCAN = 100_000  # jobs `jobq list` reads at most to find the newest; narrow with filters beyond
PAGE = 1000  # jobs per store read when looking for the newest
# The variables the fast path may read: the backend URLs are plain strings (no setting constrains
# them), so settings made of them alone are valid without validating anything.
_URL_VARIABLES = frozenset({"JOBQ_STORE", "JOBQ_INDEX", "JOBQ_BROKER", "JOBQ_HISTORY"})
_DEFAULT_STORE = "sqlite:///jobq.db"  # jobq.settings.Settings.store_url
COLUMNS = ("job_id", "tenant", "name", "status", "type", "schedule", "priority", "created")


@click.command(name="list")
@click.option("--status", "status_", type=click.Choice(_STATUSES, case_sensitive=False), help="Only this status.")
@click.option("--task", default=None, help="Only jobs of this task.")
@click.option("--name", "name_prefix", default=None, help="Only jobs whose name starts with this.")
@click.option("--name-prefix", "name_prefix", default=None, hidden=True)
@click.option("--priority", type=click.Choice(list(PRIORITY_RANKS), case_sensitive=False))
@click.option("--tenant", "tenant_id", default=None)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--cursor", default=None, help="Page in job id order from a previous --json page (for scripts).")
@json_option
@backend_options
def list_jobs(
    status_: str | None,
    task: str | None,
    name_prefix: str | None,
    priority: str | None,
    tenant_id: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """List jobs, newest first, filtered by status, task, name prefix or priority.

    A one-off whose run was dead-lettered is FAILED (its job record says COMPLETED). With
    --cursor, pages follow job id order instead, as `--json` pages do."""
    wanted = status_.upper() if status_ else None
    filters = _Filters(
        tenant_id=tenant_id,
        # A FAILED job is stored as COMPLETED: its run says the rest.
        status="COMPLETED" if wanted == "FAILED" else wanted,
        priority=priority.upper() if priority else None,
        name_prefix=name_prefix,
    )
    found = _fast(filters, task, wanted, limit, cursor, options)
    if found is None:
        found = _full(filters, task, wanted, limit, cursor, options)
    rows, outcomes, next_cursor, truncated = found
    if as_json:
        jobs = [{**r.summary(), "status": outcomes.get(r.key, r.status)} for r in rows]
        print_json({"jobs": jobs, "next_cursor": next_cursor})
        return
    if not rows:
        click.echo("no jobs" + (" match" if any((wanted, task, name_prefix, priority, tenant_id)) else ""))
        return
    cells = []
    for row in rows:
        shown = outcomes.get(row.key, row.status)
        cells.append(
            (
                row.job_id,
                row.tenant_id,
                row.name,
                shown if row.corrupt is None else f"{shown} (corrupt: {row.corrupt})",
                row.schedule_type,
                row.cron or _iso(row.at_ms),
                row.priority,
                _iso(row.created_ms),
            )
        )
    print_table(COLUMNS, cells, whole=0)
    if next_cursor:
        click.echo(f"more: --cursor {next_cursor}")
    if truncated:
        click.echo(f"(the newest among the first {LIST_SCAN} matching jobs: narrow with --status, --task, --name)")


@dataclasses.dataclass(frozen=True)
class _Filters:
    tenant_id: str | None
    status: str | None  # the stored job status
    priority: str | None
    name_prefix: str | None


Listed = tuple[list[JobRow], dict[tuple[str, str], str], str | None, bool]


def _fast(
    filters: _Filters, task: str | None, wanted: str | None, limit: int, cursor: str | None, options: dict[str, Any]
) -> Listed | None:
    """The listing read straight from a SQLite file, or None when the full path must answer."""
    from jobq.sqlitedb import path_from_url
    from jobq.store.sqlite_listing import SqliteJobLister

    url = _plain_store_url(options)
    texts = (filters.tenant_id, filters.name_prefix, cursor)
    if url is None or not url.startswith("sqlite:") or any(t is not None and text_problem(t) for t in texts):
        return None
    try:
        path = path_from_url(url)
    except JobqError:  # a ConfigError: the full path reports it
        return None
    lister = SqliteJobLister.open(path)
    if lister is None:
        return None

    def read_page(at: str | None) -> tuple[list[JobRow], str | None]:
        size = PAGE if cursor is None else limit
        return lister.page(**dataclasses.asdict(filters), cursor=at, limit=size)

    def outcomes(rows: list[JobRow]) -> dict[tuple[str, str], str]:
        finals = {run_id: r.key for r in rows if r.status == "COMPLETED" and (run_id := r.final_run_id)}
        return {finals[run_id]: "FAILED" for run_id in lister.failed_runs(list(finals))}

    try:
        rows, next_cursor, truncated = newest_matching(
            read_page, outcomes, task=task, wanted=wanted, limit=limit, cursor=cursor, scan=LIST_SCAN
        )
        return rows, outcomes(rows), next_cursor, truncated
    except SqliteJobLister.NotSure:
        return None
    finally:
        lister.close()


def _plain_store_url(options: dict[str, Any]) -> str | None:
    """The store URL when the settings are made of backend URLs only (flags and `JOBQ_*`); None
    when a settings file or another setting must be read and validated (the full path)."""
    env = os.environ
    if options.get("config_file") is not None or any(n.startswith("JOBQ_") and n not in _URL_VARIABLES for n in env):
        return None
    store = options.get("store")
    return store if store is not None else env.get("JOBQ_STORE", _DEFAULT_STORE)


def _full(
    filters: _Filters, task: str | None, wanted: str | None, limit: int, cursor: str | None, options: dict[str, Any]
) -> Listed:
    """The listing through settings, `connect_reader` and `Client` (every store)."""
    from jobq.client import Client
    from jobq.errors import InvalidQuery
    from jobq.models import JobStatus, Priority
    from jobq.ports import JobQuery

    try:
        query = JobQuery(
            tenant_id=filters.tenant_id,
            status=JobStatus(filters.status) if filters.status else None,
            priority=Priority.parse(filters.priority) if filters.priority else None,
            name_prefix=filters.name_prefix,
            cursor=cursor,
            limit=PAGE if cursor is None else limit,
        )
    except InvalidQuery as exc:
        flag = {"tenant_id": "--tenant", "name_prefix": "--name", "cursor": "--cursor"}.get(exc.field or "")
        fail(f"{flag} {exc.message.removeprefix(exc.field or '').strip()}" if flag else exc.message)
    with reader(load_settings(options)) as d:
        client = Client(d)
        by_key: dict[tuple[str, str], Any] = {}

        def read_page(at: str | None) -> tuple[list[JobRow], str | None]:
            page = client.list(dataclasses.replace(query, cursor=at))
            by_key.update(((j.tenant_id, j.job_id), j) for j in page.items)
            return [JobRow.from_job(j) for j in page.items], page.next_cursor

        def outcomes(rows: list[JobRow]) -> dict[tuple[str, str], str]:
            return {(k.tenant_id, k.job_id): v for k, v in client.outcomes([by_key[r.key] for r in rows]).items()}

        rows, next_cursor, truncated = newest_matching(
            read_page, outcomes, task=task, wanted=wanted, limit=limit, cursor=cursor, scan=LIST_SCAN
        )
        return rows, outcomes(rows), next_cursor, truncated


def _iso(ms: int | None) -> str:
    return "-" if ms is None else to_iso(ms)
