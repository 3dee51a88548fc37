"""Per-tenant token buckets for submissions, in the memory of one API process.

Each tenant's bucket holds up to `burst` tokens and refills at `rate_per_s`; a submission takes
one. The buckets are per process: with `--workers N` (or N replicas) a tenant may submit up to
N times the configured rate. That is the price of needing no shared state; put a shared limiter
in front of the API when the limit must be global.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_BUCKETS = 10_000  # past this many tenants, full (idle) buckets are dropped: they carry no state


class RateLimiter:
    """Thread-safe token buckets keyed by tenant. `now_s` is a monotonic clock in seconds."""

    def __init__(self, rate_per_s: float, burst: int, now_s: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate_per_s must be > 0 and burst >= 1")
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self._now_s = now_s
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at_s)
        self._lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> float:
        """Take `cost` tokens from `key`'s bucket. Returns 0.0 when granted, else the seconds to
        wait until they would be (nothing is taken then)."""
        now = self._now_s()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate_per_s)
            if tokens >= cost:
                self._buckets[key] = (tokens - cost, now)
                if len(self._buckets) > MAX_BUCKETS:
                    self._prune(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (cost - tokens) / self.rate_per_s

    def _prune(self, now: float) -> None:
        full = [k for k, (tokens, at) in self._buckets.items() if tokens + (now - at) * self.rate_per_s >= self.burst]
        for key in full:
            del self._buckets[key]
