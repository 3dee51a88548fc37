"""Broker transports through kombu: Redis (`redis://`), RabbitMQ (`amqp://`) and Amazon SQS (`sqs://`).

One broker queue per jobq queue, named `<prefix>-<queue>` (`jobq-critical`). kombu serves the
queues of a consumer round-robin, so `consume` never uses kombu's consumers: it polls the queues
itself, highest first, without blocking, and waits (in short polls) only once all are empty.
Receipts are opaque tokens that are valid in the transport that issued them.

What each broker does where brokers disagree:

Unacked deliveries return: Redis after `visibility_timeout_s` (kombu's `unacked` restore, which
consume runs); RabbitMQ when the consumer's channel or connection closes, never by timeout; SQS
after `visibility_timeout_s` rounded up to whole seconds.

`nack(delay_s=0)` requeues at once everywhere (Redis: at the back of the list). With a delay:
Redis moves the delivery's restore time; RabbitMQ has no delayed requeue, so this transport holds
the message unacked and requeues it on the first consume after the delay (a process that dies
first hands it back early, never loses it); SQS changes the message's visibility.

`extend(visibility_s)`: Redis moves the restore time; SQS changes the visibility; RabbitMQ has
nothing to extend, because it returns a message only when the connection is lost (the store's
lease catches a stuck task). With AMQP heartbeats on (`amqp://...?heartbeat=60`), consume and
extend send them, so a worker busy with long tasks must extend at least every half interval.

`delivery_count`: Redis exact (a header counted by jobq's kombu channel, kept through restores);
RabbitMQ 1, or 2 for any redelivery (classic queues only flag it); SQS ApproximateReceiveCount.

`depth`: Redis the list length plus this prefix's unacked entries for the queue (a scan of the
unacked hash); RabbitMQ ready messages plus those this transport holds unacked (other connections'
unacked messages are invisible over AMQP); SQS visible + in flight + delayed, approximate.

`close` hands back every delivery not yet acked: kombu restores the Redis channel's unacked
messages, RabbitMQ requeues the connection's, and SQS ones are made visible again.

Delivery is at-least-once on every broker, and the broker is not the truth. A message comes back
after a lost connection; it can also leave the broker unprocessed in two narrow cases: a Redis
consumer killed between kombu's pop of the list and its write of the `unacked` entry (two steps),
and, on Redis and SQS, a late ack from a consumer whose delivery had timed out, which names the
message rather than the delivery and so deletes its redelivery. The store's fences make duplicates
harmless and its reaper re-dispatches a run whose message was lost.

Errors: every redis, py-amqp, botocore and kombu exception leaves as `TransportUnavailable`
(retryable: the broker is unreachable, throttling or failing over) or `TransportError` (a
configuration or permission problem). After a lost connection the call reconnects (bounded by
`connect_retries`) and runs again once; an ack whose channel died with the connection is a no-op,
because the broker has already requeued the message.

Liveness: `health_check(max_silence_s)` is False once no consume has come back from the broker
within `max_silence_s` seconds, while the last broker call failed, or after `close`.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import kombu.exceptions
from kombu.connection import Connection as _Connection
from kombu.messaging import Producer as _Producer

from jobq.errors import ConfigError, TransportError, TransportUnavailable
from jobq.ports import Delivery

log = logging.getLogger("jobq.transport")

T = TypeVar("T")

# kombu ships py.typed but leaves most of its API unannotated, which strict mypy reports at every
# call; reached through Any, the checks stay on jobq's own code.
KombuConnection: Any = _Connection
KombuProducer: Any = _Producer

# An empty consume polls again after a few milliseconds, then less and less often, up to the
# broker's `poll_interval_s`: a message published just after costs little latency, idle
# consumers little load.
_POLL_FIRST_S = 0.005

# Query parameters kombu takes as connection arguments; every other one is a transport option.
_CONNECTION_PARAMS = frozenset({"heartbeat", "ssl", "connect_timeout", "login_method", "failover_strategy"})

# Counted by jobq's Redis channel in the message headers, so the count travels with the message
# through kombu's unacked hash and back onto the list.
_DELIVERY_COUNT_HEADER = "x-jobq-delivery-count"

# Redis: at most this many overdue deliveries are restored per consume.
_RESTORE_BATCH = 100

# AMQP: a publish waits this long for the broker to confirm that it stored every message.
_CONFIRM_TIMEOUT_S = 15.0

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True, slots=True)
class BrokerMessage:
    """A message as a broker module hands it to `KombuTransport`."""

    handle: object  # what ack, requeue and extend need: a delivery tag, an SQS receipt handle
    identity: str | None  # the same for every delivery of one message, when the broker says so
    body: bytes
    delivery_count: int


class Broker(Protocol):
    """What `KombuTransport` needs from one broker. Names are full broker queue names; methods may
    raise any library error, which `translate` classifies. Unless `thread_safe`, calls are
    serialised by the transport."""

    thread_safe: bool
    #: The broker can wait for a message on one queue server-side (SQS long polling).
    long_poll: bool
    #: The longest pause between polls of empty queues, unless the caller chooses one.
    default_poll_interval_s: float

    def publish(self, name: str, bodies: Sequence[bytes]) -> None: ...

    def get(self, name: str, limit: int, wait_s: int) -> list[BrokerMessage]:
        """Up to `limit` messages from one queue; waits up to `wait_s` only when `long_poll`."""
        ...

    def ack(self, name: str, handles: Sequence[object]) -> None: ...

    def requeue(self, name: str, handles: Sequence[object], delay_s: float) -> None: ...

    def extend(self, name: str, handles: Sequence[object], visibility_s: float) -> None: ...

    def depth(self, name: str) -> int: ...

    def maintain(self) -> None:
        """Housekeeping run before every consume (Redis: restore overdue deliveries)."""
        ...

    def translate(self, exc: Exception) -> tuple[TransportError, bool] | None:
        """The jobq error for a library error, and whether the connection must be rebuilt;
        None for an exception that is not the broker's (a bug, left to propagate)."""
        ...

    def reset(self) -> None:
        """Drop the connection without I/O; the next call opens a new one."""
        ...

    def close(self, held: Mapping[str, Sequence[object]]) -> None:
        """Release everything, handing back `held` (unacked deliveries by queue) where the broker
        would not do so by itself. Never raises."""
        ...


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
        """Return the messages to their queue, visible again after `delay_s` (the module docstring
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
        """Messages in `queue` not yet acked, visible or not (approximate: see the module docstring)."""
        return self._call("depth", functools.partial(self._broker.depth, self._name(queue)))

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
        return _RedisBroker(url, options, visibility_timeout_s, prefix, connect_retries)
    if scheme in ("amqp", "amqps", "pyamqp"):
        return _AmqpBroker(url, options, connect_retries)
    if scheme == "sqs":
        from jobq.transport.sqs import SqsBroker

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


def translate_kombu_error(exc: Exception) -> tuple[TransportError, bool] | None:
    """kombu's own errors, common to every broker."""
    if isinstance(exc, kombu.exceptions.OperationalError | kombu.exceptions.BatchPublishError):
        return TransportUnavailable(str(exc)), True
    if isinstance(exc, kombu.exceptions.KombuError):
        return TransportError(str(exc)), False
    return None


@contextlib.contextmanager
def quietly(what: str) -> Iterator[None]:
    """For teardown: log a failure and carry on."""
    try:
        yield
    except Exception as exc:
        log.warning("transport: %s failed: %s", what, exc)


@functools.cache
def _redis_transport_class() -> type:
    """kombu's Redis transport with a channel that counts deliveries in a message header and
    reuses one redis-py client."""
    from kombu.transport import redis as kombu_redis

    base_channel: Any = kombu_redis.Channel
    base_transport: Any = kombu_redis.Transport

    class CountingChannel(base_channel):  # type: ignore[misc]
        _jobq_client: Any = None

        @contextlib.contextmanager
        def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
            # kombu builds a new redis-py client object (on the same pool) for every command,
            # which costs more CPU than the command's round trip; one per pool does the same.
            if client:
                yield client
                return
            pool = self.pool
            if self._jobq_client is None or self._jobq_client.connection_pool is not pool:
                self._jobq_client = self._create_client()
            yield self._jobq_client

        def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
            payload: dict[str, Any] = super()._get(queue)
            # kombu stores this payload in its unacked hash and pushes it back on restore, so the
            # count survives redeliveries and consumers that die.
            headers = payload.get("headers") or {}
            headers[_DELIVERY_COUNT_HEADER] = int(headers.get(_DELIVERY_COUNT_HEADER, 0)) + 1
            payload["headers"] = headers
            return payload

    class JobqRedisTransport(base_transport):  # type: ignore[misc]
        Channel = CountingChannel

    return JobqRedisTransport


class _RedisBroker:
    """Lists through kombu's Redis channel, with kombu's ack emulation (`unacked` hash and index)."""

    thread_safe = False
    long_poll = False
    default_poll_interval_s = 0.05

    def __init__(
        self, url: str, options: Mapping[str, Any], visibility_timeout_s: float, prefix: str, connect_retries: int
    ) -> None:
        self._url = url
        self._visibility_s = visibility_timeout_s
        self._retries = connect_retries
        self._options: dict[str, Any] = {
            # One list per queue: jobq has a queue per tier, so kombu's per-priority sub-lists
            # would only multiply the round trips of every poll.
            "priority_steps": [0],
            # Our own unacked keys, so restores never touch another application's (or prefix's).
            "unacked_key": f"{prefix}-unacked",
            "unacked_index_key": f"{prefix}-unacked_index",
            "unacked_mutex_key": f"{prefix}-unacked_mutex",
            # A consumer killed while restoring blocks restores for this long (kombu's default: 300 s).
            "unacked_mutex_expire": 10,
            "socket_timeout": 10,
            "socket_connect_timeout": 5,
            "client_name": prefix,
            **options,
            "visibility_timeout": visibility_timeout_s,
        }
        # Overdue deliveries return at most this late: a quarter of the timeout, within bounds.
        self._restore_every_s = min(max(visibility_timeout_s / 4, 0.05), 10.0)
        self._next_restore = float("-inf")  # time.monotonic() of the next restore
        self._connection: Any = None
        self._channel: Any = None

    def publish(self, name: str, bodies: Sequence[bytes]) -> None:
        channel = self._open()
        producer = KombuProducer(channel, auto_declare=False)
        # kombu's batch sends the pushes in one pipeline (or one by one where it cannot).
        with producer.batch(max_size=500):
            for body in bodies:
                producer.publish(
                    body,
                    exchange="",
                    routing_key=name,
                    content_type="application/octet-stream",
                    content_encoding="binary",
                    delivery_mode=2,
                )

    def get(self, name: str, limit: int, wait_s: int) -> list[BrokerMessage]:
        channel = self._open()
        found: list[BrokerMessage] = []
        while len(found) < limit:
            message = channel.basic_get(name, no_ack=False)
            if message is None:
                break
            tag = str(message.delivery_tag)
            count = int((message.headers or {}).get(_DELIVERY_COUNT_HEADER, 1))
            found.append(BrokerMessage(tag, tag, _as_bytes(message.body), count))
        return found

    def ack(self, name: str, handles: Sequence[object]) -> None:
        channel = self._open()
        for tag in handles:
            channel.basic_ack(tag)

    def requeue(self, name: str, handles: Sequence[object], delay_s: float) -> None:
        channel = self._open()
        if delay_s <= 0:
            for tag in handles:
                channel.basic_reject(tag, requeue=True)
        else:
            self._hide(channel, handles, delay_s)

    def extend(self, name: str, handles: Sequence[object], visibility_s: float) -> None:
        self._hide(self._open(), handles, visibility_s)

    def depth(self, name: str) -> int:
        channel = self._open()
        with channel.conn_or_acquire() as client:
            waiting = int(client.llen(name))
            # kombu keeps every unacked delivery of the prefix in one hash of [payload, exchange,
            # routing key]; the routing key is the queue. O(deliveries in flight). kombu's client
            # adds `global_keyprefix` to the commands kombu uses, which do not include HVALS.
            unacked_key = channel.global_keyprefix + channel.unacked_key
            held = sum(1 for raw in client.hvals(unacked_key) if json.loads(raw)[2] == name)
        return waiting + held

    def maintain(self) -> None:
        now = time.monotonic()
        if now < self._next_restore:
            return
        self._next_restore = now + self._restore_every_s
        # Pushes back every delivery whose unacked_index score is older than the visibility
        # timeout. kombu only runs this from its event loop, which jobq does not use.
        self._open().qos.restore_visible(num=_RESTORE_BATCH, interval=1)

    def translate(self, exc: Exception) -> tuple[TransportError, bool] | None:
        import redis.exceptions as redis_errors

        if isinstance(exc, redis_errors.AuthenticationError | redis_errors.AuthorizationError):
            return TransportError(str(exc)), True
        if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError | OSError):
            return TransportUnavailable(str(exc)), True
        if isinstance(exc, redis_errors.BusyLoadingError | redis_errors.ReadOnlyError | redis_errors.TryAgainError):
            return TransportUnavailable(str(exc)), False
        if isinstance(exc, redis_errors.ResponseError) and str(exc).startswith(("OOM", "MASTERDOWN", "LOADING")):
            return TransportUnavailable(str(exc)), False
        if isinstance(exc, redis_errors.RedisError):
            return TransportError(str(exc)), False
        return translate_kombu_error(exc)

    def reset(self) -> None:
        if self._channel is not None:
            # Closing would push back every delivery this channel holds while we still work on
            # them; they stay in Redis's unacked hash and their tags work on the next channel.
            self._channel.do_restore = False
            with quietly("close the Redis channel"):
                self._channel.close()
        if self._connection is not None:
            with quietly("close the Redis connection"):
                self._connection.release()
        self._channel = self._connection = None

    def close(self, held: Mapping[str, Sequence[object]]) -> None:
        if self._channel is not None:
            with quietly("restore unacked deliveries"):
                self._channel.close()  # kombu pushes this channel's unacked deliveries back
        if self._connection is not None:
            with quietly("close the Redis connection"):
                self._connection.release()
        self._channel = self._connection = None

    def _open(self) -> Any:
        if self._channel is None:
            connection = KombuConnection(self._url, transport=_redis_transport_class(), transport_options=self._options)
            try:
                connection.ensure_connection(max_retries=self._retries, interval_start=0.1, interval_step=0.5)
                self._channel = connection.channel()
            except BaseException:
                with quietly("close the Redis connection"):
                    connection.release()
                raise
            self._connection = connection
        return self._channel

    def _hide(self, channel: Any, tags: Sequence[object], seconds: float) -> None:
        # kombu restores a delivery once its unacked_index score (the time it was taken) is older
        # than the visibility timeout; moving the score moves that moment. XX: a delivery already
        # restored or acked is not brought back.
        score = time.time() + seconds - self._visibility_s
        with channel.conn_or_acquire() as client:
            client.zadd(channel.unacked_index_key, dict.fromkeys(map(str, tags), score), xx=True)
        # Restore when they are due rather than at the next periodic restore. (Other processes
        # restore them at their own pace: within a quarter of the timeout, 10 s at most.)
        self._next_restore = min(self._next_restore, time.monotonic() + seconds)


class _AmqpBroker:
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
            found.append(BrokerMessage((self._generation, tag), None, _as_bytes(message.body), count))
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


def _as_bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)
