"""The embedded default transport: a queue table in the same SQLite file as the store.

Safe across threads and processes. A message is a row; a delivery hides the row until
`visible_at_ms` and stamps it with a fresh receipt token; an ack deletes the row only while it
still carries that token. A consumer killed before acking (even by `kill -9`) therefore loses
nothing: its rows become visible again when their visibility timeout ends. kombu's filesystem
and sqlalchemy transports lose such messages, which is why this table exists.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
import time
from collections.abc import Iterator, Sequence

from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError, StoreUnavailable, TransportUnavailable
from jobq.ports import Delivery, QueueDepth
from jobq.sqlitedb import SqliteDatabase

DDL = (
    """
    CREATE TABLE IF NOT EXISTS jobq_messages (
        id INTEGER PRIMARY KEY,
        queue TEXT NOT NULL,
        body BLOB NOT NULL,
        published_ms INTEGER NOT NULL,
        visible_at_ms INTEGER NOT NULL,
        receipt TEXT,
        delivery_count INTEGER NOT NULL DEFAULT 0
    )
    """,
    # Serves the claim (queue =, visible_at_ms <=, ORDER BY visible_at_ms, id: every index entry
    # ends with the rowid, so no sort step) and depth (a count over the queue's index range).
    "CREATE INDEX IF NOT EXISTS jobq_messages_queue_visible ON jobq_messages (queue, visible_at_ms)",
)

_INSERT = "INSERT INTO jobq_messages (queue, body, published_ms, visible_at_ms) VALUES (?, ?, ?, ?)"

_CLAIM = """
    UPDATE jobq_messages
       SET visible_at_ms = ?, receipt = ?, delivery_count = delivery_count + 1
     WHERE id IN (
           SELECT id FROM jobq_messages
            WHERE queue = ? AND visible_at_ms <= ?
            ORDER BY visible_at_ms, id
            LIMIT ?)
    RETURNING id, body, delivery_count
"""

_ANY_VISIBLE = "SELECT 1 FROM jobq_messages WHERE queue = ? AND visible_at_ms <= ? LIMIT 1"

_ACK = "DELETE FROM jobq_messages WHERE id = ? AND receipt = ?"

# Clearing the receipt retires the nacked delivery: a later ack or extend with it does nothing.
_NACK = "UPDATE jobq_messages SET visible_at_ms = ?, receipt = NULL WHERE id = ? AND receipt = ?"

_EXTEND = "UPDATE jobq_messages SET visible_at_ms = ? WHERE id = ? AND receipt = ?"

_DEPTH = "SELECT count(*) FROM jobq_messages WHERE queue = ?"

# A range of the (queue, visible_at_ms) index; the oldest publish time is read off the same rows.
_WAITING = "SELECT count(*), min(published_ms) FROM jobq_messages WHERE queue = ? AND visible_at_ms <= ?"

# An empty consume polls: first after a few milliseconds so a message published just after
# costs little latency, then less and less often so idle consumers stay cheap.
_POLL_FIRST_S = 0.002
_POLL_MAX_S = 0.05


class SqliteTransport:
    """A `Transport` on a table of `db`; several processes may share the database file.

    `visibility_timeout_s` is how long a delivery stays invisible to other consumers, measured
    on `clock` (which must agree across the processes sharing the file: keep the system clock
    outside single-process tests). `consume` waits in real time. Every sqlite3 failure leaves as
    `TransportUnavailable`. The caller keeps ownership of `db`: `close` does not close it.
    """

    def __init__(self, db: SqliteDatabase, *, visibility_timeout_s: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> None:
        if visibility_timeout_s <= 0:
            raise ConfigError("visibility_timeout_s", visibility_timeout_s, "must be positive")
        self._db = db
        self._visibility_ms = _ms(visibility_timeout_s)
        self._clock = clock
        self._owns_db = False
        with self._translated("create the queue table"), db.write() as conn:
            for statement in DDL:
                conn.execute(statement)

    @classmethod
    def from_url(cls, url: str, *, visibility_timeout_s: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> SqliteTransport:
        """A transport on the database at `sqlite:///relative.db` or `sqlite:////absolute.db`, which
        `close` closes. Raises `ConfigError` for any other URL, `TransportUnavailable` when the file
        cannot be opened."""
        db = SqliteDatabase.from_url(url)
        try:
            transport = cls(db, visibility_timeout_s=visibility_timeout_s, clock=clock)
        except BaseException:
            db.close()
            raise
        transport._owns_db = True
        return transport

    @property
    def database(self) -> SqliteDatabase:
        """The file the queue lives in (a store in the same file can commit with it: `atomic`)."""
        return self._db

    def publish(self, queue: str, bodies: Sequence[bytes]) -> None:
        """Append every body to `queue` in one transaction: all are enqueued, in order, or none is."""
        if not bodies:
            return
        with self._translated("publish"), self._db.write() as conn:
            now_ms = self._clock.now_ms()
            conn.executemany(_INSERT, [(queue, body, now_ms, now_ms) for body in bodies])

    def consume(self, queues: Sequence[str], max_messages: int, wait_s: float) -> list[Delivery]:
        """Up to `max_messages` deliveries claimed in one transaction, filled from `queues` in order:
        a later queue is read only once every earlier one has no visible message left. Within a
        queue, the message visible the longest comes first, then the oldest. Returns as soon as
        one delivery is claimed, or an empty list after about `wait_s` seconds of real time."""
        if max_messages <= 0 or not queues:
            return []
        deadline = time.monotonic() + max(wait_s, 0.0)
        pause_s = _POLL_FIRST_S
        with self._translated("consume"):
            deliveries = self._claim(queues, max_messages)
            while not deliveries:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                time.sleep(min(pause_s, remaining))
                pause_s = min(pause_s * 2, _POLL_MAX_S)
                # Probe with a read first: in WAL it never takes the write lock, so idle consumers
                # polling an empty queue do not make publishers and busy consumers wait for it.
                if self._any_visible(queues):
                    deliveries = self._claim(queues, max_messages)
            return deliveries

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Delete the messages in one transaction. A receipt that is no longer the message's latest
        (it was redelivered or nacked since) or whose message is gone is ignored."""
        self._update("ack", _ACK, deliveries, visible_in_ms=None)

    def nack(self, deliveries: Sequence[Delivery], delay_s: float = 0) -> None:
        """Make the messages visible again `delay_s` from now; their receipts stop working. Stale
        receipts are ignored."""
        self._update("nack", _NACK, deliveries, visible_in_ms=_ms(max(delay_s, 0.0)))

    def extend(self, deliveries: Sequence[Delivery], visibility_s: float) -> None:
        """Hide the messages until `visibility_s` from now (not added to what was left), like SQS's
        ChangeMessageVisibility. Stale receipts are ignored."""
        self._update("extend", _EXTEND, deliveries, visible_in_ms=_ms(max(visibility_s, 0.0)))

    def depth(self, queue: str) -> int:
        """Messages in `queue` that are not yet acked, visible or not (exact)."""
        with self._translated("count messages"):
            rows = self._db.read(_DEPTH, (queue,))
        return int(rows[0][0])

    def queue_depth(self, queue: str) -> QueueDepth:
        """The messages of `queue` visible now (exact: a count over the queue's index range, without
        the write lock), and the age of the oldest of them by its `published_ms`."""
        with self._translated("count waiting messages"):
            now_ms = self._clock.now_ms()
            ((count, oldest_ms),) = self._db.read(_WAITING, (queue, now_ms))
        return QueueDepth(int(count), max(now_ms - int(oldest_ms), 0) / 1000 if oldest_ms is not None else None)

    def close(self) -> None:
        """Close the database when `from_url` opened it; a database passed in stays open."""
        if self._owns_db:
            self._db.close()

    def _claim(self, queues: Sequence[str], max_messages: int) -> list[Delivery]:
        token = secrets.token_hex(8)
        deliveries: list[Delivery] = []
        with self._db.write() as conn:
            # Read the time under the write lock: waiting for the lock must not shorten the lease.
            now_ms = self._clock.now_ms()
            hidden_until_ms = now_ms + self._visibility_ms
            for queue in queues:
                wanted = max_messages - len(deliveries)
                if wanted <= 0:
                    break
                rows = conn.execute(_CLAIM, (hidden_until_ms, token, queue, now_ms, wanted)).fetchall()
                # RETURNING gives no order; ids follow publish order within the claimed batch.
                for message_id, body, delivery_count in sorted(rows, key=lambda row: int(row[0])):
                    deliveries.append(Delivery(queue, bytes(body), f"{message_id}:{token}", int(delivery_count)))
        return deliveries

    def _any_visible(self, queues: Sequence[str]) -> bool:
        now_ms = self._clock.now_ms()
        return any(self._db.read(_ANY_VISIBLE, (queue, now_ms)) for queue in queues)

    def _update(self, action: str, sql: str, deliveries: Sequence[Delivery], *, visible_in_ms: int | None) -> None:
        """Run `sql` once per delivery with (id, token), preceded by the new `visible_at_ms` when given."""
        keys = [key for key in map(_receipt_key, deliveries) if key is not None]
        if not keys:
            return
        with self._translated(action), self._db.write() as conn:
            if visible_in_ms is None:
                conn.executemany(sql, keys)
            else:
                visible_at_ms = self._clock.now_ms() + visible_in_ms
                conn.executemany(sql, [(visible_at_ms, *key) for key in keys])

    @contextlib.contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, StoreUnavailable) as exc:
            raise TransportUnavailable(f"sqlite transport on {self._db.path}: cannot {action}: {exc}") from exc


def _receipt_key(delivery: Delivery) -> tuple[int, str] | None:
    """(message id, token) from a receipt `<id>:<token>`; None for a receipt this transport never
    issued, which then matches no message."""
    message_id, _, token = delivery.receipt.partition(":")
    if not message_id.isdigit() or not token:
        return None
    return int(message_id), token


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
