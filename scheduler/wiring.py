"""The composition root: the only module that maps URLs to concrete backends.

Optional backends are imported here, lazily, so that a missing extra is one clear error
naming it (`pip install 'jobq[redis]'`) and never an ImportError at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.deployment import Deployment
from jobq.errors import ConfigError, StoreMissing
from jobq.extras import require
from jobq.ports import HistorySink, JobStore, TimeIndex, Transport
from jobq.settings import Settings
from jobq.sqlitedb import SqliteDatabase, path_from_url

_Opener = Callable[[str], SqliteDatabase]


def _sqlite_opener() -> _Opener:
    """Opens each SQLite file once per deployment, whichever ports (store, index, queue,
    history) name it: they share one database object."""
    databases: dict[str, SqliteDatabase] = {}

    def sqlite(url: str) -> SqliteDatabase:
        path = path_from_url(url)
        if path not in databases:
            databases[path] = SqliteDatabase(path)
        return databases[path]

    return sqlite


def connect(settings: Settings, clock: Clock = SYSTEM_CLOCK) -> Deployment:
    sqlite = _sqlite_opener()
    store = _store(settings.store_url, sqlite)
    try:
        index = _index(settings.index, store, sqlite)
        transport = _transport(settings, sqlite, clock)
        history = _history(settings.history, store, sqlite, settings.history_flush_s)
    except BaseException:
        store.close()  # a pooled store left to the garbage collector stops its threads badly
        raise
    return Deployment(settings, store, index, transport, history, clock, atomic=_one_file(store, transport))


def _one_file(store: JobStore, transport: Transport) -> Callable[[], AbstractContextManager[None]] | None:
    """`SqliteDatabase.atomic` when the store and the queue share one SQLite file (the SQLite time
    index always does: it is a view of the store)."""
    db: object = getattr(store, "db", None)
    queue_db: object = getattr(transport, "database", None)
    if queue_db is db and isinstance(db, SqliteDatabase):
        return db.atomic
    return None


_POSTGRES = ("postgresql", "postgres")


def connect_reader(settings: Settings, clock: Clock = SYSTEM_CLOCK, *, history: bool = False) -> Deployment:
    """For read-only commands (`jobq list`, `status`, `runs`, `dlq list`, ...): the store, and the
    history sink when `history`, never creating either. A store that does not exist (no SQLite
    file, no PostgreSQL schema) raises `StoreMissing`. No broker or index is contacted: the
    deployment's index and transport are in-memory ones that nothing reads."""
    from jobq.history.memory import MemoryHistory
    from jobq.timeindex.memory import MemoryTimeIndex
    from jobq.transport.memory import MemoryTransport

    url = settings.store_url
    scheme = _scheme(url)
    if scheme == "sqlite" and not Path(path_from_url(url)).is_file():
        raise StoreMissing(f"sqlite:///{Path(path_from_url(url)).resolve()}")
    if scheme in _POSTGRES:
        from jobq.postgresdb import PostgresDatabase

        db = PostgresDatabase.from_url(url)
        try:
            if db.schema_version() is None:
                raise StoreMissing(f"{db.config.display} (schema {db.schema!r})")
        finally:
            db.close()
    sqlite = _sqlite_opener()
    store = _store(url, sqlite)
    try:
        sink = _history(settings.history, store, sqlite, 0) if history else MemoryHistory()
    except BaseException:
        store.close()
        raise
    return Deployment(settings, store, MemoryTimeIndex(), MemoryTransport(clock=clock), sink, clock)


def init_store(settings: Settings) -> str:
    """Create or upgrade the store's schema (what `jobq init` runs); returns what was done.

    Building a store refuses an outdated schema, so this reaches below it where needed."""
    url = settings.store_url
    scheme = _scheme(url)
    if scheme in _POSTGRES:
        from jobq.postgresdb import PostgresDatabase

        db = PostgresDatabase.from_url(url)
        try:
            applied = db.migrate()
            version = db.schema_version()
        finally:
            db.close()
        done = f"applied migrations {applied}" if applied else "already up to date"
        return f"PostgreSQL schema {db.schema!r} at version {version}: {done}"
    if scheme == "dynamodb":
        from jobq.store.dynamodb import DynamoStore
        from jobq.store.dynamodb_upgrade import move_legacy_jobs

        store = DynamoStore.from_url(url)
        try:
            created = store.create_table()
            moved = 0 if created else move_legacy_jobs(store)
        finally:
            store.close()
        state = "created (table and indexes ACTIVE, TTL on `ttl`)" if created else "already exists (indexes checked)"
        if moved:
            state += f"; moved {moved} jobs of tenants other than `default` to their tenant-scoped keys"
        return f"DynamoDB table {store.table.name!r}: {state}"
    if scheme == "sqlite":
        connect(settings).close()  # the embedded backends create their tables when they open
        return f"SQLite database {path_from_url(url)} ready"
    _store(url, lambda u: SqliteDatabase(path_from_url(u))).close()
    return f"{scheme} store ready"


def render_store_definition(settings: Settings, fmt: Literal["cloudformation", "terraform"]) -> str:
    """The store's table as infrastructure code (`jobq init --print`); makes no AWS call."""
    url = settings.store_url
    if _scheme(url) != "dynamodb":
        raise ConfigError("store", url, "--print renders a DynamoDB table; other stores create their schema with init")
    from jobq.dynamodb import DynamoConfig, render_definition

    return render_definition(DynamoConfig.from_url(url).table, fmt)


def _scheme(url: str) -> str:
    return urlsplit(url).scheme.lower()


def _store(url: str, sqlite: _Opener) -> JobStore:
    scheme = _scheme(url)
    if scheme == "sqlite":
        from jobq.store.sqlite import SqliteStore

        return SqliteStore(sqlite(url))
    if scheme == "memory":
        from jobq.store.memory import MemoryStore

        return MemoryStore()
    if scheme in _POSTGRES:
        from jobq.store.postgres import PostgresStore  # raises MissingExtra without jobq[postgres]

        return PostgresStore.from_url(url)
    if scheme == "dynamodb":
        from jobq.store.dynamodb import DynamoStore  # raises MissingExtra without jobq[aws]

        return DynamoStore.from_url(url)
    raise ConfigError(
        "store",
        url,
        "unsupported store URL; use sqlite:///path.db, postgresql://..., dynamodb://TABLE?region=... or memory://",
    )


def _index(url: str, store: JobStore, sqlite: _Opener) -> TimeIndex:
    scheme = _scheme(url)
    if scheme == "sqlite":
        from jobq.store.sqlite import SqliteStore
        from jobq.timeindex.sqlite import SqliteTimeIndex

        if not isinstance(store, SqliteStore) or store.db is not sqlite(url):
            raise ConfigError("index", url, "the sqlite index is a view of the sqlite store: give both the same URL")
        return SqliteTimeIndex(store)
    if scheme == "memory":
        from jobq.timeindex.memory import MemoryTimeIndex

        return MemoryTimeIndex()
    if scheme in _POSTGRES:
        from jobq.postgresdb import PostgresConfig
        from jobq.store.postgres import PostgresStore
        from jobq.timeindex.postgres import PostgresTimeIndex

        config = PostgresConfig.from_url(url)
        if not isinstance(store, PostgresStore) or not store.db.config.same_database(config):
            raise ConfigError("index", config.display, "the index is a view of the store: give both the same URL")
        return PostgresTimeIndex(store)
    if scheme in ("redis", "rediss"):
        from jobq.timeindex.redis import RedisTimeIndex  # raises MissingExtra without jobq[redis]

        return RedisTimeIndex.from_url(url)  # ?prefix=…&capacity=…; Redis Cluster: ?cluster=true
    raise ConfigError(
        "index",
        url,
        "unsupported index URL; use the store's sqlite or postgresql URL, redis://, rediss:// "
        "(Redis Cluster: ?cluster=true) or memory://",
    )


def _transport(settings: Settings, sqlite: _Opener, clock: Clock) -> Transport:
    url = settings.broker
    scheme = _scheme(url)
    if scheme == "sqlite":
        from jobq.transport.sqlite import SqliteTransport

        return SqliteTransport(sqlite(url), visibility_timeout_s=settings.visibility_timeout_s, clock=clock)
    if scheme == "memory":
        from jobq.transport.memory import MemoryTransport

        return MemoryTransport(visibility_timeout_s=settings.visibility_timeout_s, clock=clock)
    if scheme in ("redis", "rediss", "amqp", "amqps", "sqs"):
        extra = {"redis": "redis", "rediss": "redis", "sqs": "aws"}.get(scheme, "amqp")
        feature = f"the {scheme}:// broker"
        require("kombu", extra, feature)
        require({"redis": "redis", "rediss": "redis", "sqs": "boto3"}.get(scheme, "amqp"), extra, feature)
        from jobq.transport.kombu import KombuTransport

        # Design §5: a broker's own redelivery (Redis, SQS) must come after schedule-to-start, so a
        # run whose worker died before starting it is recovered by the reaper (fence+1) first; the
        # late redelivery then fails the start CAS and is dropped.
        visibility_s = max(settings.visibility_timeout_s, settings.schedule_to_start_s + settings.lease_s)
        return KombuTransport(url, visibility_timeout_s=visibility_s)
    raise ConfigError(
        "broker", url, "unsupported broker URL; use sqlite:///path.db, redis://, amqp://, sqs:// or memory://"
    )


def _history(url: str, store: JobStore, sqlite: _Opener, flush_s: float) -> HistorySink:
    from jobq.history.buffered import BufferedHistory

    scheme = _scheme(url)
    if scheme == "sqlite":
        from jobq.history.sqlite import SqliteHistory

        sink = SqliteHistory(sqlite(url))
        return BufferedHistory(sink, interval_s=flush_s) if flush_s > 0 else sink
    if scheme == "memory":
        from jobq.history.memory import MemoryHistory

        return MemoryHistory()
    if scheme in _POSTGRES:
        from jobq.history.postgres import PostgresHistory
        from jobq.postgresdb import PostgresConfig
        from jobq.store.postgres import PostgresStore

        if isinstance(store, PostgresStore) and store.db.config.same_database(PostgresConfig.from_url(url)):
            pg_sink = PostgresHistory(store.db)  # the store's pool; the store closes it
        else:
            pg_sink = PostgresHistory.from_url(url)
        return BufferedHistory(pg_sink, interval_s=flush_s) if flush_s > 0 else pg_sink
    # The AWS sinks buffer on their own schedule (flush_s / flush_bytes in the URL): wrapping them
    # in BufferedHistory would write one S3 object per process every history_flush_s.
    if scheme == "s3":
        from jobq.history.s3 import S3History  # raises MissingExtra without jobq[aws]

        return S3History.from_url(url)
    if scheme == "firehose":
        from jobq.history.firehose import FirehoseHistory

        return FirehoseHistory.from_url(url)  # reading needs &s3=s3://BUCKET/PREFIX of the stream's destination
    raise ConfigError(
        "history",
        url,
        "unsupported history URL; use sqlite:///path.db, postgresql://..., memory://, s3://BUCKET/PREFIX "
        "or firehose://STREAM",
    )
