"""`KombuTransport`: the `Transport` port over any `Broker` (see `jobq.transport.kombu` for what
each broker does where brokers disagree).

It names the queues (`<prefix>-<queue>`), polls them itself in priority order, issues receipts,
serialises calls to brokers whose channels are not thread-safe, translates errors, reconnects once
after a lost connection, and keeps the liveness clock.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from jobq.errors import ConfigError, TransportError, TransportUnavailable
from jobq.ports import Delivery, QueueDepth
from jobq.transport.kombu.broker import Broker, BrokerMessage

log = logging.getLogger("jobq.transport")

T = TypeVar("T")

# An empty consume polls again after a few milliseconds, then less and less often, up to the
# broker's `poll_interval_s`: a message published just after costs little latency, idle
# consumers little load.
_POLL_FIRST_S = 0.005

# Query parameters kombu takes as connection arguments; every other one is a transport option.
_CONNECTION_PARAMS = frozenset({"heartbeat", "ssl", "connect_timeout", "login_method", "failover_strategy"})

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True, slots=True)
class _Held:
    queue: str
    name: str
    handle: object
    identity: str | None


class KombuTransport:
    """A `Transport` on Redis, RabbitMQ or SQS, chosen by the URL's scheme.

    `url`: `redis://host:port/db`, `amqp://user:password@host:port/vhost`, `sqs://` (AWS; the
    region from `?region=`, `transport_options` or the environment) or
    `sqs://KEY:SECRET@127.0.0.1:PORT?region=us-east-1` (a local endpoint, plain HTTP on loopback).
    Query parameters other than kombu's connection arguments (`heartbeat`, `ssl`, ...) become kombu
    transport options; `transport_options` add to and override them. `visibility_timeout_s`
    applies to Redis and SQS (which jobq configures on every queue it uses, existing or new);
    RabbitMQ has none. `poll_interval_s` is the longest pause between polls while `consume` waits
    (default 0.05 s, 0.25 s on SQS, whose requests are billed).

    Nothing connects until the first call. Safe to share between threads: calls to Redis and
    RabbitMQ are serialised (their kombu channels are not thread-safe), SQS calls run in parallel.
    """

    def __init__(
        self,
        url: str,
        *,
        visibility_timeout_s: float = 60.0,
        prefix: str = "jobq",
        transport_options: Mapping[str, Any] | None = None,
        poll_interval_s: float | None = None,
        connect_retries: int = 2,
    ) -> None:
        scheme, kombu_url, options = _split_url(url)
        # `?prefix=` in the URL names the queues, so deployments (and tests) can share a broker.
        prefix = str(options.pop("prefix", prefix))
        if visibility_timeout_s <= 0:
            raise ConfigError("visibility_timeout_s", visibility_timeout_s, "must be positive")
        if not prefix or not set(prefix) <= _NAME_CHARS:
            raise ConfigError("prefix", prefix, "use letters, digits, '-' and '_' only")
        if poll_interval_s is not None and poll_interval_s <= 0:
            raise ConfigError("poll_interval_s", poll_interval_s, "must be positive")
        options.update(transport_options or {})
        self._url = _redact(url)
        self._prefix = prefix
        self._broker = _open_broker(scheme, kombu_url, options, visibility_timeout_s, prefix, connect_retries)
        self._poll_interval_s = poll_interval_s or self._broker.default_poll_interval_s
        # Serialises broker I/O where the kombu channel is not thread-safe; consume waits outside it.
        self._io: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if self._broker.thread_safe else threading.RLock()
        )
        self._state = threading.Lock()
        self._in_flight: dict[str, _Held] = {}
        self._receipt_of: dict[str, str] = {}  # message identity -> its latest receipt
        self._last_consume: float | None = None  # time.monotonic() when consume last reached the broker
        self._failing = False
        self._closed = False

    def publish(self, queue: str, bodies: Sequence[bytes]) -> None:
        """Enqueue every body, in order, batched: Redis in one pipeline, RabbitMQ with publisher
        confirms (a publish that returns is stored by the broker: persistent messages on durable
        queues), SQS in SendMessageBatch calls of up to 10. A failure may leave some bodies
        enqueued, and a retry may then enqueue them twice (at-least-once)."""
        if bodies:
            self._call("publish", functools.partial(self._broker.publish, self._name(queue), list(bodies)))

    def consume(self, queues: Sequence[str], max_messages: int, wait_s: float) -> list[Delivery]:
        """Up to `max_messages` deliveries, filled from `queues` in order: a later queue is polled
        only when every earlier one had nothing to give. Returns as soon as a pass finds anything,
        or an empty list after about `wait_s` seconds. A redelivery of a message to this transport
        retires the receipt of its earlier delivery."""
        if max_messages <= 0 or not queues:
            return []
        deadline = time.monotonic() + max(wait_s, 0.0)
        pause_s = _POLL_FIRST_S
        while True:
            remaining = deadline - time.monotonic()
            # One queue on a broker that can wait server-side: let it, in whole seconds (rounded
            # down, unless that loses a whole second to a few milliseconds already spent).
            long_poll_s = int(min(remaining, 20) + 0.05) if self._broker.long_poll and len(queues) == 1 else 0
            deliveries = self._call("consume", functools.partial(self._take, queues, max_messages, long_poll_s))
            remaining = deadline - time.monotonic()
            if deliveries or remaining <= 0:
                return deliveries
            if long_poll_s == 0:
                time.sleep(min(pause_s, remaining))
                pause_s = min(pause_s * 2, self._poll_interval_s)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Delete the messages. A receipt this transport did not issue, already acked or nacked,
        superseded by a redelivery to this transport, or from a connection that has since died is
        ignored. On Redis and SQS a stale receipt from another process may still delete the
        message (its delivery tag or receipt handle names the message, not the delivery)."""
        self._settle("ack", deliveries, self._broker.ack, forget=True)

    def nack(self, deliveries: Sequence[Delivery], delay_s: float = 0) -> None:
        """Return the messages to their queue, visible again after `delay_s` (`jobq.transport.kombu`
        says how each broker keeps the delay). Their receipts stop working."""
        delay_s = max(delay_s, 0.0)
        self._settle(
            "nack", deliveries, lambda name, handles: self._broker.requeue(name, handles, delay_s), forget=True
        )

    def extend(self, deliveries: Sequence[Delivery], visibility_s: float) -> None:
        """Hide the messages until `visibility_s` from now (not added to what was left); a no-op on
        RabbitMQ, which redelivers only when the connection is lost. Stale receipts are ignored."""
        visibility_s = max(visibility_s, 0.0)
        self._settle(
            "extend", deliveries, lambda name, handles: self._broker.extend(name, handles, visibility_s), forget=False
        )

    def depth(self, queue: str) -> int:
        """Messages in `queue` not yet acked, visible or not (approximate: see `jobq.transport.kombu`)."""
        return self._call("depth", functools.partial(self._broker.depth, self._name(queue)))

    def queue_depth(self, queue: str) -> QueueDepth:
        """Messages of `queue` waiting for a consumer and the oldest one's age, in one or two
        broker calls (how each broker counts, and which can tell the age: `jobq.transport.kombu`)."""
        waiting, oldest_age_s = self._call(
            "count waiting messages", functools.partial(self._broker.waiting, self._name(queue))
        )
        return QueueDepth(waiting, oldest_age_s if waiting else None)

    def health_check(self, max_silence_s: float) -> bool:
        """True while this transport is open, its last broker call succeeded, and a consume came
        back from the broker (with or without messages) within the last `max_silence_s` seconds.
        A worker that stops calling consume, or whose consume keeps failing, turns it False.
        A worker whose slots are all busy does not consume either: give it a bound to match."""
        with self._state:
            if self._closed or self._failing or self._last_consume is None:
                return False
            return time.monotonic() - self._last_consume <= max_silence_s

    @property
    def consume_silence_s(self) -> float | None:
        """Seconds since a consume last came back from the broker; None before the first one."""
        with self._state:
            return None if self._last_consume is None else time.monotonic() - self._last_consume

    def close(self) -> None:
        """Release the connection and hand back every delivery not yet acked, visible again at once.
        Later calls raise `TransportUnavailable`; closing twice is harmless."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            held: dict[str, list[object]] = {}
            for entry in self._in_flight.values():
                held.setdefault(entry.name, []).append(entry.handle)
            self._in_flight.clear()
            self._receipt_of.clear()
        with self._io:
            self._broker.close(held)

    def _name(self, queue: str) -> str:
        return f"{self._prefix}-{queue}"

    def _take(self, queues: Sequence[str], max_messages: int, long_poll_s: int) -> list[Delivery]:
        self._broker.maintain()
        deliveries: list[Delivery] = []
        for queue in queues:
            wanted = max_messages - len(deliveries)
            if wanted <= 0:
                break
            for message in self._broker.get(self._name(queue), wanted, long_poll_s):
                deliveries.append(self._register(queue, message))
        with self._state:
            self._last_consume = time.monotonic()
        return deliveries

    def _register(self, queue: str, message: BrokerMessage) -> Delivery:
        receipt = secrets.token_hex(12)
        with self._state:
            if message.identity is not None:
                earlier = self._receipt_of.pop(message.identity, None)
                if earlier is not None:
                    self._in_flight.pop(earlier, None)
                self._receipt_of[message.identity] = receipt
            self._in_flight[receipt] = _Held(queue, self._name(queue), message.handle, message.identity)
        return Delivery(queue, message.body, receipt, message.delivery_count)

    def _settle(
        self,
        action: str,
        deliveries: Sequence[Delivery],
        apply: Callable[[str, list[object]], None],
        *,
        forget: bool,
    ) -> None:
        """Run `apply` once per broker queue on the live deliveries' handles; receipts are forgotten
        only once the broker took the call, so a caller may retry after `TransportUnavailable`."""
        with self._state:
            live = {d.receipt: self._in_flight[d.receipt] for d in deliveries if d.receipt in self._in_flight}
        if not live:
            return
        by_name: dict[str, list[object]] = {}
        for entry in live.values():
            by_name.setdefault(entry.name, []).append(entry.handle)

        def run() -> None:
            for name, handles in by_name.items():
                apply(name, handles)

        self._call(action, run)
        if forget:
            with self._state:
                for receipt, entry in live.items():
                    self._in_flight.pop(receipt, None)
                    if entry.identity is not None and self._receipt_of.get(entry.identity) == receipt:
                        del self._receipt_of[entry.identity]

    def _call(self, action: str, operation: Callable[[], T]) -> T:
        """Run `operation` against the broker with errors translated; after a lost connection,
        reconnect and run it once more."""
        for attempt in (1, 2):
            if self._closed:
                raise TransportUnavailable(f"kombu transport on {self._url} is closed")
            try:
                with self._io:
                    result = operation()
            except Exception as exc:
                if isinstance(exc, TransportError):
                    error, reconnect = exc, False
                else:
                    translated = self._broker.translate(exc)
                    if translated is None:
                        raise
                    error, reconnect = translated
                if reconnect:
                    with self._io:
                        self._broker.reset()
                if attempt == 1 and error.retryable:
                    log.warning("transport %s: %s failed, retrying: %s", self._url, action, exc)
                    continue
                with self._state:
                    self._failing = True
                if error is exc:
                    raise
                raise type(error)(f"{self._url}: cannot {action}: {error}") from exc
            with self._state:
                self._failing = False
            return result
        raise AssertionError("unreachable")  # the second attempt returns or raises


def _open_broker(
    scheme: str,
    url: str,
    options: dict[str, Any],
    visibility_timeout_s: float,
    prefix: str,
    connect_retries: int,
) -> Broker:
    if scheme == "redis":
        from jobq.transport.kombu.redis import RedisBroker

        return RedisBroker(url, options, visibility_timeout_s, prefix, connect_retries)
    if scheme in ("amqp", "amqps", "pyamqp"):
        from jobq.transport.kombu.amqp import AmqpBroker

        return AmqpBroker(url, options, connect_retries)
    if scheme == "sqs":
        from jobq.transport.kombu.sqs import SqsBroker

        return SqsBroker(url, options, visibility_timeout_s, connect_retries)
    raise ConfigError("broker", _redact(url), "unsupported kombu URL; use redis://, amqp:// or sqs://")


def _split_url(url: str) -> tuple[str, str, dict[str, Any]]:
    """(scheme, the URL for kombu, transport options from its query string)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(key, value) for key, value in query if key in _CONNECTION_PARAMS]
    options = {key: _option_value(value) for key, value in query if key not in _CONNECTION_PARAMS}
    return parts.scheme.lower(), urlunsplit(parts._replace(query=urlencode(kept))), options


def _option_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        with contextlib.suppress(ValueError):
            return convert(text)
    return text


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
