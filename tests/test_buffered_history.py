"""BufferedHistory: a synchronous sink written in batches from a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from factories import T0, key

from jobq.history.buffered import BufferedHistory
from jobq.history.memory import MemoryHistory
from jobq.metrics import METRICS
from jobq.models import RunEvent


def _event(n: int) -> RunEvent:
    fields = {"run_id": f"job_1:{T0}", "job_id": "job_1", "attempt": n, "fence": n, "kind": "STARTED", "at_ms": T0 + n}
    return RunEvent.model_validate(fields)


class Inner(MemoryHistory):
    """A memory sink that records its batches, fails while `failing`, and says when it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.failing = False
        self.closed = False
        self.written = threading.Event()

    def record(self, events: Sequence[RunEvent]) -> None:
        if self.failing:
            raise RuntimeError("inner sink down")
        self.batches.append(len(events))
        super().record(events)
        self.written.set()

    def close(self) -> None:
        self.closed = True


def test_nothing_is_written_before_the_interval_or_max_events() -> None:
    inner = Inner()
    sink = BufferedHistory(inner, interval_s=60, max_events=10)
    try:
        sink.record([_event(1)])
        time.sleep(0.2)
        assert inner.batches == []
    finally:
        sink.close()


def test_max_events_wakes_the_writer_at_once() -> None:
    inner = Inner()
    sink = BufferedHistory(inner, interval_s=60, max_events=3)
    try:
        sink.record([_event(n) for n in range(3)])
        assert inner.written.wait(5)
        assert inner.batches == [3]
    finally:
        sink.close()


def test_a_batch_the_inner_sink_fails_on_is_dropped_and_counted() -> None:
    inner = Inner()
    sink = BufferedHistory(inner, interval_s=60)
    errors_before = METRICS.history_errors.value()
    inner.failing = True
    sink.record([_event(1), _event(2)])
    sink.flush()
    inner.failing = False
    sink.record([_event(3)])
    assert [e.attempt for e in sink.read(key("job_1"))] == [3]
    assert METRICS.history_errors.value() == errors_before + 2
    sink.close()


def test_close_writes_what_is_buffered_then_closes_the_inner_sink() -> None:
    inner = Inner()
    sink = BufferedHistory(inner, interval_s=60)
    sink.record([_event(1)])
    sink.close()
    sink.close()
    assert inner.batches == [1]
    assert inner.closed
