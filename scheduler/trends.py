"""Rates from successive overviews, for `jobq top`: runs started per second and start lateness
p50/p99 per tier, and the growth of the dead-letter list.

Workers report their process's start-lateness histogram in the registry (`DaemonRecord.start_lateness`,
cumulative counts). Two overviews some seconds apart give, per worker, how many runs of each tier
started in between and in which lateness buckets; summed over the workers, that is the
deployment's throughput and its lateness quantiles over the window (interpolated within a bucket,
as Prometheus' `histogram_quantile` does). A worker that restarted (its counts went down) or
appeared in between is left out of that window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from jobq.metrics import Histogram
from jobq.models import Priority
from jobq.overview import Overview

BUCKETS = Histogram.BUCKETS


@dataclass(frozen=True, slots=True)
class _Sample:
    at_ms: int
    dead_letters: int
    lateness: dict[str, dict[str, tuple[float, ...]]]  # daemon id -> tier -> cumulative buckets, count, sum


def quantile(q: float, buckets: list[float]) -> float | None:
    """The `q` quantile of a histogram given as cumulative counts per bucket of `BUCKETS` then the
    total; None when it holds nothing. Beyond the last bucket, the last bound."""
    total = buckets[len(BUCKETS)] if len(buckets) > len(BUCKETS) else 0
    if total <= 0:
        return None
    rank = q * total
    below, lower = 0.0, 0.0
    for bound, count in zip(BUCKETS, buckets, strict=False):
        if count >= rank:
            span = count - below
            return lower + (bound - lower) * ((rank - below) / span if span > 0 else 1.0)
        below, lower = count, bound
    return BUCKETS[-1]


class Trends:
    """Feed it overviews (`add`); it keeps those of the last `window_s` seconds and compares the
    newest with the oldest kept."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_ms = round(window_s * 1000)
        self._samples: deque[_Sample] = deque()

    def add(self, overview: Overview) -> None:
        lateness = {r.daemon_id: dict(r.start_lateness) for r in overview.daemons if r.start_lateness}
        self._samples.append(_Sample(overview.at_ms, overview.census.dead_letters, lateness))
        while len(self._samples) > 2 and self._samples[1].at_ms <= overview.at_ms - self.window_ms:
            self._samples.popleft()

    def _ends(self) -> tuple[_Sample, _Sample, float] | None:
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        seconds = (last.at_ms - first.at_ms) / 1000
        return (first, last, seconds) if seconds > 0 else None

    def _window(self, priority: Priority) -> tuple[list[float], float] | None:
        """Bucket counts (and the total last) of the tier's starts within the window, and its length."""
        ends = self._ends()
        if ends is None:
            return None
        first, last, seconds = ends
        width = len(BUCKETS) + 1
        summed = [0.0] * width
        for daemon_id, tiers in last.lateness.items():
            before = first.lateness.get(daemon_id)
            if before is None:
                continue
            now = tiers.get(priority.value, ())
            then = before.get(priority.value, ())
            if len(now) < width:
                continue
            then = then if len(then) >= width else (0.0,) * width
            diffs = [now[i] - then[i] for i in range(width)]
            if min(diffs) < 0:
                continue  # the worker restarted: its counts began again
            summed = [a + b for a, b in zip(summed, diffs, strict=True)]
        return summed, seconds

    def throughput(self, priority: Priority) -> float | None:
        """Runs of the tier started per second over the window; None before two reads."""
        window = self._window(priority)
        return None if window is None else window[0][-1] / window[1]

    def lateness_s(self, priority: Priority, q: float) -> float | None:
        """The `q` quantile of start lateness of the tier's runs started within the window."""
        window = self._window(priority)
        return None if window is None else quantile(q, window[0])

    def dead_letter_growth_per_min(self) -> float | None:
        ends = self._ends()
        if ends is None:
            return None
        first, last, seconds = ends
        return (last.dead_letters - first.dead_letters) * 60 / seconds
