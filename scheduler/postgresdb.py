"""PostgreSQL connections for jobq: URL parsing, a pool, versioned migrations, the error edge.

URL: ``postgresql://user:password@host:5432/db?schema=jobq&pool_min=1&pool_max=10`` (``postgres://``
too). jobq reads and removes its own query parameters; every other one (``sslmode``,
``connect_timeout``, ``application_name``, ``options``...) goes to libpq unchanged.

============  =========  ===================================================================
parameter     default    meaning
============  =========  ===================================================================
schema        public     the schema that holds jobq's tables (created by the migrations)
pool_min      1          connections the pool keeps open
pool_max      10         connections the pool may open; callers wait for one beyond that
pool_timeout  10         seconds to wait for a pooled connection before `StoreUnavailable`
migrate       missing    what construction does about the schema: see below
============  =========  ===================================================================

Schema changes are the versioned files ``store/migrations/NNNN_name.sql``, applied in order by
`PostgresDatabase.migrate` (`jobq init`). Each file is applied once, in its own transaction,
under a transaction-level advisory lock per schema, so two processes migrating at once serialise
and the second finds nothing to do. The version table records a checksum of each file; a file
changed after it was applied is refused.

Construction (``migrate=``) never upgrades a live schema silently:

- ``missing`` (default): create the schema when it does not exist at all, so a fresh database,
  `jobq dev` and tests just work; a schema that exists but is behind raises `ConfigError`
  ("run `jobq init`"), because upgrading production is an operator's decision.
- ``always``: apply pending migrations on construction (development).
- ``never``: only check; a missing or outdated schema raises `ConfigError`.

A schema ahead of this code is accepted: migrations are additive, so old processes keep working
during a rolling upgrade. The exception is migration 4 (jobs keyed by tenant and job id): a
process of an earlier version cannot create jobs once it is applied, so stop them, run
`jobq init`, then start this version.

Errors: psycopg never escapes. Connection, pool and operational errors become `StoreUnavailable`
(retryable), unique violations `Conflict`, a missing table `StoreError` naming `jobq init`, a bad
URL `ConfigError`. Messages never contain the password. A pooled connection the server killed
(restart, failover) is replaced and the call run once more, unless it died during a commit,
whose outcome is unknown. Deadlocks and serialization failures are retried a few times.

Threads share one database (the pool is thread-safe); processes must each build their own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from jobq.errors import (
    ConfigError,
    Conflict,
    StoreError,
    StoreUnavailable,
)
from jobq.extras import require
from jobq.models import RUN_FIELDS

if TYPE_CHECKING:
    import psycopg
    import psycopg.errors
    import psycopg.rows
    import psycopg.types.json
    import psycopg_pool
    from psycopg.rows import DictRow

    Connection = psycopg.Connection[DictRow]
else:
    psycopg = require("psycopg", "postgres", "the PostgreSQL store")
    psycopg_pool = require("psycopg_pool", "postgres", "the PostgreSQL store")
    import psycopg.errors
    import psycopg.rows
    import psycopg.types.json

T = TypeVar("T")

_PARAMS = frozenset({"schema", "pool_min", "pool_max", "pool_timeout", "migrate"})
_POLICIES = ("missing", "always", "never")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_LOCK_CLASS = 0x6A6F6271  # "jobq": the first key of the migration advisory lock (the second is the schema)
_DEADLOCK_RETRIES = 3

RUN_COLUMNS = RUN_FIELDS  # the table has a column per field

# -- migrations ---------------------------------------------------------------------------------

_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS {versions} (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
    "checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations() -> list[Migration]:
    """The packaged migrations, in version order (files ``NNNN_name.sql`` beside this module)."""
    found: list[Migration] = []
    for entry in (importlib.resources.files("jobq.store") / "migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    # Numbers are handed out ahead of merging (one per change being made at once), so a tree may
    # hold 9 before 6..8 arrive; two files with one number are a clash.
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or (versions and versions[0] != 1):
        raise StoreError(f"jobq's PostgreSQL migrations clash or do not start at 1: {versions}")
    return found


# -- configuration and connections ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PostgresConfig:
    conninfo: str  # the URL libpq receives: jobq's parameters removed, defaults added
    display: str  # the URL for messages: no password
    schema: str = "public"
    pool_min: int = 1
    pool_max: int = 10
    pool_timeout_s: float = 10.0
    migrate: str = "missing"

    @classmethod
    def from_url(cls, url: str) -> PostgresConfig:
        """Parse a ``postgresql://`` URL; raises `ConfigError` naming the bad parameter."""
        parts = urlsplit(url)
        display = _redact(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError("store", display, "expected a postgresql:// URL")
        # libpq's parameters are passed on byte for byte: re-encoding them would turn a literal
        # "+" into a space (libpq, unlike HTML forms, does not read "+" as a space).
        own: dict[str, str] = {}
        rest: list[str] = []
        for item in filter(None, parts.query.split("&")):
            key, _, value = item.partition("=")
            if unquote(key) in _PARAMS:
                own[unquote(key)] = unquote(value)
            else:
                rest.append(item)
        given = {unquote(item.partition("=")[0]) for item in rest}
        # libpq waits forever for an unreachable host by default; a daemon should fail and retry.
        rest += [f"{k}={v}" for k, v in (("connect_timeout", "10"), ("application_name", "jobq")) if k not in given]
        schema = own.get("schema", "public")
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError("schema", schema, "use a lower-case SQL identifier: letters, digits and _")
        migrate = own.get("migrate", "missing")
        if migrate not in _POLICIES:
            raise ConfigError("migrate", migrate, f"use one of {', '.join(_POLICIES)}")
        pool_min = _number("pool_min", own.get("pool_min", "1"), int, 0)
        pool_max = _number("pool_max", own.get("pool_max", "10"), int, 1)
        if pool_max < pool_min:
            raise ConfigError("pool_max", pool_max, f"must be at least pool_min ({pool_min})")
        return cls(
            conninfo=urlunsplit(parts._replace(query="&".join(rest))),
            display=display,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_timeout_s=_number("pool_timeout", own.get("pool_timeout", "10"), float, 0.001),
            migrate=migrate,
        )

    def same_database(self, other: PostgresConfig) -> bool:
        """True when both name the same server, database and schema (pool settings aside)."""
        return (self.conninfo, self.schema) == (other.conninfo, other.schema)


def _number(key: str, value: str, kind: Callable[[str], Any], least: float) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise ConfigError(key, value, f"expected a number >= {least}") from None
    if number < least:
        raise ConfigError(key, value, f"expected a number >= {least}")
    return number


def _redact(url: str) -> str:
    """The URL without its password (in the authority or as a ``password=`` parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = [
        "password=***" if unquote(item.partition("=")[0]) == "password" else item
        for item in filter(None, parts.query.split("&"))
    ]
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(query)))


class _RolledBack(StoreUnavailable):
    """The server rolled a transaction back (deadlock, serialization failure): safe to run again."""


class _Broken(StoreUnavailable):
    """The connection died (server restart, failover, idle timeout); the pool will replace it."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class PostgresDatabase:
    """A connection pool on one database and schema, the migrations, and the error edge.

    Construction connects once, directly, so that a wrong URL, host or password fails at once
    with libpq's own reason (`StoreUnavailable`, or `ConfigError` for a malformed URL) instead of
    as a pool timeout later. Pooled connections are in autocommit: a single read is one round trip,
    and writes open their transaction explicitly (`run`)."""

    def __init__(self, config: PostgresConfig) -> None:
        self.config = config
        self.schema = config.schema
        schema = f'"{config.schema}"'  # validated: a plain identifier
        self._names = {
            "schema": schema,
            "jobs": f"{schema}.jobq_jobs",
            "runs": f"{schema}.jobq_runs",
            "idem": f"{schema}.jobq_idempotency",
            "workers": f"{schema}.jobq_workers",
            "daemons": f"{schema}.jobq_daemons",
            "tasks": f"{schema}.jobq_tasks",
            "tokens": f"{schema}.jobq_tokens",
            "tenants": f"{schema}.jobq_tenants",
            "events": f"{schema}.jobq_run_events",
            "versions": f"{schema}.jobq_schema_version",
            "cols": ", ".join(RUN_COLUMNS),
        }
        self._sql: dict[str, str] = {}
        self._probe()
        self._pool: psycopg_pool.ConnectionPool[Connection] = psycopg_pool.ConnectionPool(
            config.conninfo,
            connection_class=psycopg.Connection[psycopg.rows.DictRow],
            kwargs={"autocommit": True, "row_factory": psycopg.rows.dict_row},
            min_size=config.pool_min,
            max_size=config.pool_max,
            timeout=config.pool_timeout_s,
            name=f"jobq-{config.schema}",
            open=False,
        )
        self._pool.open(wait=False)

    @classmethod
    def from_url(cls, url: str) -> PostgresDatabase:
        return cls(PostgresConfig.from_url(url))

    def sql(self, template: str) -> str:
        """`template` with the schema and its table names filled in (cached)."""
        found = self._sql.get(template)
        if found is None:
            found = self._sql[template] = template.format(**self._names)
        return found

    def run(self, body: Callable[[Connection], T], *, pipeline: bool = False) -> T:
        """Run `body` in one transaction: commit when it returns, roll back when it raises.

        `pipeline` sends its statements without waiting for each result (one round trip for a
        batch). The body may run more than once, so it must not keep state between attempts:
        again after a deadlock or serialization failure (the server rolled everything back), and
        once more on a fresh connection when the pooled one turns out dead before the commit (a
        server restart or failover; nothing was applied). A connection lost during the commit is
        never retried: the outcome is unknown, and the caller gets `StoreUnavailable`."""
        attempt, reconnected = 1, False
        while True:
            committing = False
            try:
                with self.connection() as conn:
                    if pipeline:
                        with conn.pipeline(), conn.transaction():
                            result = body(conn)
                            committing = True
                    else:
                        with conn.transaction():
                            result = body(conn)
                            committing = True
                return result
            except _RolledBack:
                if attempt == _DEADLOCK_RETRIES:
                    raise
                time.sleep(random.uniform(0, 0.01 * 2**attempt))  # full jitter: the rivals do not retry in step
                attempt += 1
            except _Broken:
                if committing or reconnected:
                    raise
                reconnected = True

    def read(self, template: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[DictRow]:
        """Rows of one statement, outside any transaction (retried once on a dead pooled connection)."""
        try:
            with self.connection() as conn:
                return conn.execute(self.sql(template), params).fetchall()
        except _Broken:
            with self.connection() as conn:
                return conn.execute(self.sql(template), params).fetchall()

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled connection in autocommit, psycopg errors translated (for statements `run` and
        `read` do not fit, such as a rolled-back EXPLAIN ANALYZE)."""
        conn: Connection | None = None
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            error = self.translate(exc)
            if conn is not None and conn.broken and type(error) is StoreUnavailable:
                # After a restart every idle connection is dead too: test them all now and let
                # the pool replace them, so that the caller's one retry gets a live connection.
                with contextlib.suppress(psycopg.Error):
                    self._pool.check()
                raise _Broken(str(error)) from None
            raise error from None

    def translate(self, exc: psycopg.Error) -> StoreError:
        """The jobq error for a psycopg one (the only place that decides retryability)."""
        where = f"PostgreSQL {self.config.display}"
        if isinstance(exc, psycopg_pool.PoolClosed):
            return StoreUnavailable(f"{where}: the store is closed")
        if isinstance(exc, psycopg_pool.PoolTimeout):
            return StoreUnavailable(
                f"{where}: no connection within {self.config.pool_timeout_s:g} s "
                f"(server unreachable, or all pool_max={self.config.pool_max} connections busy)"
            )
        if isinstance(exc, psycopg.errors.TransactionRollback):
            return _RolledBack(f"{where}: {_first_line(exc)}")
        if isinstance(exc, psycopg.errors.UniqueViolation):
            return Conflict(f"{where}: {_first_line(exc)}")
        if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
            return StoreError(
                f"{where}: schema {self.schema!r} is not initialised ({_first_line(exc)}); run `jobq init`"
            )
        if isinstance(exc, psycopg.OperationalError):
            return StoreUnavailable(f"{where} is unavailable: {_first_line(exc)}")
        return StoreError(f"{where}: {_first_line(exc)}")

    def _probe(self) -> None:
        try:
            with psycopg.connect(self.config.conninfo, autocommit=True):
                pass
        except psycopg.ProgrammingError as exc:  # libpq refused the URL itself
            raise ConfigError("store", self.config.display, _first_line(exc)) from None
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL {self.config.display}: {_first_line(exc)}") from None

    # -- schema ----------------------------------------------------------------------------------

    def schema_version(self) -> int | None:
        """The newest applied migration, or None when the schema has no version table yet."""
        rows = self.read("SELECT to_regclass(%s) IS NOT NULL AS present", [self._names["versions"]])
        if not rows[0]["present"]:
            return None
        rows = self.read("SELECT coalesce(max(version), 0) AS version FROM {versions}")
        return int(rows[0]["version"])

    def migrate(self) -> list[int]:
        """Apply the pending migrations; returns the versions this call applied (empty when none).

        Idempotent and safe to run from several processes at once: each migration is one
        transaction holding the schema's advisory lock, and re-checks the version table under it.
        Raises `ConfigError` when an applied migration's file has changed since."""
        applied: list[int] = []
        for migration in migrations():

            def apply(conn: Connection, migration: Migration = migration) -> bool:
                return self._apply(conn, migration)

            if self.run(apply):
                applied.append(migration.version)
        return applied

    def _apply(self, conn: Connection, migration: Migration) -> bool:
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_LOCK_CLASS, self.schema])
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [self.schema]).fetchone()
        if exists is None:
            conn.execute(self.sql("CREATE SCHEMA {schema}"))
        conn.execute(self.sql(_VERSION_TABLE))
        done = conn.execute(self.sql("SELECT checksum FROM {versions} WHERE version = %s"), [migration.version])
        row = done.fetchone()
        if row is not None:
            if row["checksum"] != migration.checksum:
                raise ConfigError(
                    "migration",
                    f"{migration.version:04d}_{migration.name}.sql",
                    "changed after it was applied; add a new migration instead of editing one",
                )
            return False
        # The files use unqualified names; SET LOCAL ends with this transaction.
        conn.execute(self.sql("SET LOCAL search_path TO {schema}"))
        conn.execute(migration.sql.encode())  # bytes: several statements, no parameters
        conn.execute(
            self.sql("INSERT INTO {versions} (version, name, checksum) VALUES (%s, %s, %s)"),
            [migration.version, migration.name, migration.checksum],
        )
        return True

    def ensure_schema(self) -> None:
        """Apply the construction policy of the URL's ``migrate`` parameter (module docstring)."""
        known = migrations()
        latest = known[-1].version
        policy = self.config.migrate
        version = self.schema_version()
        if policy == "always" or (policy == "missing" and version is None):
            self.migrate()
            return
        if version is None or version < latest:
            found = "absent" if version is None else f"at version {version}"
            raise ConfigError(
                "store",
                self.config.display,
                f"jobq schema {self.schema!r} is {found}, this jobq needs version {latest}: run `jobq init`",
            )
        applied = {int(row["version"]) for row in self.read("SELECT version FROM {versions}")}
        if missing := [m.version for m in known if m.version not in applied]:
            # A number handed out before a later one's, whose file arrived after the later one ran.
            raise ConfigError(
                "store", self.config.display, f"jobq schema {self.schema!r} lacks migrations {missing}: run `jobq init`"
            )

    def close(self) -> None:
        """Close the pool (idempotent); later calls raise `StoreUnavailable`."""
        self._pool.close()
