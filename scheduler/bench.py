"""Workloads that measure a deployment: W1 instant throughput and W2 spikes (`jobq bench`).

The bench starts its own scanner and worker processes against the configured deployment, runs
a no-op task that appends each run id to a per-process file (so every run is verified executed
exactly once), and reads timings back from the store. Run it on an otherwise idle deployment:
other workers on the same queues would take the bench's runs.
"""

from __future__ import annotations

import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from jobq.app import App
from jobq.client import Client
from jobq.deployment import Deployment
from jobq.models import JobKey, Priority, Run, RunState, TaskTarget
from jobq.settings import Settings
from jobq.submission import JobSpec

NOOP = "jobq.bench.noop"
SLEEP = "jobq.bench.sleep"
SLEEP_ASYNC = "jobq.bench.sleep_async"
SPIN = "jobq.bench.spin"
FOREVER = "jobq.bench.forever"
LEAK = "jobq.bench.leak"
bench_app = App("jobq-bench")
_LOG_DIR_VARIABLE = "JOBQ_BENCH_LOG_DIR"


@bench_app.task(name=NOOP)
def noop() -> None:
    """Record the execution: one line per run in this process's file."""
    from jobq.tasks import current_context

    _log_file().write(current_context().run_id + "\n")


@bench_app.task(name=SLEEP)
def sleep(seconds: float) -> None:
    """I/O-bound: wait `seconds` (cooperatively under gevent, which patches `time.sleep`)."""
    time.sleep(seconds)
    noop()


@bench_app.task(name=SLEEP_ASYNC)
async def sleep_async(seconds: float) -> None:
    """I/O-bound, for the asyncio pool."""
    import asyncio

    await asyncio.sleep(seconds)
    noop()


@bench_app.task(name=SPIN)
def spin(n: int = 600_000) -> int:
    """CPU-bound pure Python: about 23 ms of CPU for the default `n` on this project's machine
    (measured 2026-12-01); `n=1_300_000` is about 55 ms."""
    total = 0
    for i in range(n):
        total += i * i % 7
    noop()
    return total


@bench_app.task(name=FOREVER)
def forever() -> None:
    """Never returns: what a hard time limit must stop."""
    while True:
        time.sleep(0.01)


_LEAKED: list[bytes] = []


@bench_app.task(name=LEAK)
def leak(kib: int = 1024) -> None:
    """Keeps `kib` KiB for the life of the process: what `--max-memory-per-child` is for."""
    _LEAKED.append(os.urandom(kib * 1024))
    noop()


@functools.cache
def _log_file() -> TextIO:
    """This process's execution log, opened once (line-buffered: every run id reaches the file)."""
    directory = os.environ.get(_LOG_DIR_VARIABLE) or tempfile.gettempdir()
    return open(Path(directory) / f"executed-{os.getpid()}.log", "a", buffering=1)


Progress = Callable[[str, int, int], None]  # phase, done, total


@dataclass
class Percentiles:
    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> Percentiles:
        ordered = sorted(values_ms)
        if not ordered:
            return cls(0, 0, 0, 0)

        def at(q: float) -> float:
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

        return cls(at(0.50), at(0.95), at(0.99), ordered[-1])


@dataclass
class Result:
    name: str
    runs: int
    executed_once: bool
    enqueue_per_s: float = 0.0
    elapsed_s: float = 0.0
    runs_per_s: float = 0.0
    dispatch_lateness_ms: Percentiles | None = None
    start_lateness_ms: Percentiles | None = None
    notes: dict[str, float] = field(default_factory=dict)


class Bench:
    """Runs workloads against one deployment, with `workers` worker processes of `concurrency`."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        workers: int = 1,
        concurrency: int = 16,
        pool: str = "threads",
        worker_args: Sequence[str] = (),
        progress: Progress | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.d = deployment
        self.client = Client(deployment)
        self.workers = workers
        self.concurrency = concurrency
        self.pool = pool
        self.worker_args = list(worker_args)
        self.progress = progress or (lambda phase, done, total: None)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="jobq-bench-"))

    # -- workloads ------------------------------------------------------------------------------

    def instant(self, n: int = 20_000, *, task: str = NOOP, args: Sequence[object] = ()) -> Result:
        """W1: enqueue `n` instant no-op runs (or runs of another bench `task` with `args`), then
        start the daemons and time until all ran."""
        started = time.perf_counter()
        payload = {"args": list(args), "kwargs": {}}
        specs = [self._spec("IMMEDIATE", target=TaskTarget(task=task), payload=payload) for _ in range(n)]
        job_ids = self._submit(specs, bulk=task != NOOP)
        enqueue_s = time.perf_counter() - started
        self._refresh_statistics()
        with self._daemons() as executed:
            t0 = time.perf_counter()
            self._wait(executed, n, "running")
            wall_s = time.perf_counter() - t0
        once = self._verify(job_ids, executed)
        # Steady state: from the first task's start to the last one's end, so process start-up
        # (a second or so of imports) does not count against the rate.
        runs = self._runs(job_ids)
        first = min((r.started_ms for r in runs if r.started_ms), default=0)
        last = max((r.finished_ms for r in runs if r.finished_ms), default=0)
        busy_s = max((last - first) / 1000, 1e-3)
        result = Result("W1 instant", n, once, n / enqueue_s, busy_s, n / busy_s)
        result.notes["wall_s"] = wall_s
        # Slot utilisation: the share of the slots' time with an attempt between its start write and
        # its outcome (what a slot spends between tasks is the rest).
        held_s = sum(r.finished_ms - r.started_ms for r in runs if r.started_ms and r.finished_ms) / 1000
        result.notes["slot_utilisation"] = held_s / (busy_s * self.concurrency * self.workers)
        return result

    def spike(self, n: int = 10_000, *, lead_s: float = 10.0, critical: int = 0) -> Result:
        """W2: `n` runs due at the same instant (LOW when `critical` CRITICAL runs join them);
        lateness of dispatch and start, measured against the due time."""
        with self._daemons() as executed:
            self._ready()
            due_ms = self.d.clock.now_ms() + round(lead_s * 1000)
            low = Priority.LOW if critical else Priority.DEFAULT
            specs = [self._spec("ONE_OFF", run_at=due_ms, priority=low) for _ in range(n)]
            specs += [self._spec("ONE_OFF", run_at=due_ms, priority=Priority.CRITICAL) for _ in range(critical)]
            job_ids = self._submit(specs, bulk=True)
            self._refresh_statistics()
            if self.d.clock.now_ms() >= due_ms:
                raise RuntimeError(f"submitting took longer than the lead time of {lead_s} s: raise --lead")
            self._wait(executed, len(specs), "running")
            elapsed = (self.d.clock.now_ms() - due_ms) / 1000
        runs = self._runs(job_ids)
        result = self._lateness(f"W2 spike of {n}", runs, job_ids, executed, elapsed)
        if critical:
            crit = [r for r in runs if r.priority is Priority.CRITICAL]
            result.name = f"W2 spike of {n} LOW + {critical} CRITICAL"
            result.dispatch_lateness_ms = Percentiles.of([_late(r, "dispatched") for r in crit])
            result.start_lateness_ms = Percentiles.of([_late(r, "started") for r in crit])
        return result

    def spread(self, n: int = 1_000, *, over_s: float = 10.0, lead_s: float = 3.0) -> Result:
        """W2 spread: `n` runs due uniformly over `over_s` seconds."""
        with self._daemons() as executed:
            self._ready()
            start_ms = self.d.clock.now_ms() + round(lead_s * 1000)
            step_ms = over_s * 1000 / n
            specs = [self._spec("ONE_OFF", run_at=start_ms + round(i * step_ms)) for i in range(n)]
            job_ids = self._submit(specs, bulk=True)
            self._refresh_statistics()
            self._wait(executed, n, "running")
            elapsed = (self.d.clock.now_ms() - start_ms) / 1000
        runs = self._runs(job_ids)
        return self._lateness(f"W2 spread of {n} over {over_s:g} s", runs, job_ids, executed, elapsed)

    # -- machinery ------------------------------------------------------------------------------

    def _spec(self, kind: str, **fields: object) -> JobSpec:
        return JobSpec.model_validate(
            {"schedule_type": kind, "target": TaskTarget(task=NOOP), "job_name": "bench"} | fields
        )

    def _submit(self, specs: Sequence[JobSpec], *, bulk: bool = False) -> list[JobKey]:
        """One `submit` per job (what W1's enqueue rate measures), or `submit_many` in batches
        where only the runs' timing matters."""
        ids: list[JobKey] = []
        step = 1000 if bulk else 500
        for start in range(0, len(specs), step):
            chunk = specs[start : start + step]
            if bulk:
                ids.extend(job.key for job in self.client.submit_many(chunk))
            else:
                ids.extend(self.client.submit(spec).job.key for spec in chunk)
            self.progress("enqueueing", len(ids), len(specs))
        return ids

    def _refresh_statistics(self) -> None:
        """Planner statistics as an established deployment has them (see `PostgresStore.analyze`),
        so the figures are not those of a table PostgreSQL still believes empty."""
        analyze = getattr(self.d.store, "analyze", None)
        if callable(analyze):
            analyze()

    @contextmanager
    def _daemons(self) -> Iterator[Path]:
        """Beat, scanner, reaper and workers as processes; yields the directory of execution logs."""
        logs = Path(tempfile.mkdtemp(prefix="executed-", dir=self.workdir))
        env = {**os.environ, **_env(self.d.settings), _LOG_DIR_VARIABLE: str(logs), "JOBQ_LOG_LEVEL": "WARNING"}
        jobq = [sys.executable, "-m", "jobq.cli"]
        commands = [[*jobq, "beat"], [*jobq, "scanner"], [*jobq, "reaper"]]
        worker = [*jobq, "worker", "-A", "jobq.bench", "-P", self.pool, "-c", str(self.concurrency), *self.worker_args]
        commands += [worker] * self.workers
        procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL) for c in commands]
        try:
            yield logs
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()

    def _ready(self, timeout_s: float = 120.0) -> None:
        """Until the scanner and every worker are up (in the daemon registry), so that a lateness
        workload measures dispatch and start, not process start-up (seconds on a loaded machine)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            roles = [r.role.value for r in self.d.registry.live_daemons(self.d.clock.now_ms())]
            if "scanner" in roles and roles.count("worker") >= self.workers:
                return
            self.progress("starting", 0, 1)
            time.sleep(0.1)
        raise TimeoutError(f"the daemons were not all up within {timeout_s} s")

    def _wait(self, logs: Path, n: int, phase: str, timeout_s: float = 900.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (done := _count(logs)) < n:
            self.progress(phase, done, n)
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {done} of {n} runs executed within {timeout_s} s")
            time.sleep(0.02)
        self.progress(phase, n, n)

    def _verify(self, job_ids: Sequence[JobKey], logs: Path) -> bool:
        executed = _executed(logs)
        return len(executed) == len(set(executed)) == len(job_ids)

    def _runs(self, job_ids: Sequence[JobKey]) -> list[Run]:
        runs: list[Run] = []
        for start in range(0, len(job_ids), 500):
            jobs = self.d.store.get_jobs(job_ids[start : start + 500])
            ids = [Run.make_id(j.key, j.schedule.at_ms or 0) for j in jobs.values()]
            runs.extend(self.d.store.get_runs(ids).values())
        return runs

    def _lateness(self, name: str, runs: list[Run], job_ids: Sequence[JobKey], logs: Path, elapsed: float) -> Result:
        done = [r for r in runs if r.state is RunState.SUCCEEDED]
        return Result(
            name,
            len(job_ids),
            self._verify(job_ids, logs) and len(done) == len(job_ids),
            elapsed_s=elapsed,
            dispatch_lateness_ms=Percentiles.of([_late(r, "dispatched") for r in done]),
            start_lateness_ms=Percentiles.of([_late(r, "started") for r in done]),
        )


def _late(run: Run, what: str) -> float:
    at = run.dispatched_ms if what == "dispatched" else run.started_ms
    return max(0.0, float((at or run.due_ms) - run.due_ms))


def _env(settings: Settings) -> dict[str, str]:
    urls = {"JOBQ_STORE": settings.store_url, "JOBQ_INDEX": settings.index, "JOBQ_BROKER": settings.broker}
    urls["JOBQ_HISTORY"] = settings.history
    return urls


def _executed(logs: Path) -> list[str]:
    return [line for path in logs.glob("executed-*.log") for line in path.read_text().split()]


def _count(logs: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in logs.glob("executed-*.log"))


def median_of(results: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(results), min(results), max(results)
