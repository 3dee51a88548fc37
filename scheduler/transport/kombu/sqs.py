"""The SQS broker behind `KombuTransport` (`sqs://`): kombu for the connection, boto3 for batches.

kombu resolves the endpoint, region and credentials, builds the boto3 client and creates queues
(honouring its `predefined_queues`, `sqs-creation-attributes` and `queue_tags` options); jobq
then talks to that client directly, because kombu sends one message per call and deletes one per
ack where SQS takes ten: SendMessageBatch, ReceiveMessage of up to 10, DeleteMessageBatch and
ChangeMessageVisibilityBatch.

Bodies travel base64-encoded (SQS bodies must be XML-safe text). Standard queues only: SQS
orders messages on a best-effort basis and may, rarely, deliver one twice; jobq's fences make
both harmless. A short poll (`WaitTimeSeconds=0`) samples a subset of SQS's servers and can come
back empty while a queue holds messages, so strict priority is strict within what each poll sees.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ipaddress
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from jobq.errors import ConfigError, TransportError, TransportUnavailable
from jobq.transport.kombu.broker import BrokerMessage, KombuConnection, quietly, translate_kombu_error

# SQS limits: 10 entries per batch call, 256 KiB per batch (AWS has raised the message limit to
# 1 MiB, but older regions and emulators keep 256 KiB), visibility timeouts in whole seconds up
# to 12 hours, long polls of up to 20 s.
_BATCH_ENTRIES = 10
_BATCH_BYTES = 256 * 1024
_MAX_VISIBILITY_S = 43_200

# Batch entries that failed for these reasons are about a receipt that no longer names a
# delivery (acked, redelivered, or visible again): the call asked for nothing that still exists.
_STALE_RECEIPT = frozenset(
    {"ReceiptHandleIsInvalid", "AWS.SimpleQueueService.MessageNotInflight", "MessageNotInflight"}
)
_QUEUE_GONE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
_THROTTLED = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "KmsThrottled",
        "AWS.SimpleQueueService.RequestThrottled",
    }
)
_LOOPBACK_NAMES = frozenset({"localhost"})


class SqsBroker:
    """One SQS queue per jobq queue; see `jobq.transport.kombu` for the semantics."""

    thread_safe = True  # boto3 clients are; the queue-URL cache has its own lock
    long_poll = True
    # Every ReceiveMessage is billed: idle multi-queue consumers poll at most 4 times a second.
    default_poll_interval_s = 0.25

    def __init__(self, url: str, options: Mapping[str, Any], visibility_timeout_s: float, connect_retries: int) -> None:
        self._visibility_s = _whole_seconds("visibility_timeout_s", visibility_timeout_s)
        host = urlsplit(url).hostname
        options = dict(options)
        if host is not None and "is_secure" not in options:
            # A local endpoint (moto, LocalStack, ElasticMQ) speaks plain HTTP on loopback.
            options["is_secure"] = not _is_loopback(host)
        # kombu applies this only to queues it creates; `_queue` sets it on existing ones too.
        options["visibility_timeout"] = self._visibility_s
        self._url = url
        self._options = options
        self._retries = connect_retries
        self._lock = threading.Lock()
        self._connection: Any = None
        self._channel: Any = None
        self._urls: dict[str, str] = {}
        self._clients: dict[str, Any] = {}

    def publish(self, name: str, bodies: Sequence[bytes]) -> None:
        url, client = self._queue(name)
        for chunk in _chunks(bodies):
            entries = [
                {"Id": str(i), "MessageBody": base64.b64encode(body).decode("ascii")} for i, body in enumerate(chunk)
            ]
            self._batch(client.send_message_batch, url, entries, action="send to", ignore=frozenset())

    def get(self, name: str, limit: int, wait_s: int) -> list[BrokerMessage]:
        url, client = self._queue(name)
        found: list[BrokerMessage] = []
        wait_s = min(max(wait_s, 0), 20)
        while len(found) < limit:
            response = client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=min(_BATCH_ENTRIES, limit - len(found)),
                WaitTimeSeconds=wait_s,
                # The queue's attribute says the same; passing it keeps jobq's timeout even if
                # someone changes the queue.
                VisibilityTimeout=self._visibility_s,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
            messages = response.get("Messages", [])
            if not messages:
                break
            wait_s = 0  # the queue had messages: drain what is left without waiting
            for message in messages:
                count = int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))
                found.append(BrokerMessage(message["ReceiptHandle"], message["MessageId"], _decode(message), count))
        return found

    def ack(self, name: str, handles: Sequence[object]) -> None:
        url, client = self._queue(name)
        for chunk in _chunks_of(handles):
            entries = [{"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(chunk)]
            self._batch(client.delete_message_batch, url, entries, action="delete from", ignore=_STALE_RECEIPT)

    def requeue(self, name: str, handles: Sequence[object], delay_s: float) -> None:
        self._change_visibility(name, handles, delay_s)

    def extend(self, name: str, handles: Sequence[object], visibility_s: float) -> None:
        self._change_visibility(name, handles, visibility_s)

    def depth(self, name: str) -> int:
        url, client = self._queue(name)
        attributes = client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def waiting(self, name: str) -> tuple[int, float | None]:
        url, client = self._queue(name)
        attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        return int(attributes["Attributes"]["ApproximateNumberOfMessages"]), None

    def maintain(self) -> None:
        """Nothing: SQS returns overdue messages by itself."""

    def translate(self, exc: Exception) -> tuple[TransportError, bool] | None:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            NoRegionError,
            ParamValidationError,
            PartialCredentialsError,
        )
        from kombu.transport.SQS.exceptions import UndefinedQueueException

        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code in _QUEUE_GONE:  # deleted under us: forget its URL, create it again on retry
                return TransportUnavailable(str(exc)), True
            if code in _THROTTLED or status >= 500:
                return TransportUnavailable(str(exc)), False
            return TransportError(str(exc)), False
        bad_config = NoCredentialsError | PartialCredentialsError | NoRegionError | ParamValidationError
        if isinstance(exc, bad_config | UndefinedQueueException):
            return TransportError(str(exc)), False
        if isinstance(exc, BotoCoreError | OSError):  # endpoint unreachable, timeouts, closed connections
            return TransportUnavailable(str(exc)), False
        return translate_kombu_error(exc)

    def reset(self) -> None:
        with self._lock:
            self._urls.clear()

    def close(self, held: Mapping[str, Sequence[object]]) -> None:
        for name, handles in held.items():
            with quietly(f"hand back deliveries of {name}"):
                self._change_visibility(name, handles, 0)
        with self._lock:
            for client in self._clients.values():
                with quietly("close an SQS client"):
                    client.close()
            self._clients.clear()
            if self._connection is not None:
                with quietly("close the SQS connection"):
                    self._connection.release()
            self._channel = self._connection = None

    def _queue(self, name: str) -> tuple[str, Any]:
        """The queue's URL and client; on first use, the queue is created if absent and given
        jobq's visibility timeout."""
        with self._lock:
            url = self._urls.get(name)
            if url is not None:
                return url, self._clients[name]
            channel = self._open()
            url = channel._new_queue(name)  # kombu's resolve-or-create, with its caching and options
            client = channel.sqs(queue=channel.canonical_queue_name(name))
            client.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": str(self._visibility_s)})
            self._urls[name] = url
            self._clients[name] = client
            return url, client

    def _open(self) -> Any:
        if self._channel is None:
            connection = KombuConnection(self._url, transport_options=self._options)
            try:
                connection.ensure_connection(max_retries=self._retries, interval_start=0.1, interval_step=0.5)
                self._channel = connection.channel()
            except BaseException:
                with quietly("close the SQS connection"):
                    connection.release()
                raise
            self._connection = connection
        return self._channel

    def _change_visibility(self, name: str, handles: Sequence[object], seconds: float) -> None:
        timeout_s = min(math.ceil(max(seconds, 0.0)), _MAX_VISIBILITY_S)
        url, client = self._queue(name)
        for chunk in _chunks_of(handles):
            entries = [
                {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": timeout_s}
                for i, handle in enumerate(chunk)
            ]
            self._batch(
                client.change_message_visibility_batch,
                url,
                entries,
                action="change visibility in",
                ignore=_STALE_RECEIPT,
            )

    def _batch(
        self, call: Any, url: str, entries: list[dict[str, Any]], *, action: str, ignore: frozenset[str]
    ) -> None:
        """Run one batch call; retry the entries SQS failed on its side (twice), ignore those it
        failed for a reason in `ignore`, and raise for the rest."""
        for _ in range(3):
            failed = [f for f in call(QueueUrl=url, Entries=entries).get("Failed", []) if f.get("Code") not in ignore]
            if not failed:
                return
            refused = [f for f in failed if f.get("SenderFault")]
            if refused:
                first = refused[0]
                raise TransportError(f"SQS refused to {action} {url}: {first.get('Code')}: {first.get('Message')}")
            retry = {f["Id"] for f in failed}
            entries = [entry for entry in entries if entry["Id"] in retry]
        raise TransportUnavailable(f"SQS could not {action} {url}: {len(entries)} entries kept failing")


def _chunks(bodies: Sequence[bytes]) -> Iterator[list[bytes]]:
    """Batches of at most 10 bodies and 256 KiB of encoded text (a larger body goes alone, for
    SQS to accept or refuse)."""
    chunk: list[bytes] = []
    size = 0
    for body in bodies:
        encoded = 4 * math.ceil(len(body) / 3)
        if chunk and (len(chunk) == _BATCH_ENTRIES or size + encoded > _BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(body)
        size += encoded
    if chunk:
        yield chunk


def _chunks_of(handles: Sequence[object]) -> Iterator[Sequence[object]]:
    for start in range(0, len(handles), _BATCH_ENTRIES):
        yield handles[start : start + _BATCH_ENTRIES]


def _decode(message: Mapping[str, Any]) -> bytes:
    text = str(message["Body"])
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        # Not published by jobq: hand it over as it is, for the codec to refuse.
        return text.encode()


def _whole_seconds(key: str, seconds: float) -> int:
    whole = math.ceil(seconds)  # rounded up: a longer hold never breaks at-least-once
    if whole > _MAX_VISIBILITY_S:
        raise ConfigError(key, seconds, f"SQS visibility timeouts end at {_MAX_VISIBILITY_S} s")
    return whole


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    return False
