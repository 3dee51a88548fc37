"""The RabbitMQ broker behind `KombuTransport` (`amqp://`): durable queues, persistent messages
and publisher confirms through kombu's py-amqp transport. RabbitMQ has no visibility timeout and
no delayed requeue: a delayed nack is held unacked by this process until it is due.
"""

from __future__ import annotations

import contextlib
import heapq
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from jobq.errors import TransportError, TransportUnavailable
from jobq.transport.kombu.broker import BrokerMessage, KombuConnection, as_bytes, quietly, translate_kombu_error

# AMQP: a publish waits this long for the broker to confirm that it stored every message.
_CONFIRM_TIMEOUT_S = 15.0


class AmqpBroker:
    """Durable queues and persistent messages on RabbitMQ through kombu's py-amqp transport."""

    thread_safe = False
    long_poll = False
    default_poll_interval_s = 0.05

    def __init__(self, url: str, options: Mapping[str, Any], connect_retries: int) -> None:
        self._url = url
        self._options = dict(options)
        self._retries = connect_retries
        self._connection: Any = None
        self._channel: Any = None
        # Delivery tags belong to one channel: a handle carries its channel's generation, and a
        # handle from an earlier one is ignored (the broker requeued its message when it closed).
        self._generation = 0
        self._declared: set[str] = set()
        self._unacked: dict[int, str] = {}  # delivery tag -> queue, on the current channel
        self._delayed: list[tuple[float, int]] = []  # heap of (monotonic time due, delivery tag)
        self._published = 0  # publish sequence number on the current channel (confirms count from 1)
        self._unconfirmed: set[int] = set()
        self._refused = 0  # messages the broker nacked or returned as unroutable

    def publish(self, name: str, bodies: Sequence[bytes]) -> None:
        channel = self._open()
        self._declare(channel, name)
        first = self._published + 1
        for body in bodies:
            message = channel.prepare_message(
                body,
                content_type="application/octet-stream",
                content_encoding="binary",
                properties={"delivery_mode": 2},
            )
            # mandatory: a message the default exchange cannot route (the queue was deleted under
            # us) comes back as basic.return instead of vanishing.
            channel.basic_publish(message, exchange="", routing_key=name, mandatory=True)
            self._published += 1
            self._unconfirmed.add(self._published)
        last = self._published
        # Confirms for the whole batch are awaited once, rather than one round trip per message.
        deadline = time.monotonic() + _CONFIRM_TIMEOUT_S
        while any(first <= seq <= last for seq in self._unconfirmed):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransportUnavailable(f"RabbitMQ did not confirm the publish within {_CONFIRM_TIMEOUT_S} s")
            with contextlib.suppress(socket.timeout):
                self._connection.drain_events(timeout=remaining)
        if self._refused:
            refused, self._refused = self._refused, 0
            self._declared.discard(name)
            raise TransportUnavailable(f"RabbitMQ refused {refused} message(s) for {name}; publish again")

    def get(self, name: str, limit: int, wait_s: int) -> list[BrokerMessage]:
        channel = self._open()
        self._declare(channel, name)
        found: list[BrokerMessage] = []
        while len(found) < limit:
            message = channel.basic_get(queue=name, no_ack=False)
            if message is None:
                break
            tag = int(message.delivery_tag)
            self._unacked[tag] = name
            count = 2 if message.delivery_info.get("redelivered") else 1
            found.append(BrokerMessage((self._generation, tag), None, as_bytes(message.body), count))
        return found

    def ack(self, name: str, handles: Sequence[object]) -> None:
        for tag in self._current(handles):
            self._channel.basic_ack(tag)

    def requeue(self, name: str, handles: Sequence[object], delay_s: float) -> None:
        for tag in self._current(handles, keep=delay_s > 0):
            if delay_s > 0:
                # RabbitMQ has no delayed requeue: hold the message unacked (invisible to others)
                # until maintain() requeues it. Should this process die first, the broker requeues
                # it at once: early, never lost.
                heapq.heappush(self._delayed, (time.monotonic() + delay_s, tag))
            else:
                self._channel.basic_reject(tag, requeue=True)

    def extend(self, name: str, handles: Sequence[object], visibility_s: float) -> None:
        """Nothing to extend: RabbitMQ keeps an unacked message for as long as its channel lives,
        and returns it when the channel or connection closes; the store's lease catches a stuck
        task. But the connection must live: with AMQP heartbeats on, send one if due."""
        self._heartbeat()

    def depth(self, name: str) -> int:
        # The declare-ok counts only ready messages; AMQP cannot see other connections' unacked
        # ones (the management API can), so add the ones this transport holds.
        declared = self._open().queue_declare(queue=name, durable=True, auto_delete=False)
        self._declared.add(name)
        return int(declared.message_count) + sum(1 for queue in self._unacked.values() if queue == name)

    def waiting(self, name: str) -> tuple[int, float | None]:
        # The declare-ok counts ready messages only, which is what waits for a consumer.
        declared = self._open().queue_declare(queue=name, durable=True, auto_delete=False)
        self._declared.add(name)
        return int(declared.message_count), None

    def maintain(self) -> None:
        if self._channel is None:
            return
        self._heartbeat()
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, tag = heapq.heappop(self._delayed)
            if self._unacked.pop(tag, None) is not None:
                self._channel.basic_reject(tag, requeue=True)

    def translate(self, exc: Exception) -> tuple[TransportError, bool] | None:
        import amqp.exceptions as amqp_errors  # type: ignore[import-untyped]

        # Every AMQP error closes the channel (or the connection): rebuild both.
        if isinstance(exc, amqp_errors.AccessRefused):
            return TransportError(str(exc)), True
        if isinstance(exc, amqp_errors.NotFound):  # a queue deleted under us: declared again on retry
            return TransportUnavailable(str(exc)), True
        if isinstance(exc, amqp_errors.RecoverableConnectionError | amqp_errors.ConnectionError | OSError):
            return TransportUnavailable(str(exc)), True
        if isinstance(exc, amqp_errors.RecoverableChannelError | amqp_errors.MessageNacked):
            return TransportUnavailable(str(exc)), True
        if isinstance(exc, amqp_errors.AMQPError):
            return TransportError(str(exc)), True
        return translate_kombu_error(exc)

    def reset(self) -> None:
        if self._connection is not None:
            # Without a closing handshake: the socket may be dead. The broker requeues whatever
            # this connection held once it sees the socket close.
            with quietly("drop the RabbitMQ connection"):
                self._connection.collect()
        self._channel = self._connection = None
        self._forget_channel()

    def close(self, held: Mapping[str, Sequence[object]]) -> None:
        if self._connection is not None:
            with quietly("close the RabbitMQ connection"):
                self._connection.release()  # the broker requeues every unacked delivery
        self._channel = self._connection = None
        self._forget_channel()

    def _open(self) -> Any:
        if self._channel is None:
            connection = KombuConnection(self._url, transport_options=self._options)
            try:
                connection.ensure_connection(max_retries=self._retries, interval_start=0.1, interval_step=0.5)
                channel = connection.channel()
                channel.confirm_select()
            except BaseException:
                with quietly("drop the RabbitMQ connection"):
                    connection.collect()
                raise
            channel.events["basic_ack"].add(self._on_confirm)
            channel.events["basic_nack"].add(self._on_refuse)
            channel.events["basic_return"].add(self._on_return)
            self._connection, self._channel = connection, channel
        return self._channel

    def _heartbeat(self) -> None:
        # py-amqp sends heartbeats (`?heartbeat=N` in the URL) only when asked; without them the
        # broker drops the connection, and requeues its deliveries, after two silent intervals.
        # It also judges the broker by the bytes it has read, so read what is waiting first.
        if self._connection is not None and self._connection.heartbeat:
            with contextlib.suppress(socket.timeout):
                self._connection.drain_events(timeout=0)
            self._connection.heartbeat_check()

    def _forget_channel(self) -> None:
        """Start afresh for the next channel: the broker requeues what the old one held."""
        self._generation += 1
        self._declared.clear()
        self._unacked.clear()
        self._delayed.clear()
        self._published = 0
        self._unconfirmed.clear()
        self._refused = 0

    def _declare(self, channel: Any, name: str) -> None:
        if name not in self._declared:
            channel.queue_declare(queue=name, durable=True, auto_delete=False)
            self._declared.add(name)

    def _current(self, handles: Sequence[object], *, keep: bool = False) -> list[int]:
        """The delivery tags of `handles` still unacked on the open channel, each taken once
        (unless `keep`); none once the channel is gone."""
        tags = []
        for handle in handles:
            generation, tag = cast(tuple[int, int], handle)
            if self._channel is not None and generation == self._generation and tag in self._unacked:
                if not keep:
                    del self._unacked[tag]
                tags.append(tag)
        return tags

    def _settled(self, tag: int, multiple: bool) -> int:
        done = {seq for seq in self._unconfirmed if seq <= tag} if multiple else {tag} & self._unconfirmed
        self._unconfirmed -= done
        return len(done)

    def _on_confirm(self, delivery_tag: int, multiple: bool) -> None:
        self._settled(delivery_tag, multiple)

    def _on_refuse(self, delivery_tag: int, multiple: bool) -> None:
        self._refused += self._settled(delivery_tag, multiple)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self._refused += 1
