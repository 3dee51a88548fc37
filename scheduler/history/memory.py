"""In-memory history, for tests and single-process use."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from jobq.models import JobKey, RunEvent


class MemoryHistory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[RunEvent] = []

    def record(self, events: Sequence[RunEvent]) -> None:
        with self._lock:
            self._events.extend(events)

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        with self._lock:
            return [e for e in self._events if e.job_key == job][:limit]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
