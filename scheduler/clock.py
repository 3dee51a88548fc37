"""Injected time. Logic never calls `time.time()`; it asks a `Clock`."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch, UTC."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, now_ms: int = 1_790_000_000_000) -> None:
        self._now_ms = now_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def set(self, now_ms: int) -> None:
        with self._lock:
            self._now_ms = now_ms

    def advance(self, *, ms: int = 0, s: float = 0) -> int:
        with self._lock:
            self._now_ms += ms + round(s * 1000)
            return self._now_ms


SYSTEM_CLOCK = SystemClock()
