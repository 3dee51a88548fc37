"""The `Transport` contract, run against every backend.

A backend joins the suite by adding a factory to `BACKENDS`: a context manager that yields a
transport with the given visibility timeout and cleans up after it (a backend needing a server
skips when none is reachable). A test a backend genuinely cannot pass is listed in `UNSUPPORTED`
with the reason and the backend-specific test that proves the equivalent guarantee.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from moto_server import shared_moto_server
from services import require_rabbitmq, require_redis, unavailable
from sqlite_template import fresh_sqlite

from jobq.ports import Delivery, QueueDepth, Transport
from jobq.sqlitedb import SqliteDatabase
from jobq.transport.memory import MemoryTransport
from jobq.transport.sqlite import SqliteTransport

QUEUES = ["critical", "high", "default", "low"]

# Long enough that no test sees a redelivery it did not ask for.
DEFAULT_VISIBILITY_S = 30.0
# Short enough to keep redelivery tests fast, long enough to act on a delivery before it returns.
SHORT_VISIBILITY_S = 0.2


@contextlib.contextmanager
def memory_backend(tmp_path: Path, visibility_timeout_s: float) -> Iterator[Transport]:
    transport = MemoryTransport(visibility_timeout_s=visibility_timeout_s)
    yield transport
    transport.close()


@contextlib.contextmanager
def sqlite_backend(tmp_path: Path, visibility_timeout_s: float) -> Iterator[Transport]:
    db = SqliteDatabase(fresh_sqlite(tmp_path / "jobq.db"))
    transport = SqliteTransport(db, visibility_timeout_s=visibility_timeout_s)
    yield transport
    transport.close()
    db.close()


# --- kombu brokers: each test gets its own queue prefix on the shared server, deleted afterwards.

KOMBU_BROKERS = ("redis", "amqp", "sqs")


def broker_url(broker: str) -> str:
    """The URL of a reachable `broker` (skips locally, fails in CI, when there is none)."""
    try:
        import kombu  # noqa: F401
    except ImportError:
        unavailable("kombu is not installed: pip install 'jobq[redis]' or 'jobq[aws]'")
    if broker == "redis":
        return require_redis()
    if broker == "amqp":
        return require_rabbitmq()
    return shared_moto_server().sqs_url()


@contextlib.contextmanager
def broker_prefix(broker: str, url: str) -> Iterator[str]:
    """A fresh queue prefix; every queue and key under it is deleted afterwards."""
    prefix = f"test{secrets.token_hex(4)}"
    try:
        yield prefix
    finally:
        delete_broker_queues(broker, url, prefix)


def delete_broker_queues(broker: str, url: str, prefix: str) -> None:
    if broker == "redis":
        import redis

        with redis.Redis.from_url(url) as client:
            for key in client.scan_iter(match=f"{prefix}-*", count=1000):
                client.delete(key)
    elif broker == "amqp":
        import kombu

        with kombu.Connection(url) as connection:
            channel = connection.channel()
            for queue in (*QUEUES, *EXTRA_QUEUES):
                channel.queue_delete(f"{prefix}-{queue}")
    else:
        import boto3

        with contextlib.closing(boto3.client("sqs", **shared_moto_server().client_kwargs())) as sqs:
            for queue_url in sqs.list_queues(QueueNamePrefix=f"{prefix}-").get("QueueUrls", []):
                sqs.delete_queue(QueueUrl=queue_url)


# Queues some backend-specific tests use besides QUEUES (cleaned up on RabbitMQ, which needs names).
EXTRA_QUEUES = ("other",)


def kombu_backend(broker: str) -> BackendFactory:
    @contextlib.contextmanager
    def factory(tmp_path: Path, visibility_timeout_s: float) -> Iterator[Transport]:
        from jobq.transport.kombu import KombuTransport

        url = broker_url(broker)
        with broker_prefix(broker, url) as prefix:
            transport = KombuTransport(url, visibility_timeout_s=visibility_timeout_s, prefix=prefix)
            try:
                yield transport
            finally:
                transport.close()

    return factory


BackendFactory = Callable[[Path, float], contextlib.AbstractContextManager[Transport]]

BACKENDS: dict[str, BackendFactory] = {
    "memory": memory_backend,
    "sqlite": sqlite_backend,
    **{broker: kombu_backend(broker) for broker in KOMBU_BROKERS},
}

_NO_AMQP_TIMEOUT = (
    "AMQP 0-9-1 has no visibility timeout: RabbitMQ redelivers an unacked message only when its "
    "consumer's channel or connection closes"
)

# (backend, test) -> why the backend cannot run the test, and which test proves the equivalent.
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("amqp", "test_an_unacked_delivery_comes_back_after_the_visibility_timeout"): (
        f"{_NO_AMQP_TIMEOUT}; see test_kombu_transport.py::"
        "test_amqp_an_unacked_message_returns_to_another_consumer_when_the_connection_closes"
    ),
    ("amqp", "test_acking_a_stale_receipt_after_redelivery_keeps_the_redelivered_message"): (
        f"{_NO_AMQP_TIMEOUT}; see test_kombu_transport.py::"
        "test_amqp_a_receipt_from_a_dropped_connection_does_not_ack_the_redelivered_message"
    ),
    ("sqs", "test_concurrent_consumers_receive_each_message_exactly_once"): (
        "moto's SQS slows down quadratically with queue depth (1,000 messages take minutes), and SQS "
        "standard queues deliver at least once, not exactly once; see test_kombu_transport.py::"
        "test_sqs_concurrent_consumers_lose_nothing_and_ack_every_message (60 messages)"
    ),
}


@pytest.fixture
def visibility_timeout_s() -> float:
    """Overridden per test with `@pytest.mark.parametrize("visibility_timeout_s", [...])`."""
    return DEFAULT_VISIBILITY_S


@pytest.fixture(params=list(BACKENDS))
def transport(request: pytest.FixtureRequest, tmp_path: Path, visibility_timeout_s: float) -> Iterator[Transport]:
    reason = UNSUPPORTED.get((request.param, request.node.originalname))
    if reason is not None:
        pytest.skip(reason)
    with BACKENDS[request.param](tmp_path, visibility_timeout_s) as transport:
        yield transport


short_visibility = pytest.mark.parametrize("visibility_timeout_s", [SHORT_VISIBILITY_S])


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [d.body for d in deliveries]


def consume_one(transport: Transport, queues: list[str], wait_s: float = 0.0) -> Delivery:
    deliveries = transport.consume(queues, max_messages=1, wait_s=wait_s)
    assert len(deliveries) == 1, deliveries
    return deliveries[0]


# --- publish and consume


def test_publish_then_consume_returns_the_body(transport: Transport) -> None:
    transport.publish("default", [b"hello"])

    delivery = consume_one(transport, ["default"])

    assert delivery.queue == "default"
    assert delivery.body == b"hello"
    assert delivery.delivery_count == 1


def test_a_queue_is_consumed_in_publish_order(transport: Transport) -> None:
    transport.publish("default", [b"1", b"2", b"3"])
    transport.publish("default", [b"4", b"5"])

    assert bodies(transport.consume(["default"], max_messages=10, wait_s=0)) == [b"1", b"2", b"3", b"4", b"5"]


def test_messages_of_another_queue_are_not_consumed(transport: Transport) -> None:
    transport.publish("high", [b"h"])

    assert transport.consume(["default"], max_messages=10, wait_s=0) == []


def test_earlier_queues_are_drained_before_later_ones(transport: Transport) -> None:
    transport.publish("low", [b"low-1", b"low-2"])
    transport.publish("critical", [b"critical-1"])

    first = consume_one(transport, QUEUES)
    second = consume_one(transport, QUEUES)

    assert (first.queue, first.body) == ("critical", b"critical-1")
    assert (second.queue, second.body) == ("low", b"low-1")


def test_a_batch_takes_every_visible_message_of_an_earlier_queue_before_a_later_one(transport: Transport) -> None:
    transport.publish("low", [b"low-1", b"low-2"])
    transport.publish("critical", [b"critical-1", b"critical-2"])

    deliveries = transport.consume(QUEUES, max_messages=3, wait_s=0)

    assert [(d.queue, d.body) for d in deliveries] == [
        ("critical", b"critical-1"),
        ("critical", b"critical-2"),
        ("low", b"low-1"),
    ]


def test_a_message_published_to_an_earlier_queue_overtakes_the_backlog_of_a_later_one(transport: Transport) -> None:
    transport.publish("low", [b"low-1", b"low-2", b"low-3"])
    assert consume_one(transport, QUEUES).body == b"low-1"

    transport.publish("high", [b"high-1"])
    transport.publish("critical", [b"critical-1"])

    assert bodies(transport.consume(QUEUES, max_messages=1, wait_s=0)) == [b"critical-1"]
    assert bodies(transport.consume(QUEUES, max_messages=1, wait_s=0)) == [b"high-1"]
    assert bodies(transport.consume(QUEUES, max_messages=1, wait_s=0)) == [b"low-2"]


def test_a_consumer_of_low_only_never_sees_critical(transport: Transport) -> None:
    transport.publish("critical", [b"critical-1"])
    transport.publish("low", [b"low-1"])

    deliveries = transport.consume(["low"], max_messages=10, wait_s=0)

    assert [(d.queue, d.body) for d in deliveries] == [("low", b"low-1")]
    assert transport.consume(["low"], max_messages=10, wait_s=0) == []


def test_consume_returns_at_most_max_messages(transport: Transport) -> None:
    transport.publish("default", [str(i).encode() for i in range(10)])

    assert bodies(transport.consume(["default"], max_messages=3, wait_s=0)) == [b"0", b"1", b"2"]
    assert bodies(transport.consume(["default"], max_messages=3, wait_s=0)) == [b"3", b"4", b"5"]


def test_each_delivery_has_its_own_receipt(transport: Transport) -> None:
    transport.publish("default", [b"a", b"b", b"c"])

    deliveries = transport.consume(["default"], max_messages=3, wait_s=0)

    assert len({d.receipt for d in deliveries}) == 3


# --- visibility timeout, ack, nack, extend


def test_a_delivery_is_invisible_to_other_consumers_until_its_timeout(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    consume_one(transport, ["default"])

    assert transport.consume(["default"], max_messages=1, wait_s=0) == []


@short_visibility
def test_an_unacked_delivery_comes_back_after_the_visibility_timeout(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    first = consume_one(transport, ["default"])

    again = consume_one(transport, ["default"], wait_s=SHORT_VISIBILITY_S * 10)

    assert again.body == b"job"
    assert again.delivery_count == 2
    assert again.receipt != first.receipt


@short_visibility
def test_an_acked_message_never_comes_back(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    transport.ack([consume_one(transport, ["default"])])

    assert transport.consume(["default"], max_messages=1, wait_s=SHORT_VISIBILITY_S * 2) == []
    assert transport.depth("default") == 0


@short_visibility
def test_acking_a_stale_receipt_after_redelivery_keeps_the_redelivered_message(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    stale = consume_one(transport, ["default"])
    current = consume_one(transport, ["default"], wait_s=SHORT_VISIBILITY_S * 10)

    transport.ack([stale])

    assert transport.depth("default") == 1
    transport.ack([current])
    assert transport.depth("default") == 0


def test_acking_twice_is_harmless(transport: Transport) -> None:
    transport.publish("default", [b"job", b"other"])
    delivery = consume_one(transport, ["default"])

    transport.ack([delivery])
    transport.ack([delivery])

    assert transport.depth("default") == 1


def test_a_nacked_message_is_delivered_again_at_once(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    transport.nack([consume_one(transport, ["default"])])

    again = consume_one(transport, ["default"])

    assert again.body == b"job"
    assert again.delivery_count == 2


def test_a_nacked_message_stays_invisible_for_the_delay(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    transport.nack([consume_one(transport, ["default"])], delay_s=0.3)

    assert transport.consume(["default"], max_messages=1, wait_s=0.1) == []
    assert consume_one(transport, ["default"], wait_s=3.0).body == b"job"


def test_a_receipt_stops_working_once_nacked(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    delivery = consume_one(transport, ["default"])
    transport.nack([delivery], delay_s=30)

    transport.ack([delivery])

    assert transport.depth("default") == 1


@short_visibility
def test_extend_keeps_a_delivery_invisible_past_the_original_timeout(transport: Transport) -> None:
    transport.publish("default", [b"job"])
    delivery = consume_one(transport, ["default"])

    transport.extend([delivery], visibility_s=2.0)

    assert transport.consume(["default"], max_messages=1, wait_s=SHORT_VISIBILITY_S * 3) == []
    transport.ack([delivery])
    assert transport.depth("default") == 0


# --- depth


def test_depth_counts_visible_and_in_flight_messages_until_acked(transport: Transport) -> None:
    assert transport.depth("default") == 0
    transport.publish("default", [b"a", b"b", b"c"])
    transport.publish("low", [b"elsewhere"])

    delivery = consume_one(transport, ["default"])
    assert transport.depth("default") == 3

    transport.ack([delivery])
    assert transport.depth("default") == 2


# --- queue_depth: the backlog signal for gauges and autoscaling

# Brokers that cannot tell a waiting message's age without consuming it (see jobq.transport.kombu).
AGE_UNKNOWN = frozenset({"amqp", "sqs"})


def test_queue_depth_of_an_empty_queue_is_zero_with_no_age(transport: Transport) -> None:
    assert transport.queue_depth("default") == QueueDepth(0, None)


def test_queue_depth_counts_waiting_messages_but_not_those_in_flight_or_delayed(transport: Transport) -> None:
    transport.publish("default", [b"a", b"b", b"c", b"d"])
    transport.publish("low", [b"elsewhere"])
    assert transport.queue_depth("default").waiting == 4

    taken = transport.consume(["default"], max_messages=2, wait_s=0)
    assert len(taken) == 2
    assert transport.queue_depth("default").waiting == 2

    transport.nack([taken[0]], delay_s=30)
    transport.ack([taken[1]])
    assert transport.queue_depth("default").waiting == 2
    assert transport.queue_depth("low").waiting == 1


def test_queue_depth_tells_the_age_of_the_oldest_waiting_message_where_the_broker_can(
    transport: Transport, request: pytest.FixtureRequest
) -> None:
    transport.publish("default", [b"old"])
    time.sleep(0.35)  # let the first message age; the bound below is a floor, not a timing
    transport.publish("default", [b"new"])

    depth = transport.queue_depth("default")

    assert depth.waiting == 2
    if request.node.callspec.params["transport"] in AGE_UNKNOWN:
        assert depth.oldest_age_s is None
    else:
        assert depth.oldest_age_s is not None
        assert 0.3 <= depth.oldest_age_s < 60


# --- waiting


def test_consume_on_empty_queues_returns_nothing_after_about_wait_s(transport: Transport) -> None:
    started = time.monotonic()

    deliveries = transport.consume(QUEUES, max_messages=1, wait_s=0.3)

    elapsed = time.monotonic() - started
    assert deliveries == []
    assert 0.25 <= elapsed < 1.0


def test_consume_returns_early_when_a_message_is_published_from_another_thread(transport: Transport) -> None:
    publisher = threading.Timer(0.1, transport.publish, args=("low", [b"late"]))
    started = time.monotonic()
    publisher.start()
    try:
        deliveries = transport.consume(QUEUES, max_messages=1, wait_s=5.0)
    finally:
        publisher.join()

    assert bodies(deliveries) == [b"late"]
    # Early: long before the 5 s wait is out. Not within 1 s: a poll of several queues backs off
    # up to the poll interval, and moto's SQS answered a loaded CI machine's polls in 1.04 s.
    assert time.monotonic() - started < 2.5


# --- concurrency


def test_concurrent_consumers_receive_each_message_exactly_once(transport: Transport) -> None:
    sent = [f"m{i}".encode() for i in range(1_000)]
    for start in range(0, len(sent), 100):
        transport.publish("default", sent[start : start + 100])
    received: list[list[bytes]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def drain(mine: list[bytes]) -> None:
        try:
            while deliveries := transport.consume(["default"], max_messages=10, wait_s=0.2):
                mine.extend(bodies(deliveries))
                transport.ack(deliveries)
        except BaseException as exc:  # surfaced by the assertion below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(mine,)) for mine in received]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    everything = [body for mine in received for body in mine]
    assert sorted(everything) == sorted(sent)
    assert transport.depth("default") == 0
