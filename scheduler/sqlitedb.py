"""One SQLite database file shared by the embedded store, time index and transport.

Safe across threads (a connection per thread) and across processes (WAL, a busy timeout and
`BEGIN IMMEDIATE` for every write, so writers queue on the file lock instead of failing on a
lock upgrade). `sqlite3` errors are translated into `StoreUnavailable` here.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jobq.errors import ConfigError, StoreError, StoreUnavailable

_BUSY_TIMEOUT_MS = 30000

_PRAGMAS = (
    # Readers never block the writer and the writer never blocks readers; survives kill -9.
    "PRAGMA journal_mode=WAL",
    # In WAL, NORMAL syncs at checkpoints only: a power cut may lose the last commits, a process
    # crash loses nothing. jobq's durability target is the process crash.
    "PRAGMA synchronous=NORMAL",
    # Writers from other processes wait up to 30 s for the lock instead of failing at once.
    f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys=ON",
    # Keep hot pages in memory: 64 MiB per connection at most.
    "PRAGMA cache_size=-65536",
    "PRAGMA temp_store=MEMORY",
)


def path_from_url(url: str) -> str:
    """The file path of `sqlite:///relative/jobq.db` or `sqlite:////absolute/jobq.db`.

    In-memory databases are refused: the embedded backends are shared by several processes."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigError("url", url, "expected a sqlite:/// URL")
    path = parts.path
    if parts.netloc:
        raise ConfigError("url", url, "use sqlite:///relative.db or sqlite:////absolute/path.db")
    if path.startswith("/"):
        path = path[1:]
    if not path or path == ":memory:":
        raise ConfigError("url", url, "the embedded backends need a file path: several processes share it")
    return path


class SqliteDatabase:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(Path(path))
        parent = Path(self.path).parent
        parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._by_thread: dict[threading.Thread, sqlite3.Connection] = {}
        self._all_lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> SqliteDatabase:
        return cls(path_from_url(url))

    def connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreUnavailable(f"database {self.path} is closed")
            conn = self._connect()
            self._local.conn = conn
            with self._all_lock:
                # Close the connections of threads that have ended, so short-lived threads do not
                # accumulate open files.
                for thread in [t for t in self._by_thread if not t.is_alive()]:
                    with contextlib.suppress(sqlite3.Error):
                        self._by_thread.pop(thread).close()
                self._by_thread[threading.current_thread()] = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves.
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        try:
            conn.row_factory = sqlite3.Row
            for pragma in _PRAGMAS:
                _retry_locked(lambda p=pragma: conn.execute(p))
            return conn
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: `BEGIN IMMEDIATE` takes the write lock up front; commit or roll back.
        Inside `atomic` on the same thread, a savepoint of the enclosing transaction instead."""
        conn = self.connection()
        if conn.in_transaction:
            if not getattr(self._local, "atomic", False):
                raise RuntimeError("nested write transaction on one thread: a bug in the caller")
            with self._savepoint(conn):
                yield conn
            return
        try:
            _begin_immediate(conn)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: {exc}") from exc
        try:
            yield conn
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _translate(self.path, exc) from exc
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise StoreUnavailable(f"{self.path}: commit failed: {exc}") from exc

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """One write transaction that every `write` on this thread joins until it ends (each as a
        savepoint, so one that raises undoes only its own writes): the store, time index and queue
        of one file then commit together, or not at all."""
        with self.write():
            outer = getattr(self._local, "atomic", False)  # an atomic inside another joins it
            self._local.atomic = True
            try:
                yield
            finally:
                self._local.atomic = outer

    @contextlib.contextmanager
    def _savepoint(self, conn: sqlite3.Connection) -> Iterator[None]:
        """A `write` inside `atomic`: its errors are translated as a transaction's would be."""
        try:
            conn.execute("SAVEPOINT jobq_joined")
            try:
                yield
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK TO jobq_joined")
                    conn.execute("RELEASE jobq_joined")
                raise
            conn.execute("RELEASE jobq_joined")
        except sqlite3.Error as exc:
            raise _translate(self.path, exc) from exc

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self.connection().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _translate(self.path, exc) from exc

    def executescript(self, script: str) -> None:
        conn = self.connection()
        try:
            _retry_locked(lambda: conn.executescript(script))
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: {exc}") from exc

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            for conn in self._by_thread.values():
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._by_thread.clear()
        self._local = threading.local()


# Waiting for the write lock. SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50,
# 50, 100 ms between tries: a process that found the lock taken once or twice sleeps for tens of
# milliseconds while the holder commits and takes the lock again many times, so with two busy
# worker processes each spent much of its time asleep (docs/performance.md, issue 14). BEGIN
# IMMEDIATE is the only statement that waits for the lock (in WAL, statements inside it and reads
# outside it do not), so it waits in this loop instead: short jittered sleeps that never grow past
# `_LOCK_PAUSE_MAX_S`, up to the same 30 s the busy timeout allows every other statement.
_LOCK_WAIT_S = 30.0
_LOCK_PAUSE_FIRST_S = 0.0002
_LOCK_PAUSE_MAX_S = 0.002


def _begin_immediate(conn: sqlite3.Connection) -> None:
    """`BEGIN IMMEDIATE`, retried with short pauses while another connection holds the write lock.
    The busy handler is off for the attempt itself (so a taken lock answers at once) and back on
    for the transaction's statements."""
    conn.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        pause_s = _LOCK_PAUSE_FIRST_S
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause_s * (0.5 + random.random()))
            pause_s = min(pause_s * 2, _LOCK_PAUSE_MAX_S)
    finally:
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")


def _retry_locked(op: Any, attempts: int = 50) -> Any:
    """Run `op`, retrying 'database is locked' that the busy handler does not cover (schema
    changes and BEGIN IMMEDIATE while another process checkpoints)."""
    for attempt in range(attempts):
        try:
            return op()
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or attempt == attempts - 1:
                raise
            time.sleep(min(0.001 * 2**attempt, 0.1))
    return None


def _translate(path: str, exc: sqlite3.Error) -> StoreError:
    """Locks and I/O are worth retrying; anything else (a closed handle, a constraint) is not."""
    if isinstance(exc, sqlite3.OperationalError):
        return StoreUnavailable(f"{path}: {exc}")
    return StoreError(f"{path}: {exc}")


def placeholders(n: int) -> str:
    return ",".join("?" * n)
