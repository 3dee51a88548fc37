"""Batches history writes off the hot path: a worker completing a run never waits on history."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from jobq.metrics import METRICS
from jobq.models import RunEvent
from jobq.ports import HistorySink

log = logging.getLogger("jobq.history")


class BufferedHistory:
    """Flushes to `inner` every `interval_s` or at `max_events`, from a background thread.

    Events still buffered when the process is killed are lost; the store keeps each run's
    outcome, so only the history line is lost, never a run.
    """

    def __init__(self, inner: HistorySink, *, interval_s: float = 0.2, max_events: int = 1000) -> None:
        self.inner = inner
        self.interval_s = interval_s
        self.max_events = max_events
        self._buffer: list[RunEvent] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="jobq-history", daemon=True)
        self._thread.start()

    def record(self, events: Sequence[RunEvent]) -> None:
        with self._lock:
            self._buffer.extend(events)
            full = len(self._buffer) >= self.max_events
        if full:
            self._wake.set()

    def read(self, job_id: str, limit: int = 1000) -> list[RunEvent]:
        self.flush()
        return self.inner.read(job_id, limit)

    def flush(self) -> None:
        with self._lock:
            batch, self._buffer = self._buffer, []
        if not batch:
            return
        try:
            self.inner.record(batch)
        except Exception:
            METRICS.history_errors.inc(len(batch))
            log.exception("history write failed; %d events dropped", len(batch))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush()
        self.inner.close()
