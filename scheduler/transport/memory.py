"""An in-process transport: the reference implementation of `Transport` for tests and examples.

Thread-safe within one process and lost with it. It keeps the same contract as the brokers:
per-queue FIFO, strict priority across queues, a visibility timeout measured on the injected
clock, receipts unique per delivery, nack with a delay, extend and depth.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from threading import Condition

from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError, TransportUnavailable
from jobq.ports import Delivery, QueueDepth

# Publish and nack wake waiting consumers; a visibility timeout running out does not (and a
# manual clock may move at any time), so a waiting consumer looks again at least this often.
_RECHECK_S = 0.05


@dataclass(slots=True)
class _Message:
    id: int
    body: bytes
    visible_at_ms: int
    published_ms: int
    receipt: str | None = None
    delivery_count: int = 0
    # Bumped whenever visible_at_ms changes, so older heap entries for the message are skipped.
    version: int = 0


@dataclass(slots=True)
class _Queue:
    messages: dict[int, _Message] = field(default_factory=dict)
    # (visible_at_ms, id, version): the next visible message is on top. Entries whose version
    # or message is gone are stale and dropped when they reach the top.
    heap: list[tuple[int, int, int]] = field(default_factory=list)

    def schedule(self, message: _Message, visible_at_ms: int) -> None:
        message.visible_at_ms = visible_at_ms
        message.version += 1
        heapq.heappush(self.heap, (visible_at_ms, message.id, message.version))

    def take_visible(self, now_ms: int) -> _Message | None:
        while self.heap and self.heap[0][0] <= now_ms:
            _, message_id, version = heapq.heappop(self.heap)
            message = self.messages.get(message_id)
            if message is not None and message.version == version:
                return message
        return None


class MemoryTransport:
    """A `Transport` held in this process's memory.

    `visibility_timeout_s` is how long a delivery stays invisible to other consumers before it
    is handed out again, measured on `clock`. `consume` waits in real time.
    """

    def __init__(self, *, visibility_timeout_s: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> None:
        if visibility_timeout_s <= 0:
            raise ConfigError("visibility_timeout_s", visibility_timeout_s, "must be positive")
        self._visibility_ms = _ms(visibility_timeout_s)
        self._clock = clock
        self._changed = Condition()
        self._queues: dict[str, _Queue] = {}
        # Receipt -> message for every live delivery; a redelivery or a nack retires the old receipt.
        self._in_flight: dict[str, _Message] = {}
        self._queue_of: dict[int, str] = {}
        self._ids = itertools.count(1)
        self._receipts = itertools.count(1)
        self._closed = False

    def publish(self, queue: str, bodies: Sequence[bytes]) -> None:
        """Enqueue every body at the tail of `queue`, visible at once, all under one lock."""
        if not bodies:
            return
        with self._changed:
            self._check_open()
            now_ms = self._clock.now_ms()
            q = self._queues.setdefault(queue, _Queue())
            for body in bodies:
                message = _Message(id=next(self._ids), body=bytes(body), visible_at_ms=now_ms, published_ms=now_ms)
                q.messages[message.id] = message
                self._queue_of[message.id] = queue
                q.schedule(message, now_ms)
            self._changed.notify_all()

    def consume(self, queues: Sequence[str], max_messages: int, wait_s: float) -> list[Delivery]:
        """Up to `max_messages` deliveries, filled from `queues` in order: a later queue is read only
        once every earlier one has no visible message left. Within a queue, the message visible
        the longest comes first, then the oldest. Returns as soon as one delivery is found, or an
        empty list after `wait_s` seconds of real time. Raises `TransportUnavailable` once closed."""
        deadline = time.monotonic() + max(wait_s, 0.0)
        with self._changed:
            while True:
                self._check_open()
                deliveries = self._take(queues, max_messages)
                remaining = deadline - time.monotonic()
                if deliveries or max_messages <= 0 or not queues or remaining <= 0:
                    return deliveries
                self._changed.wait(min(remaining, _RECHECK_S))

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Delete the messages. A receipt that is no longer the message's latest (it was redelivered
        or nacked since) or whose message is gone is ignored."""
        with self._changed:
            self._check_open()
            for delivery in deliveries:
                message = self._in_flight.pop(delivery.receipt, None)
                if message is not None:
                    queue = self._queue_of.pop(message.id)
                    del self._queues[queue].messages[message.id]

    def nack(self, deliveries: Sequence[Delivery], delay_s: float = 0) -> None:
        """Make the messages visible again after `delay_s`; their receipts stop working. Stale
        receipts are ignored."""
        with self._changed:
            self._check_open()
            visible_at_ms = self._clock.now_ms() + _ms(max(delay_s, 0.0))
            for delivery in deliveries:
                message = self._in_flight.pop(delivery.receipt, None)
                if message is not None:
                    message.receipt = None
                    self._queues[self._queue_of[message.id]].schedule(message, visible_at_ms)
            self._changed.notify_all()

    def extend(self, deliveries: Sequence[Delivery], visibility_s: float) -> None:
        """Hide the messages until `visibility_s` from now (not added to what was left), like SQS's
        ChangeMessageVisibility. Stale receipts are ignored."""
        with self._changed:
            self._check_open()
            visible_at_ms = self._clock.now_ms() + _ms(max(visibility_s, 0.0))
            for delivery in deliveries:
                message = self._in_flight.get(delivery.receipt)
                if message is not None:
                    self._queues[self._queue_of[message.id]].schedule(message, visible_at_ms)
            self._changed.notify_all()

    def depth(self, queue: str) -> int:
        """Messages in `queue` that are not yet acked, visible or not (exact)."""
        with self._changed:
            self._check_open()
            q = self._queues.get(queue)
            return 0 if q is None else len(q.messages)

    def queue_depth(self, queue: str) -> QueueDepth:
        """The messages of `queue` visible now (exact), and the age of the oldest by publish time
        on the injected clock. Scans the queue: fine for the sizes an in-process queue holds."""
        with self._changed:
            self._check_open()
            now_ms = self._clock.now_ms()
            q = self._queues.get(queue)
            published = [m.published_ms for m in (q.messages.values() if q else ()) if m.visible_at_ms <= now_ms]
        return QueueDepth(len(published), max(now_ms - min(published), 0) / 1000 if published else None)

    def close(self) -> None:
        """Drop every message and wake waiting consumers. Every later call (and every consumer that
        was waiting) raises `TransportUnavailable`; closing twice is harmless."""
        with self._changed:
            self._closed = True
            self._queues.clear()
            self._in_flight.clear()
            self._queue_of.clear()
            self._changed.notify_all()

    def _take(self, queues: Sequence[str], max_messages: int) -> list[Delivery]:
        now_ms = self._clock.now_ms()
        hidden_until_ms = now_ms + self._visibility_ms
        deliveries: list[Delivery] = []
        for queue in queues:
            q = self._queues.get(queue)
            while q is not None and len(deliveries) < max_messages:
                message = q.take_visible(now_ms)
                if message is None:
                    break
                if message.receipt is not None:
                    # Its visibility timeout ran out: the previous receipt no longer acks it.
                    del self._in_flight[message.receipt]
                message.receipt = f"{message.id}:{next(self._receipts)}"
                message.delivery_count += 1
                self._in_flight[message.receipt] = message
                q.schedule(message, hidden_until_ms)
                deliveries.append(Delivery(queue, message.body, message.receipt, message.delivery_count))
        return deliveries

    def _check_open(self) -> None:
        if self._closed:
            raise TransportUnavailable("memory transport is closed")


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
