"""The gauges every daemon's `/metrics` and the API's export: backlog, lateness of due runs, runs
per state, dead letters and live daemons (docs/operations.md says what each means).

All of them read one cached `Overview` (`jobq.overview`): a scrape takes at most one overview
(one census statement, one registry read, one depth call per tier queue), and scrapes closer
together than `max_age_s` share it, so ten gauges and several Prometheus servers cost no more
than one read every few seconds. A failed read is cached too (and the gauges keep their last
values), so a store outage is not hammered by every scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from jobq.deployment import Deployment
from jobq.metrics import METRICS, Gauge
from jobq.models import PRIORITIES_BY_RANK, RunState
from jobq.overview import Overview, take_overview

MAX_AGE_S = 5.0


class OverviewCache:
    """The newest overview, re-read when older than `max_age_s` (monotonic time)."""

    def __init__(
        self, deployment: Deployment, max_age_s: float = MAX_AGE_S, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.d = deployment
        self.max_age_s = max_age_s
        self.monotonic = monotonic
        self.reads = 0  # overviews taken (for tests and the benchmark)
        self._lock = threading.Lock()
        self._taken: float | None = None
        self._value: Overview | None = None
        self._error: Exception | None = None

    def get(self) -> Overview:
        """The cached overview; raises the cached error when the last read failed."""
        with self._lock:
            now = self.monotonic()
            if self._taken is None or now - self._taken >= self.max_age_s:
                self._taken = now
                self.reads += 1
                try:
                    self._value, self._error = take_overview(self.d, self.d.clock.now_ms()), None
                except Exception as exc:
                    self._error = exc
            if self._error is not None:
                raise self._error
            assert self._value is not None
            return self._value


def _age_s(at_ms: int, since_ms: int | None) -> float:
    return 0.0 if since_ms is None else max(0.0, (at_ms - since_ms) / 1000)


def register_gauges(
    deployment: Deployment, max_age_s: float = MAX_AGE_S, monotonic: Callable[[], float] = time.monotonic
) -> OverviewCache:
    """Register the gauges with `METRICS` (replacing any of the same name); returns their cache."""
    cache = OverviewCache(deployment, max_age_s, monotonic)

    def source(fn: Callable[[Overview], dict[tuple[str, ...], float]]) -> Callable[[], dict[tuple[str, ...], float]]:
        return lambda: fn(cache.get())

    def backlog(o: Overview) -> dict[tuple[str, ...], float]:
        waiting = {p.queue: o.backlog[p].waiting for p in PRIORITIES_BY_RANK}
        return {(queue,): float(n) for queue, n in waiting.items() if n is not None}

    def backlog_age(o: Overview) -> dict[tuple[str, ...], float]:
        return {(p.queue,): o.backlog[p].oldest_age_s or 0.0 for p in PRIORITIES_BY_RANK}

    def due(o: Overview) -> dict[tuple[str, ...], float]:
        return {(p.queue,): float(o.census.tiers[p].due) for p in PRIORITIES_BY_RANK}

    def due_age(o: Overview) -> dict[tuple[str, ...], float]:
        return {(p.queue,): _age_s(o.at_ms, o.census.tiers[p].oldest_due_ms) for p in PRIORITIES_BY_RANK}

    def runs(o: Overview) -> dict[tuple[str, ...], float]:
        return {(s.value,): float(o.census.states[s]) for s in RunState if s in o.census.states}

    def alive(o: Overview) -> dict[tuple[str, ...], float]:
        return {(role.value,): float(n) for role, n in o.alive().items()}

    gauges = (
        Gauge("jobq_queue_backlog", "Messages waiting in the broker queue of a tier.", ("queue",), source(backlog)),
        Gauge(
            "jobq_queue_oldest_age_seconds",
            "Age of the oldest message waiting in a tier's queue (the broker's, else the oldest run dispatched "
            "and not started).",
            ("queue",),
            source(backlog_age),
        ),
        Gauge(
            "jobq_due_undispatched",
            "Runs due but not yet dispatched (SCHEDULED or CLAIMED with a due time passed), per tier.",
            ("tier",),
            source(due),
        ),
        Gauge(
            "jobq_due_undispatched_oldest_age_seconds",
            "How late the oldest due-but-undispatched run of a tier is.",
            ("tier",),
            source(due_age),
        ),
        Gauge(
            "jobq_runs",
            "Runs per state (DynamoDB: sampled, non-terminal states and dead letters).",
            ("state",),
            source(runs),
        ),
        Gauge(
            "jobq_dead_letters",
            "Runs on the dead-letter list.",
            (),
            source(lambda o: {(): float(o.census.dead_letters)}),
        ),
        Gauge("jobq_daemons_alive", "Live daemons per role, from the daemon registry.", ("role",), source(alive)),
        Gauge(
            "jobq_census_sampled",
            "1 when the run figures are sampled (DynamoDB), 0 when exact.",
            (),
            source(lambda o: {(): 0.0 if o.census.exact else 1.0}),
        ),
    )
    for gauge in gauges:
        METRICS.register(gauge)
    return cache
