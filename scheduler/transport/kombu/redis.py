"""The Redis broker behind `KombuTransport` (`redis://`): lists through kombu's Redis channel, with
kombu's ack emulation (an `unacked` hash and index under jobq's prefix) and a delivery count that
jobq's channel keeps in each message's headers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jobq.errors import TransportError, TransportUnavailable
from jobq.transport.kombu.broker import (
    BrokerMessage,
    KombuConnection,
    as_bytes,
    log,
    quietly,
    translate_kombu_error,
)

# Counted by jobq's Redis channel in the message headers, so the count travels with the message
# through kombu's unacked hash and back onto the list.
_DELIVERY_COUNT_HEADER = "x-jobq-delivery-count"

# Stamped by jobq's Redis channel on publish (epoch milliseconds), so `waiting` can tell how long
# the message next in line has waited without consuming it.
PUBLISHED_MS_HEADER = "x-jobq-published-ms"

# Redis: at most this many overdue deliveries are restored per consume.
_RESTORE_BATCH = 100

# A take whose reply was lost is looked for, and its deliveries pushed back, for this long after
# Redis answers again: the lost command runs when the stall ends, maybe after our first new one.
_RECLAIM_WINDOW_S = 10.0

# Pop up to ARGV[1] messages from KEYS[1]; in each, count the delivery in its headers; record it
# in kombu's unacked index (KEYS[2], score ARGV[2]) and hash (KEYS[3]: [payload, exchange, routing
# key]); return the payloads. One script, so a message is never popped without its bookkeeping.
_TAKE_SCRIPT = """
local items = redis.call('RPOP', KEYS[1], ARGV[1])
if not items then return {} end
local out = {}
for _, item in ipairs(items) do
  local payload = cjson.decode(item)
  if type(payload.headers) ~= 'table' then payload.headers = {} end
  payload.headers[ARGV[3]] = (tonumber(payload.headers[ARGV[3]]) or 0) + 1
  local properties = payload.properties
  local info = properties.delivery_info or {}
  local raw = cjson.encode(payload)
  local route = cjson.encode(info.exchange or '') .. ',' .. cjson.encode(info.routing_key or ARGV[4])
  local saved = '[' .. raw .. ',' .. route .. ']'
  redis.call('ZADD', KEYS[2], ARGV[2], properties.delivery_tag)
  redis.call('HSET', KEYS[3], properties.delivery_tag, saved)
  out[#out + 1] = raw
end
return out
"""


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

        def get_many(self, queue: str, limit: int, taken_at: float) -> list[Any]:
            """Up to `limit` messages of `queue` in one round trip, where `basic_get` takes two per
            message: a script pops them, counts the delivery in each one's headers and writes
            kombu's ack bookkeeping (its unacked hash and index, as `QoS.append` writes them, scored
            `taken_at`) in one atomic step. A pop and its bookkeeping in two commands lost the
            messages whenever the pop's reply did (a Redis stall past the socket timeout): gone from
            the list and never in the unacked hash, until the reaper's schedule-to-start repair."""
            from kombu.utils import json as kombu_json  # kombu's decoder, as for any payload it wrote

            loads: Any = kombu_json.loads
            qos = self.qos
            prefix = self.global_keyprefix
            keys = (prefix + self._q_for_pri(queue, 0), prefix + qos.unacked_index_key, prefix + qos.unacked_key)
            with self.conn_or_acquire() as client:
                items = client.eval(_TAKE_SCRIPT, 3, *keys, limit, repr(taken_at), _DELIVERY_COUNT_HEADER, queue)
            payloads = [loads(item if isinstance(item, str) else item.decode()) for item in items]
            messages = [self.Message(payload, channel=self) for payload in payloads]
            base_append = super(type(qos), qos).append  # the in-process half of QoS.append
            for m in messages:
                base_append(m, m.delivery_tag)
            return messages

        def taken_at(self, score: float) -> list[str]:
            """The tags of the deliveries a `get_many` scored `score` took (and nobody acked or
            restored since)."""
            key = self.global_keyprefix + self.qos.unacked_index_key
            with self.conn_or_acquire() as client:
                tags = client.zrangebyscore(key, repr(score), repr(score))
            return [t if isinstance(t, str) else t.decode() for t in tags]

        def publish_many(self, queue: str, bodies: Sequence[bytes]) -> None:
            """`basic_publish` of every body to `queue` (the anonymous exchange), with one LPUSH:
            each message is prepared and augmented exactly as kombu does (the same JSON a kombu
            producer writes), without a producer's per-message routing work."""
            from kombu.utils import json as kombu_json

            dumps: Any = kombu_json.dumps
            messages = []
            headers = {PUBLISHED_MS_HEADER: round(time.time() * 1000)}
            for body in bodies:
                message = self.prepare_message(
                    body, 0, "application/octet-stream", "binary", dict(headers), {"delivery_mode": 2}
                )
                self._inplace_augment_message(message, "", queue)
                messages.append(dumps(message))
            if messages:
                with self.conn_or_acquire() as client:
                    client.lpush(self._q_for_pri(queue, 0), *messages)

        def ack_many(self, tags: Sequence[str]) -> None:
            """`basic_ack` for every tag, with kombu's Redis bookkeeping in one ZREM and one HDEL."""
            qos = self.qos
            if tags:
                with qos.pipe_or_acquire() as pipe:
                    pipe.zrem(qos.unacked_index_key, *tags).hdel(qos.unacked_key, *tags).execute()
            base_ack = super(type(qos), qos).ack
            for tag in tags:
                with contextlib.suppress(KeyError):  # a tag this channel no longer holds
                    base_ack(tag)

    class JobqRedisTransport(base_transport):  # type: ignore[misc]
        Channel = CountingChannel

    return JobqRedisTransport


class RedisBroker:
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
        # Takes that raised, by score: None until Redis answered a search for them, then the
        # time.monotonic() after which no search is needed any more.
        self._in_doubt: dict[float, float | None] = {}
        self._connection: Any = None
        self._channel: Any = None

    def publish(self, name: str, bodies: Sequence[bytes]) -> None:
        # One LPUSH for the whole batch: a published batch is all enqueued or none of it.
        self._open().publish_many(name, bodies)

    def get(self, name: str, limit: int, wait_s: int) -> list[BrokerMessage]:
        channel = self._open()
        if self._in_doubt:
            self._reclaim(channel)
        taken_at = time.time()
        try:
            taken = channel.get_many(name, limit, taken_at)
        except Exception:
            self._in_doubt[taken_at] = None  # it may run all the same once Redis answers
            raise
        found: list[BrokerMessage] = []
        for message in taken:
            tag = str(message.delivery_tag)
            count = int((message.headers or {}).get(_DELIVERY_COUNT_HEADER, 1))
            found.append(BrokerMessage(tag, tag, as_bytes(message.body), count))
        return found

    def ack(self, name: str, handles: Sequence[object]) -> None:
        self._open().ack_many([str(tag) for tag in handles])

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

    def waiting(self, name: str) -> tuple[int, float | None]:
        channel = self._open()
        with channel.conn_or_acquire() as client:
            # One round trip: the list's length and the message RPOP takes next (the oldest).
            length, oldest = client.pipeline(transaction=False).llen(name).lindex(name, -1).execute()
        return int(length), _age_s(oldest)

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

    def _reclaim(self, channel: Any) -> None:
        """Push back, at the head of their queues, the deliveries of takes whose reply was lost:
        nobody holds them, so they would otherwise wait out the visibility timeout."""
        now = time.monotonic()
        for score, until in list(self._in_doubt.items()):
            tags = channel.taken_at(score)
            for tag in tags:
                channel.qos.restore_by_tag(tag)  # RPUSH: the next one RPOP takes
            if tags:
                log.warning("pushed back %d deliveries taken by a call whose reply was lost", len(tags))
            if until is None:
                self._in_doubt[score] = now + _RECLAIM_WINDOW_S
            elif now > until:
                del self._in_doubt[score]

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


def _age_s(raw: bytes | str | None) -> float | None:
    """Seconds since the kombu payload `raw` was published, from jobq's header; None without one."""
    if raw is None:
        return None
    try:
        published_ms = json.loads(raw)["headers"][PUBLISHED_MS_HEADER]
    except (ValueError, KeyError, TypeError):
        return None  # published before jobq stamped messages, or by someone else
    if not isinstance(published_ms, int | float):
        return None
    return max(time.time() * 1000 - published_ms, 0) / 1000
