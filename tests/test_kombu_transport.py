"""The kombu transports against their real servers: what the contract suite cannot show.

Redelivery after `kill -9`, reconnects after a dropped connection, liveness, error translation,
SQS batching and queue attributes, and the RabbitMQ tests that stand in for the contract tests
RabbitMQ cannot run (it has no visibility timeout). Each test gets its own queue prefix; the
queues and keys under it are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from contract.test_transport import KOMBU_BROKERS, QUEUES, broker_prefix, broker_url
from moto_server import shared_moto_server
from services import free_port

from jobq.errors import ConfigError, TransportError, TransportUnavailable

if TYPE_CHECKING:
    from jobq.transport.kombu import KombuTransport


@dataclass
class Broker:
    """A reachable broker and a queue prefix of this test's own."""

    name: str
    url: str
    prefix: str
    transports: list[KombuTransport] = field(default_factory=list)

    def transport(self, visibility_timeout_s: float = 30.0, **kwargs: Any) -> KombuTransport:
        """A transport on this prefix (several may share it), closed at teardown."""
        from jobq.transport.kombu import KombuTransport

        transport = KombuTransport(self.url, visibility_timeout_s=visibility_timeout_s, prefix=self.prefix, **kwargs)
        self.transports.append(transport)
        return transport


def open_broker(name: str) -> Iterator[Broker]:
    url = broker_url(name)
    with broker_prefix(name, url) as prefix:
        broker = Broker(name, url, prefix)
        try:
            yield broker
        finally:
            for transport in broker.transports:
                transport.close()


@pytest.fixture(params=KOMBU_BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    yield from open_broker(request.param)


@pytest.fixture
def redis_broker() -> Iterator[Broker]:
    yield from open_broker("redis")


@pytest.fixture
def amqp_broker() -> Iterator[Broker]:
    yield from open_broker("amqp")


@pytest.fixture
def sqs_broker() -> Iterator[Broker]:
    yield from open_broker("sqs")


def drain(transport: KombuTransport, queues: list[str], batch: int = 10) -> list[bytes]:
    """Consume and ack until the queues are empty; the bodies in the order received."""
    received: list[bytes] = []
    while deliveries := transport.consume(queues, max_messages=batch, wait_s=0):
        received.extend(d.body for d in deliveries)
        transport.ack(deliveries)
    return received


# --- every broker


def test_bodies_are_binary_safe(broker: Broker) -> None:
    transport = broker.transport()
    body = bytes(range(256)) + b"\x00" + "é€𝄞".encode()

    transport.publish("default", [body, b""])

    assert [d.body for d in transport.consume(["default"], max_messages=2, wait_s=0)] == [body, b""]


def test_strict_priority_drains_every_earlier_queue_before_a_later_one(broker: Broker) -> None:
    transport = broker.transport()
    for queue in reversed(QUEUES):  # the lowest tier is published first and is deepest
        transport.publish(queue, [f"{queue}-{i}".encode() for i in range(12 - 3 * QUEUES.index(queue))])
    expected = [f"{queue}-{i}".encode() for queue in QUEUES for i in range(12 - 3 * QUEUES.index(queue))]

    received = drain(transport, QUEUES, batch=5)

    assert received == expected


def test_close_hands_back_unacked_deliveries_at_once(broker: Broker) -> None:
    first, second = broker.transport(), broker.transport()
    first.publish("default", [b"job"])
    assert [d.body for d in first.consume(["default"], max_messages=1, wait_s=0)] == [b"job"]

    first.close()

    [again] = second.consume(["default"], max_messages=1, wait_s=2.0)
    assert (again.body, again.delivery_count) == (b"job", 2)


def test_health_check_fails_once_the_consumer_stops_consuming(broker: Broker) -> None:
    transport = broker.transport()
    assert not transport.health_check(max_silence_s=60)  # never consumed
    assert transport.consume_silence_s is None

    transport.consume(QUEUES, max_messages=1, wait_s=0)
    assert transport.health_check(max_silence_s=60)
    time.sleep(0.3)
    assert not transport.health_check(max_silence_s=0.2)

    transport.consume(QUEUES, max_messages=1, wait_s=0)
    assert transport.health_check(max_silence_s=0.2)
    transport.close()
    assert not transport.health_check(max_silence_s=60)


def test_closed_transports_raise_transport_unavailable(broker: Broker) -> None:
    transport = broker.transport()
    transport.close()
    transport.close()

    with pytest.raises(TransportUnavailable):
        transport.publish("default", [b"job"])


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:{port}/0",
        "amqp://guest:s3cret@127.0.0.1:{port}//",
        "sqs://key:s3cret@127.0.0.1:{port}?region=us-east-1",
    ],
    ids=KOMBU_BROKERS,
)
def test_an_unreachable_broker_raises_transport_unavailable_and_fails_the_health_check(url: str) -> None:
    from jobq.transport.kombu import KombuTransport

    # botocore would retry for seconds; one attempt each is enough to see the translation.
    options = {"client-config": {"retries": {"total_max_attempts": 1}}} if url.startswith("sqs") else {}
    transport = KombuTransport(url.format(port=free_port()), transport_options=options, connect_retries=0)
    try:
        with pytest.raises(TransportUnavailable) as raised:
            transport.consume(QUEUES, max_messages=1, wait_s=0)
        assert raised.value.retryable
        assert "s3cret" not in str(raised.value)
        assert not transport.health_check(max_silence_s=60)
    finally:
        transport.close()


def test_configuration_errors_are_config_errors() -> None:
    from jobq.transport.kombu import KombuTransport

    with pytest.raises(ConfigError):
        KombuTransport("kafka://127.0.0.1:9092")
    with pytest.raises(ConfigError):
        KombuTransport("redis://127.0.0.1:6379/0", prefix="jobq:prod")
    with pytest.raises(ConfigError):
        KombuTransport("redis://127.0.0.1:6379/0", visibility_timeout_s=0)
    with pytest.raises(ConfigError):
        KombuTransport("sqs://", visibility_timeout_s=43_201)


# --- a consumer killed with kill -9 before it acks

# Takes one message, reports it, then hangs without acking until killed.
TAKE_ONE_AND_HANG = """
import sys, time
from jobq.transport.kombu import KombuTransport

url, prefix, visibility_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
transport = KombuTransport(url, prefix=prefix, visibility_timeout_s=visibility_s)
[delivery] = transport.consume(["default"], max_messages=1, wait_s=20)
print(delivery.body.decode(), delivery.delivery_count, flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_consumer_killed_before_acking_has_its_message_redelivered(broker: Broker) -> None:
    visibility_s = 2.0
    transport = broker.transport(visibility_timeout_s=visibility_s)
    transport.publish("default", [b"job"])
    consumer = subprocess.Popen(
        [sys.executable, "-c", TAKE_ONE_AND_HANG, broker.url, broker.prefix, str(visibility_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert read_line(consumer, timeout_s=30) == "job 1"
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(timeout=10)
        if broker.name != "amqp":
            # Redis and SQS hold the message until its visibility timeout ends.
            assert transport.consume(["default"], max_messages=1, wait_s=0) == []
        # RabbitMQ requeues it as soon as it sees the dead consumer's socket close.
        [again] = transport.consume(["default"], max_messages=1, wait_s=visibility_s * 4)
    finally:
        if consumer.poll() is None:
            consumer.kill()
        consumer.communicate(timeout=10)

    assert (again.body, again.delivery_count) == (b"job", 2)
    transport.ack([again])
    assert transport.depth("default") == 0


def read_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        process.kill()
        _, stderr = process.communicate(timeout=10)
        pytest.fail(f"consumer printed nothing within {timeout_s} s; stderr:\n{stderr}")
    return process.stdout.readline().strip()


# --- Redis


def kill_redis_connections(broker: Broker) -> int:
    """Kill, on the server, every connection the transports of `broker` opened (they are named
    after the prefix); how many were killed."""
    import redis

    with redis.Redis.from_url(broker.url) as admin:
        ids = [client["id"] for client in admin.client_list() if client.get("name") == broker.prefix]
        for client_id in ids:
            admin.client_kill_filter(_id=client_id)
    return len(ids)


def test_redis_reconnects_after_its_connection_is_killed_losing_and_duplicating_nothing(redis_broker: Broker) -> None:
    transport = redis_broker.transport(visibility_timeout_s=2.0)
    transport.publish("default", [b"a", b"b", b"c"])
    [held] = transport.consume(["default"], max_messages=1, wait_s=0)

    assert kill_redis_connections(redis_broker) >= 1
    transport.publish("default", [b"d"])
    received = drain(transport, ["default"])
    transport.ack([held])  # its receipt outlives the connection: the delivery is Redis state

    assert [held.body, *received] == [b"a", b"b", b"c", b"d"]
    assert transport.consume(["default"], max_messages=10, wait_s=2.5) == []  # past the timeout: nothing back
    assert transport.depth("default") == 0


def test_redis_counts_every_delivery_of_a_message(redis_broker: Broker) -> None:
    transport = redis_broker.transport(visibility_timeout_s=0.3)
    transport.publish("default", [b"job"])

    counts = []
    for _ in range(3):  # nacked twice, then left to time out
        [delivery] = transport.consume(["default"], max_messages=1, wait_s=0)
        counts.append(delivery.delivery_count)
        if len(counts) < 3:
            transport.nack([delivery])
    [last] = transport.consume(["default"], max_messages=1, wait_s=3.0)

    assert [*counts, last.delivery_count] == [1, 2, 3, 4]


def test_redis_keeps_a_nack_delay_in_redis_for_every_consumer(redis_broker: Broker) -> None:
    first, second = redis_broker.transport(visibility_timeout_s=2.0), redis_broker.transport(visibility_timeout_s=2.0)
    first.publish("default", [b"job"])
    first.nack(first.consume(["default"], max_messages=1, wait_s=0), delay_s=1.0)

    assert second.consume(["default"], max_messages=1, wait_s=0.5) == []
    [again] = second.consume(["default"], max_messages=1, wait_s=3.0)
    assert (again.body, again.delivery_count) == (b"job", 2)


def test_redis_extend_keeps_a_delivery_from_every_consumer(redis_broker: Broker) -> None:
    first, second = redis_broker.transport(visibility_timeout_s=0.5), redis_broker.transport(visibility_timeout_s=0.5)
    first.publish("default", [b"job"])
    [delivery] = first.consume(["default"], max_messages=1, wait_s=0)

    first.extend([delivery], visibility_s=3.0)

    assert second.consume(["default"], max_messages=1, wait_s=1.5) == []
    first.ack([delivery])
    assert first.depth("default") == 0


def test_redis_a_take_whose_reply_is_lost_in_a_stall_comes_back_at_once(tmp_path: Path) -> None:
    """Redis is stopped (SIGSTOP) while a consume waits for its reply; the client gives up after
    its socket timeout, and Redis runs the command when it resumes. The deliveries it took are
    pushed back as soon as Redis answers again, instead of being popped and lost until the
    reaper's schedule-to-start repair (5 minutes by default: the stalled-Redis fault test)."""
    import os

    from private_redis import PrivateRedis

    from jobq.transport.kombu import KombuTransport

    server = PrivateRedis(tmp_path)
    server.start()
    transport = KombuTransport(server.url, visibility_timeout_s=300.0, transport_options={"socket_timeout": 0.5})
    try:
        assert transport.consume(["default"], max_messages=1, wait_s=0) == []  # its periodic restore is done
        transport.publish("default", [b"job"])
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(TransportUnavailable):
                transport.consume(["default"], max_messages=1, wait_s=0)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        found = []
        deadline = time.monotonic() + 5
        while not found and time.monotonic() < deadline:
            found = transport.consume(["default"], max_messages=1, wait_s=0.2)
        assert [(d.body, d.delivery_count) for d in found] == [(b"job", 2)]
        transport.ack(found)
        assert transport.depth("default") == 0
    finally:
        transport.close()
        server.stop()


# --- RabbitMQ


def drop_amqp_socket(transport: KombuTransport) -> None:
    """Cut the transport's TCP connection under it, as a network failure would."""
    connection = transport._broker._connection  # type: ignore[attr-defined]
    connection.connection.sock.shutdown(socket.SHUT_RDWR)


def test_amqp_an_unacked_message_returns_to_another_consumer_when_the_connection_closes(amqp_broker: Broker) -> None:
    first, second = amqp_broker.transport(), amqp_broker.transport()
    first.publish("default", [b"job"])
    assert [d.body for d in first.consume(["default"], max_messages=1, wait_s=0)] == [b"job"]
    assert second.consume(["default"], max_messages=1, wait_s=0.3) == []  # no timeout: held while connected

    drop_amqp_socket(first)

    [again] = second.consume(["default"], max_messages=1, wait_s=5.0)
    assert (again.body, again.delivery_count) == (b"job", 2)


def test_amqp_a_receipt_from_a_dropped_connection_does_not_ack_the_redelivered_message(amqp_broker: Broker) -> None:
    transport = amqp_broker.transport()
    transport.publish("default", [b"job"])
    [stale] = transport.consume(["default"], max_messages=1, wait_s=0)

    drop_amqp_socket(transport)
    [current] = transport.consume(["default"], max_messages=1, wait_s=5.0)  # reconnects; the broker requeued it
    transport.ack([stale])

    assert (current.body, current.delivery_count) == (b"job", 2)
    assert transport.depth("default") == 1
    transport.ack([current])
    assert transport.depth("default") == 0


def test_amqp_reconnects_after_its_connection_drops_losing_nothing(amqp_broker: Broker) -> None:
    transport = amqp_broker.transport()
    transport.publish("default", [b"a", b"b"])
    [held] = transport.consume(["default"], max_messages=1, wait_s=0)

    drop_amqp_socket(transport)
    transport.publish("default", [b"c"])  # reconnects
    transport.ack([held])  # its channel died: a no-op, the broker requeued it

    assert sorted(drain(transport, ["default"])) == [b"a", b"b", b"c"]
    assert transport.depth("default") == 0


def test_amqp_a_publish_to_a_queue_deleted_behind_its_back_is_not_lost(amqp_broker: Broker) -> None:
    import kombu

    transport = amqp_broker.transport()
    transport.publish("default", [b"before"])  # declares the queue, which the transport then remembers
    with kombu.Connection(amqp_broker.url) as admin:
        admin.channel().queue_delete(f"{amqp_broker.prefix}-default")

    transport.publish("default", [b"after"])  # returned as unroutable, declared again, published again

    assert drain(transport, ["default"]) == [b"after"]


def test_amqp_extend_keeps_a_heartbeating_connection_and_its_deliveries_alive(amqp_broker: Broker) -> None:
    from jobq.transport.kombu import KombuTransport

    busy = KombuTransport(f"{amqp_broker.url}?heartbeat=1", prefix=amqp_broker.prefix)
    amqp_broker.transports.append(busy)
    other = amqp_broker.transport()
    busy.publish("default", [b"job"])
    [delivery] = busy.consume(["default"], max_messages=1, wait_s=0)

    for _ in range(8):  # 3 s without consuming: RabbitMQ drops a silent connection after 2 s
        busy.extend([delivery], visibility_s=30)
        time.sleep(0.4)

    assert other.consume(["default"], max_messages=1, wait_s=0) == []
    busy.ack([delivery])
    assert other.depth("default") == 0


def test_amqp_wrong_credentials_raise_a_non_retryable_transport_error(amqp_broker: Broker) -> None:
    from jobq.transport.kombu import KombuTransport

    url = amqp_broker.url.replace("guest:guest@", "guest:wrong-password@")
    assert url != amqp_broker.url
    transport = KombuTransport(url, prefix=amqp_broker.prefix)
    try:
        with pytest.raises(TransportError) as raised:
            transport.publish("default", [b"job"])
        assert not raised.value.retryable
        assert "wrong-password" not in str(raised.value)
    finally:
        transport.close()


def test_amqp_a_nack_delay_holds_the_message_from_other_consumers(amqp_broker: Broker) -> None:
    first, second = amqp_broker.transport(), amqp_broker.transport()
    first.publish("default", [b"job"])
    first.nack(first.consume(["default"], max_messages=1, wait_s=0), delay_s=0.5)

    assert second.consume(["default"], max_messages=1, wait_s=0.3) == []
    assert first.consume(["other"], max_messages=1, wait_s=0.4) == []  # any consume requeues what is due
    [again] = second.consume(["default"], max_messages=1, wait_s=2.0)
    assert (again.body, again.delivery_count) == (b"job", 2)


# --- SQS


@pytest.fixture
def sqs_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Every SQS API call made from now on, as (operation, parameters)."""
    from botocore.client import BaseClient

    calls: list[tuple[str, dict[str, Any]]] = []
    make_api_call = BaseClient._make_api_call

    def counting(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        calls.append((operation, params))
        return make_api_call(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", counting)
    return calls


def sqs_client() -> contextlib.closing[Any]:
    import boto3

    return contextlib.closing(boto3.client("sqs", **shared_moto_server().client_kwargs()))


def test_sqs_sends_and_deletes_in_batches_of_ten(
    sqs_broker: Broker, sqs_calls: list[tuple[str, dict[str, Any]]]
) -> None:
    transport = sqs_broker.transport()
    sent = [f"m{i}".encode() for i in range(25)]
    transport.depth("default")  # creates the queue, so only message calls are counted below
    sqs_calls.clear()

    transport.publish("default", sent)
    deliveries = []
    while batch := transport.consume(["default"], max_messages=25, wait_s=0):
        deliveries.extend(batch)
    transport.ack(deliveries)

    operations = Counter(operation for operation, _ in sqs_calls)
    assert operations["SendMessageBatch"] == 3
    assert operations["DeleteMessageBatch"] == 3
    assert operations["SendMessage"] == operations["DeleteMessage"] == 0
    assert sorted(d.body for d in deliveries) == sorted(sent)
    assert transport.depth("default") == 0


def test_sqs_sets_its_visibility_timeout_on_new_and_existing_queues(sqs_broker: Broker) -> None:
    with sqs_client() as sqs:
        existing = sqs.create_queue(QueueName=f"{sqs_broker.prefix}-default", Attributes={"VisibilityTimeout": "300"})
        transport = sqs_broker.transport(visibility_timeout_s=6.5)  # rounded up to whole seconds

        transport.publish("default", [b"job"])
        transport.publish("critical", [b"job"])

        created = sqs.get_queue_url(QueueName=f"{sqs_broker.prefix}-critical")
        for queue_url in (existing["QueueUrl"], created["QueueUrl"]):
            attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["VisibilityTimeout"])
            assert attributes["Attributes"]["VisibilityTimeout"] == "7"


def test_sqs_an_idle_consumer_of_one_queue_long_polls(
    sqs_broker: Broker, sqs_calls: list[tuple[str, dict[str, Any]]]
) -> None:
    transport = sqs_broker.transport()
    transport.depth("default")
    sqs_calls.clear()

    assert transport.consume(["default"], max_messages=1, wait_s=2.0) == []

    receives = [params for operation, params in sqs_calls if operation == "ReceiveMessage"]
    assert receives[0]["WaitTimeSeconds"] == 2
    assert len(receives) <= 2


def test_sqs_concurrent_consumers_lose_nothing_and_ack_every_message(sqs_broker: Broker) -> None:
    # SQS standard queues are at-least-once (and moto's receive is not atomic across concurrent
    # requests), so a message may reach two consumers; the contract suite's exactly-once
    # assertion becomes: every message received, and every one deleted.
    transport = sqs_broker.transport()
    sent = [f"m{i}".encode() for i in range(60)]
    transport.publish("default", sent)
    received: list[list[bytes]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def consume_into(mine: list[bytes]) -> None:
        try:
            while deliveries := transport.consume(["default"], max_messages=5, wait_s=0):
                mine.extend(d.body for d in deliveries)
                transport.ack(deliveries)
        except BaseException as exc:  # surfaced by the assertion below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=consume_into, args=(mine,)) for mine in received]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert {body for mine in received for body in mine} == set(sent)
    assert transport.depth("default") == 0
