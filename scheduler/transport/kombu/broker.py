"""What `KombuTransport` needs from one broker (`Broker`), and what every broker module shares:
the message a broker hands over, kombu's connection and producer classes, kombu's own errors, and
quiet teardown.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import kombu.exceptions
from kombu.connection import Connection as _Connection
from kombu.messaging import Producer as _Producer

from jobq.errors import TransportError, TransportUnavailable

log = logging.getLogger("jobq.transport")

# kombu ships py.typed but leaves most of its API unannotated, which strict mypy reports at every
# call; reached through Any, the checks stay on jobq's own code.
KombuConnection: Any = _Connection
KombuProducer: Any = _Producer


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

    def waiting(self, name: str) -> tuple[int, float | None]:
        """Messages ready for a consumer, and the age in seconds of the oldest when the broker can tell."""
        ...

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


def as_bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)
