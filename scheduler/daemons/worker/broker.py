"""The worker's acks and visibility extensions, off the paths that keep leases alive.

An ack only tidies the broker (the outcome is already durable: a message redelivered later fails
its start compare-and-set and is dropped), and an extension only keeps a message hidden. Neither
may hold up an outcome write or a lease renewal: with the broker stalled (a SIGSTOPped Redis, a
slow SQS), a completer blocked on an ack left the next outcomes unwritten and a monitor blocked on
an extension left leases to run out, and the reaper then ran finished tasks again. So they go
through a lane of their own: one thread, in order, consecutive acks merged into one call.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from jobq.metrics import METRICS
from jobq.ports import Delivery, Transport


@dataclass(frozen=True, slots=True)
class _Call:
    kind: str  # "ack" or "extend"
    deliveries: Sequence[Delivery]
    visibility_s: float = 0.0


class BrokerLane:
    """`ack` and `extend` return at once and happen in the lane's thread; with `background=False`
    (a worker stepped by hand) they happen in the caller's thread, as plain calls."""

    def __init__(self, transport: Transport, *, background: bool) -> None:
        self.transport = transport
        self.background = background
        self.log = logging.getLogger("jobq.worker")
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    def start(self) -> None:
        if self.background and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="jobq-broker", daemon=True)
            self._thread.start()

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._submit(_Call("ack", list(deliveries)))

    def extend(self, deliveries: Sequence[Delivery], visibility_s: float) -> None:
        self._submit(_Call("extend", list(deliveries), visibility_s))

    def drain(self, timeout_s: float) -> bool:
        """Wait until every call so far has been made (or failed); False on timeout."""
        return self._idle.wait(timeout_s) if self._thread is not None else True

    def close(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._calls.put(None)
            self._thread.join(timeout_s)
            self._thread = None

    def _submit(self, call: _Call) -> None:
        if not call.deliveries:
            return
        if self._thread is None:
            self._make(call)
            return
        self._idle.clear()
        self._calls.put(call)

    def _loop(self) -> None:
        closing = False
        while not closing:
            call = self._calls.get()
            if call is None:
                break
            acks: list[Delivery] = []
            while call is not None and call.kind == "ack":  # merge the acks waiting in a row
                acks.extend(call.deliveries)
                try:
                    call = self._calls.get_nowait()
                except queue.Empty:
                    call = None
                else:
                    closing = call is None
            if acks:
                self._make(_Call("ack", acks))
            if call is not None:
                self._make(call)
            if self._calls.empty():
                self._idle.set()
        self._idle.set()

    def _make(self, call: _Call) -> None:
        try:
            if call.kind == "ack":
                self.transport.ack(call.deliveries)
            else:
                self.transport.extend(call.deliveries, call.visibility_s)
        except Exception:
            # Harmless to skip: an unacked message comes back and fails its start compare-and-set;
            # an unextended one may be redelivered while its run is leased, and is dropped the same way.
            METRICS.loop_errors.inc(daemon="broker")
            self.log.exception("could not %s %d messages", call.kind, len(call.deliveries))
