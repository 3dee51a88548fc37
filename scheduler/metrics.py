"""Process-local metrics with Prometheus text exposition (`--metrics-port`).

Small on purpose: counters, gauges and histograms with a fixed label set, thread-safe, rendered in the
Prometheus text format. Each daemon process exposes its own.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Counter:
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.labels = name, help_text, labels
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1, **labels: str) -> None:
        key = _key(self.labels, labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, **labels: str) -> float:
        key = _key(self.labels, labels)
        with self._lock:
            if labels or not self.labels:
                return self._values.get(key, 0)
            return sum(self._values.values())

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        with self._lock:
            items = sorted(self._values.items())
        for key, value in items:
            yield f"{self.name}{_labels(self.labels, key)} {value:g}"


class Gauge:
    """A value that goes up and down. Either set it (`set`), or give it a `source` called at each
    scrape that returns the current value per label tuple (`{("critical",): 12.0}`): the source is
    how an expensive figure (a store count, a broker depth) is computed once per scrape, not per
    event. A source that raises leaves the last values in place."""

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: tuple[str, ...] = (),
        source: Callable[[], dict[tuple[str, ...], float]] | None = None,
    ) -> None:
        self.name, self.help, self.labels, self.source = name, help_text, labels, source
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def set(self, value: float, **labels: str) -> None:
        key = _key(self.labels, labels)
        with self._lock:
            self._values[key] = value

    def value(self, **labels: str) -> float:
        key = _key(self.labels, labels)
        with self._lock:
            return self._values.get(key, 0)

    def refresh(self) -> None:
        if self.source is None:
            return
        try:
            values = self.source()
        except Exception:  # a scrape must not fail because one figure could not be read
            return
        with self._lock:
            self._values = dict(values)

    def render(self) -> Iterable[str]:
        self.refresh()
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} gauge"
        with self._lock:
            items = sorted(self._values.items())
        for key, value in items:
            yield f"{self.name}{_labels(self.labels, key)} {value:g}"


class Histogram:
    BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.labels = name, help_text, labels
        # Per label tuple: the count of each bucket alone (made cumulative when read, so an
        # observation adds to one bucket, not to every bucket above it), then count and sum.
        self._data: dict[tuple[str, ...], list[float]] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, **labels: str) -> None:
        self.observe_many((value,), **labels)

    def observe_many(self, values: Sequence[float], **labels: str) -> None:
        """Observe each of `values` under the same labels: one lock and one label lookup for a batch."""
        if not values:
            return
        key = _key(self.labels, labels)
        with self._lock:
            data = self._data.get(key)
            if data is None:
                data = self._data[key] = [0.0] * (len(self.BUCKETS) + 2)
            bounds = self.BUCKETS
            for value in values:
                index = bisect.bisect_left(bounds, value)
                if index < len(bounds):  # beyond the last bound: counted in +Inf (the count) alone
                    data[index] += 1
                data[-2] += 1
                data[-1] += value

    def count(self, **labels: str) -> int:
        key = _key(self.labels, labels)
        with self._lock:
            data = self._data.get(key)
            return int(data[-2]) if data else 0

    def snapshot(self) -> dict[tuple[str, ...], list[float]]:
        """Per label tuple: the cumulative count of each bucket of `BUCKETS`, then the count and the sum."""
        with self._lock:
            return {key: self._cumulative(data) for key, data in self._data.items()}

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        items = sorted(self.snapshot().items())
        for key, data in items:
            for bound, count in zip(self.BUCKETS, data, strict=False):
                yield f"{self.name}_bucket{_labels((*self.labels, 'le'), (*key, f'{bound:g}'))} {count:g}"
            yield f"{self.name}_bucket{_labels((*self.labels, 'le'), (*key, '+Inf'))} {data[-2]:g}"
            yield f"{self.name}_count{_labels(self.labels, key)} {data[-2]:g}"
            yield f"{self.name}_sum{_labels(self.labels, key)} {data[-1]:g}"

    def _cumulative(self, data: list[float]) -> list[float]:
        out = list(itertools.accumulate(data[: len(self.BUCKETS)]))
        return [*out, data[-2], data[-1]]


def _key(names: tuple[str, ...], labels: dict[str, str]) -> tuple[str, ...]:
    """The label tuple of `labels` in the metric's order (per event: the one-label case is the common one)."""
    if len(names) == 1:
        return (labels.get(names[0], ""),)
    return tuple([labels.get(n, "") for n in names])


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    inner = ",".join(f'{n}="{v}"' for n, v in zip(names, values, strict=True))
    return "{" + inner + "}"


class Metrics:
    def __init__(self) -> None:
        self.dispatched = Counter("jobq_runs_dispatched_total", "Runs published to a queue.", ("priority",))
        self.dispatch_lateness = Histogram(
            "jobq_dispatch_lateness_seconds", "Publish time minus due time.", ("priority",)
        )
        self.start_lateness = Histogram("jobq_start_lateness_seconds", "Task start minus due time.", ("priority",))
        self.completed = Counter("jobq_runs_completed_total", "Attempts finished, by outcome.", ("outcome",))
        self.reclaimed = Counter("jobq_lease_reclaims_total", "Expired leases taken back by a reaper.", ("state",))
        self.fenced_writes = Counter(
            "jobq_fenced_writes_total", "Worker writes rejected because the fence or state moved.", ("op",)
        )
        self.misfires = Counter("jobq_misfires_total", "Fires that were late past the misfire threshold.", ("policy",))
        self.overlap = Counter(
            "jobq_overlap_decisions_total", "Runs held, skipped or cancelled by overlap.", ("action",)
        )
        self.stale_deliveries = Counter(
            "jobq_stale_deliveries_total", "Messages dropped because the run moved on (fence or state)."
        )
        self.history_errors = Counter("jobq_history_errors_total", "History events that could not be written.")
        self.loop_errors = Counter("jobq_loop_errors_total", "Daemon passes that raised.", ("daemon",))
        self.autoscale = Counter(
            "jobq_worker_autoscale_total", "Pool size changes made by --autoscale.", ("direction",)
        )
        self.corrupt_records = Counter(
            "jobq_corrupt_records_total", "Stored records that did not decode, quarantined (job or run).", ("kind",)
        )

        self.extra: list[Gauge] = []

    def all(self) -> list[Counter | Gauge | Histogram]:
        own = [v for v in vars(self).values() if isinstance(v, Counter | Gauge | Histogram)]
        with _REGISTER_LOCK:
            return own + list(self.extra)

    def register(self, gauge: Gauge) -> Gauge:
        """Add (or replace, by name) a gauge a daemon or the API exports; returns it."""
        with _REGISTER_LOCK:
            self.extra = [g for g in self.extra if g.name != gauge.name] + [gauge]
        return gauge

    def render(self) -> str:
        return "\n".join(line for metric in self.all() for line in metric.render()) + "\n"


_REGISTER_LOCK = threading.Lock()


METRICS = Metrics()


def serve(port: int, host: str = "0.0.0.0", health: Callable[[], bool] | None = None) -> ThreadingHTTPServer:
    """Serve `/metrics` and `/healthz` (200 when `health()` is true, else 503: a liveness probe)
    from a daemon thread; returns the server (call `shutdown()` to stop)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/healthz":
                ok = health() if health is not None else True
                self._reply(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain")
                return
            if path != "/metrics":
                self.send_error(404)
                return
            self._reply(200, METRICS.render().encode(), "text/plain; version=0.0.4")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="jobq-metrics", daemon=True).start()
    return server
