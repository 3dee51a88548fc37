"""Buffered history: `record` appends to a buffer, a background thread ships it in batches.

A worker completing a run never waits on history. One mechanism, `BufferingSink`, serves every
buffered sink: it flushes when ``flush_size`` is buffered or every ``flush_s``, ships one batch at
a time (in order: what a failed shipment keeps goes out before newer events), bounds what it holds
by ``max_size``, and counts every event it drops in `jobq_history_errors_total`. What "size" means
is the subclass's: events for `BufferedHistory`, bytes of NDJSON for the AWS sinks (`NdjsonSink`).

- `BufferedHistory` wraps a synchronous sink (SQLite, PostgreSQL): it ships by calling the inner
  sink's `record`, and a batch that fails there is dropped and counted, never retried.
- `NdjsonSink` is the base of the S3 and Firehose sinks: events are encoded once, as NDJSON lines,
  and a shipment that fails for a transient reason keeps its lines for the next flush.

Events buffered when the process is killed are lost; the store still holds every run's outcome,
so only history lines are lost, never a run.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from jobq.metrics import METRICS
from jobq.models import JobKey, RunEvent
from jobq.ports import HistorySink

log = logging.getLogger("jobq.history")

T = TypeVar("T")


class BufferingSink(Generic[T]):
    """The buffering half of a `HistorySink`. `record` turns events into items (`_item`) and
    appends them under a lock; a background thread calls `_ship` when ``flush_size`` (in `_size`
    units) is buffered or every ``flush_s``. `_ship` returns the items to keep for the next flush
    (a transient failure); items it drops it counts itself. Subclasses set their fields, then call
    ``super().__init__`` (it starts the thread), and may override `_release`.

    `record`, `flush` and `close` never raise. The buffer (in-flight items included) is bounded by
    ``max_size``: beyond it new events are dropped, as are events `close` could not ship; all of
    them are counted in `jobq_history_errors_total` and logged."""

    def __init__(self, *, name: str, flush_s: float, flush_size: int, max_size: int, unit: str) -> None:
        self.name = name
        self.flush_s = flush_s
        self.flush_size = flush_size
        self.max_size = max_size
        self._unit = unit
        self._lock = threading.Lock()  # the buffer and its counters; never held across I/O
        self._flush_lock = threading.Lock()  # one shipment at a time, so retries go out before newer items
        self._buffer: list[T] = []
        self._buffered_size = 0
        self._held_size = 0  # buffered plus in flight: what max_size bounds
        self._dropped_unlogged = 0
        self._closed = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"jobq-history-{name}", daemon=True)
        self._thread.start()

    def record(self, events: Sequence[RunEvent]) -> None:
        """Buffer the events; never raises and never waits on the network. Events that cannot be
        encoded, or held (a closed sink, a full buffer), are counted in `jobq_history_errors_total`
        and logged (a full buffer's drops by the flusher, so a hot path is not flooded with logs)."""
        if not events:
            return
        try:
            items = [self._item(e) for e in events]
        except Exception:
            METRICS.history_errors.inc(len(events))
            log.exception("%s history: %d events could not be encoded; dropped", self.name, len(events))
            return
        size = sum(self._size(item) for item in items)
        with self._lock:
            closed = self._closed
            full = not closed and self._held_size + size > self.max_size
            if full:
                self._dropped_unlogged += len(items)
            elif not closed:
                self._buffer.extend(items)
                self._buffered_size += size
                self._held_size += size
            due = self._buffered_size >= self.flush_size
        if closed or full:
            METRICS.history_errors.inc(len(items))
            if closed:
                log.warning("%s history is closed; %d events dropped", self.name, len(items))
        elif due:
            self._wake.set()

    def flush(self) -> None:
        """Ship everything buffered now. Never raises: what fails stays buffered for the next
        flush, within ``max_size``, unless `_ship` drops it."""
        self._flush()

    def close(self) -> None:
        """Stop the flusher, ship what is buffered (one more try), count and log what could not
        be shipped, and release what the sink holds (`_release`). Idempotent; `record` after it
        drops and counts."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        self._thread.join()  # bounded: a shipment in progress ends within its client's timeouts
        self._flush()
        with self._lock:
            left, self._buffer = self._buffer, []
            self._buffered_size = self._held_size = 0
        if left:
            METRICS.history_errors.inc(len(left))
            log.error("%s history closed with %d events it could not ship; dropped", self.name, len(left))
        self._release()

    def _item(self, event: RunEvent) -> T:
        """What the buffer holds for `event`; may raise (the event is then dropped and counted)."""
        raise NotImplementedError

    def _size(self, item: T) -> int:
        raise NotImplementedError

    def _ship(self, batch: list[T]) -> list[T]:
        """Send `batch`; return what to keep for the next flush. May raise: the batch is then kept."""
        raise NotImplementedError

    def _release(self) -> None:
        pass

    def _flush(self) -> bool:
        """One shipment of the whole buffer; True when nothing was left over."""
        with self._flush_lock:
            with self._lock:
                batch, self._buffer = self._buffer, []
                self._buffered_size = 0
                dropped, self._dropped_unlogged = self._dropped_unlogged, 0
            if dropped:
                log.error(
                    "%s history buffer full (%d %s): %d events dropped", self.name, self.max_size, self._unit, dropped
                )
            if not batch:
                return True
            try:
                kept = self._ship(batch)
            except Exception:
                log.exception("%s history: shipping %d events failed; kept for the next flush", self.name, len(batch))
                kept = batch
            kept_size = sum(self._size(item) for item in kept)
            with self._lock:
                self._buffer[:0] = kept  # ahead of what was recorded meanwhile: order is kept
                self._buffered_size += kept_size
                self._held_size -= sum(self._size(item) for item in batch) - kept_size
            return not kept

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                shipped = self._flush()
            except Exception:  # the thread must outlive any bug: history would silently stop
                log.exception("%s history flusher failed", self.name)
                shipped = False
            if not shipped:
                # A failing destination with a full buffer would otherwise wake this loop on
                # every record: wait a whole interval before trying again.
                self._stop.wait(self.flush_s)


class BufferedHistory(BufferingSink[RunEvent]):
    """Flushes to `inner` every `interval_s` or at `max_events`, from a background thread.

    Thread-safe. A batch `inner.record` fails on is dropped and counted, not retried (the
    synchronous sinks count their own failures and do not raise). `read` flushes first, then reads
    `inner`; `close` flushes, then closes `inner`. The buffer is not bounded: with failures dropped,
    it holds at most what is recorded while one batch is written.
    """

    def __init__(self, inner: HistorySink, *, interval_s: float = 0.2, max_events: int = 1000) -> None:
        self.inner = inner
        super().__init__(
            name="buffered", flush_s=interval_s, flush_size=max_events, max_size=sys.maxsize, unit="events"
        )

    @property
    def interval_s(self) -> float:
        return self.flush_s

    @property
    def max_events(self) -> int:
        return self.flush_size

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        self.flush()
        return self.inner.read(job, limit)

    def _item(self, event: RunEvent) -> RunEvent:
        return event

    def _size(self, item: RunEvent) -> int:
        return 1

    def _ship(self, batch: list[RunEvent]) -> list[RunEvent]:
        try:
            self.inner.record(batch)
        except Exception:
            METRICS.history_errors.inc(len(batch))
            log.exception("history write failed; %d events dropped", len(batch))
        return []

    def _release(self) -> None:
        self.inner.close()


@dataclass(frozen=True, slots=True)
class Line:
    """One encoded event: its time (for partitioning) and its NDJSON line, newline included."""

    at_ms: int
    data: bytes


class NdjsonSink(BufferingSink[Line]):
    """The base of the AWS sinks: events buffered as NDJSON lines (`_encode`, which a subclass
    may override), sized in bytes: flush at ``flush_bytes``, hold at most ``max_buffer_bytes``."""

    def __init__(self, *, name: str, flush_s: float, flush_bytes: int, max_buffer_bytes: int) -> None:
        super().__init__(name=name, flush_s=flush_s, flush_size=flush_bytes, max_size=max_buffer_bytes, unit="bytes")

    @property
    def flush_bytes(self) -> int:
        return self.flush_size

    @property
    def max_buffer_bytes(self) -> int:
        return self.max_size

    def _encode(self, event: RunEvent) -> bytes:
        return event.model_dump_json().encode() + b"\n"

    def _item(self, event: RunEvent) -> Line:
        return Line(event.at_ms, self._encode(event))

    def _size(self, item: Line) -> int:
        return len(item.data)
