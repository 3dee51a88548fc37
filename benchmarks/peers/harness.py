"""Shared machinery of the peer benchmarks: a private redis-server, worker processes, the
execution log written by the no-op task, and the workloads W1 (instant throughput), W2 (spike,
priority spike, uniform spread) and W3 (backlog memory).

Each peer module (`celery_bench.py`, ...) defines a `Peer` subclass: how to enqueue and
schedule one task (always one call of the peer's normal API per task), which worker commands
make up each setting, and how to tell a worker is ready. Everything else is here, identical
for every peer.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PAGE = os.sysconf("SC_PAGE_SIZE")

# Workload sizes from the issue.
W1_N = 20_000
SPIKE_N = 10_000
PRIORITY_LOW_N = 50_000
PRIORITY_CRITICAL_N = 100
SPREAD_N = 1_000
SPREAD_OVER_S = 10.0
BACKLOG_N = 200_000
BACKLOG_AHEAD_S = 3600.0
CAP_S = 180.0  # a W2 run stops this long after its due time, reporting what had started


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- private Redis --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server of our own on a spare port, so FLUSHALL and INFO memory are ours alone."""

    def __init__(self, port: int | None = None) -> None:
        import redis

        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"redis-server on port {self.port} did not start")
        self.version = self.client.info("server")["redis_version"]

    def flush(self) -> None:
        self.client.flushall()

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- the execution log ----------------------------------------------------------------------


class ExecLog:
    """`executed.log` in a run directory: counted incrementally, parsed at the end."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "executed.log"
        self.offset = 0
        self.lines = 0

    def count(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return 0
        end = chunk.rfind(b"\n") + 1  # only whole lines
        self.lines += chunk.count(b"\n", 0, end)
        self.offset += end
        return self.lines

    def records(self) -> list[tuple[int, float, float]]:
        out = []
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            task_id, start, end, _pid = line.split()
            out.append((int(task_id), float(start), float(end)))
        return out

    def wait(self, n: int, deadline: float, until: Callable[[], bool] | None = None) -> int:
        """Poll until `n` lines (or `until()`), or the wall-clock `deadline`."""
        last_report = time.monotonic()
        while True:
            done = self.count()
            if done >= n or (until is not None and until()):
                return done
            if time.time() > deadline:
                return done
            if time.monotonic() - last_report > 15:
                log(f"  ... {done}/{n} executed")
                last_report = time.monotonic()
            time.sleep(0.05)


def verify(records: Sequence[tuple[int, float, float]], expected: Iterable[int]) -> dict[str, Any]:
    ids = [r[0] for r in records]
    unique = set(ids)
    want = set(expected)
    return {
        "executed": len(ids),
        "unique": len(unique),
        "duplicates": len(ids) - len(unique),
        "missing": len(want - unique),
        "unexpected": len(unique - want),
        "exactly_once": len(ids) == len(unique) == len(want) and unique == want,
    }


def percentiles_ms(values_s: Sequence[float], total: int | None = None) -> dict[str, float | None]:
    """Nearest-rank p50/p95/p99/max in ms (the rule jobq's own bench uses). With `total` larger
    than the values given, the missing ones count as later than any: their ranks read None."""
    ordered = sorted(v * 1000.0 for v in values_s)
    n = total if total is not None else len(ordered)
    if n == 0:
        return {"p50": None, "p95": None, "p99": None, "max": None, "min": None}

    def at(q: float) -> float | None:
        k = min(n - 1, round(q * (n - 1)))
        return round(ordered[k], 1) if k < len(ordered) else None

    return {
        "min": round(ordered[0], 1) if ordered else None,
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(ordered[-1], 1) if len(ordered) == n else None,
    }


# -- worker processes -----------------------------------------------------------------------


@dataclass
class Setting:
    name: str
    commands: list[list[str]]  # one argv per worker (each started in its own process group)
    expect_ready: int  # how many ready signals (peer-specific) make the setting ready
    note: str = ""


class Workers:
    """Start a setting's worker commands; stop them (SIGTERM, then SIGKILL) by process group."""

    def __init__(self, setting: Setting, run_dir: Path, env: dict[str, str]) -> None:
        self.setting = setting
        self.run_dir = run_dir
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started_at = 0.0

    def __enter__(self) -> Workers:
        self.started_at = time.time()
        for k, argv in enumerate(self.setting.commands):
            out = open(self.run_dir / f"worker-{k}.log", "ab")
            self.procs.append(
                subprocess.Popen(
                    argv, cwd=HERE, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
            out.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pgids(self) -> set[int]:
        return {p.pid for p in self.procs}  # start_new_session: pgid == pid of each leader

    def pids(self) -> list[int]:
        groups = self.pgids()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in groups:  # fields[2] is pgrp
                found.append(int(entry))
        return found

    def rss_bytes(self) -> int:
        total = 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * PAGE
            except OSError:
                pass
        return total

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self, grace_s: float = 5.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the group: prefork children, worker processes
            p.wait()
        self.procs = []


# -- peers ----------------------------------------------------------------------------------


class Peer:
    name = ""
    dist = ""  # distribution name for the version
    tasks_module = ""
    default_enqueue_rate = 1500.0  # per s, to pick the lead time of W2 before W1 measured one
    supports_priority = True
    priority_note = ""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        os.environ["PEER_BENCH_REDIS_URL"] = redis_url
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        self.measured_enqueue_rate: float | None = None

    @property
    def version(self) -> str:
        return importlib.metadata.version(self.dist)

    # settings: name -> Setting; the W1 pair, the W2/W3 choices
    def settings(self) -> dict[str, Setting]:
        raise NotImplementedError

    w1_settings: Sequence[str] = ("1proc", "2core")
    w1_n: dict[str, int] = {}  # setting -> a smaller W1 count, where 20,000 would take too long
    spike_settings: Sequence[str] = ("2core",)
    priority_setting = "2core"
    spread_setting = "2core"
    backlog_setting = "1proc"

    def priority_settings(self) -> Setting:
        return self.settings()[self.priority_setting]

    # one call of the peer's API per task
    def enqueue(self, ids: Iterable[int]) -> None:
        raise NotImplementedError

    def schedule(self, items: Iterable[tuple[int, float]]) -> None:
        """Schedule each (id, due wall-clock time)."""
        raise NotImplementedError

    def schedule_priority(self, items: Iterable[tuple[int, float, bool]]) -> None:
        """(id, due, critical?)"""
        raise NotImplementedError

    def ready_count(self, run_dir: Path) -> int:
        """Default: ready-* marker files written by a worker start-up hook."""
        return sum(1 for _ in run_dir.glob("ready-*"))

    def backlog_fetched(self) -> bool:
        """W3: has the worker taken everything it will take? (Celery: the queue is empty.)"""
        return True

    def lead_s(self, n: int) -> float:
        rate = self.measured_enqueue_rate or self.default_enqueue_rate
        # Workers run during W2 enqueues (Celery's take in every ETA message as it comes), which
        # slows enqueueing: assume 40% of the W1 rate, so the last enqueue returns before T.
        return n / (0.4 * rate) + 3.0


def _env(run_dir: Path, redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PEER_BENCH_LOG_DIR=str(run_dir),
        PEER_BENCH_REDIS_URL=redis_url,
        PYTHONPATH=str(HERE),
        PYTHONUNBUFFERED="1",
    )
    return env


class Bench:
    def __init__(self, redis: PrivateRedis, workdir: Path) -> None:
        self.redis = redis
        self.workdir = workdir
        self._runs = 0

    def run_dir(self, label: str) -> Path:
        self._runs += 1
        d = self.workdir / f"{self._runs:03d}-{label}"
        d.mkdir(parents=True)
        return d

    def _start_ready(self, peer: Peer, workers: Workers, run_dir: Path, timeout: float = 60.0) -> float:
        t0 = time.time()
        while peer.ready_count(run_dir) < workers.setting.expect_ready:
            if not workers.alive():
                raise RuntimeError(f"{peer.name}/{workers.setting.name}: a worker exited; see {run_dir}")
            if time.time() - t0 > timeout:
                raise RuntimeError(f"{peer.name}/{workers.setting.name}: not ready after {timeout} s; see {run_dir}")
            time.sleep(0.05)
        return time.time() - t0

    # W1 ---------------------------------------------------------------------------------------

    def w1(self, peer: Peer, setting: Setting, n: int = W1_N) -> dict[str, Any]:
        self.redis.flush()
        run_dir = self.run_dir(f"{peer.name}-w1-{setting.name}")
        ids = range(n)
        t0 = time.perf_counter()
        peer.enqueue(ids)
        enqueue_s = time.perf_counter() - t0
        rate = n / enqueue_s
        previous = peer.measured_enqueue_rate
        peer.measured_enqueue_rate = rate if previous is None else min(rate, previous)
        xlog = ExecLog(run_dir)
        with Workers(setting, run_dir, _env(run_dir, self.redis.url)) as w:
            spawned = w.started_at
            done = xlog.wait(n, time.time() + 600)
            time.sleep(1.0)  # let a late duplicate show
            xlog.count()
        recs = xlog.records()
        check = verify(recs, ids)
        first_start = min(r[1] for r in recs) if recs else math.nan
        last_end = max(r[2] for r in recs) if recs else math.nan
        busy = last_end - first_start
        wall = last_end - spawned
        return {
            "workload": "W1",
            "peer": peer.name,
            "setting": setting.name,
            "n": n,
            "enqueue_s": round(enqueue_s, 3),
            "enqueue_per_s": round(rate, 1),
            "steady_s": round(busy, 3),
            "steady_runs_per_s": round(len(recs) / busy, 1) if done else None,
            "startup_s": round(first_start - spawned, 3),
            "wall_s": round(wall, 3),
            "wall_runs_per_s": round(len(recs) / wall, 1) if done else None,
            **check,
        }

    # W2 ---------------------------------------------------------------------------------------

    def spike(self, peer: Peer, setting: Setting, n: int = SPIKE_N, cap_s: float = CAP_S) -> dict[str, Any]:
        self.redis.flush()
        run_dir = self.run_dir(f"{peer.name}-spike-{setting.name}")
        ids = range(n)
        xlog = ExecLog(run_dir)
        with Workers(setting, run_dir, _env(run_dir, self.redis.url)) as w:
            self._start_ready(peer, w, run_dir)
            due = float(math.ceil(time.time() + peer.lead_s(n)))  # a whole second: RQ keeps seconds
            t0 = time.time()
            peer.schedule((i, due) for i in ids)
            enqueued = time.time()
            done = xlog.wait(n, due + cap_s)
            if done >= n:
                time.sleep(1.0)
            xlog.count()
        recs = xlog.records()
        return {
            "workload": "W2-spike",
            "peer": peer.name,
            "setting": setting.name,
            "n": n,
            "enqueue_per_s": round(n / (enqueued - t0), 1),
            "lead_margin_s": round(due - enqueued, 2),
            **self._lateness(recs, dict.fromkeys(ids, due), due, cap_s),
            **verify(recs, ids),
        }

    def priority(
        self,
        peer: Peer,
        setting: Setting,
        low_n: int = PRIORITY_LOW_N,
        critical_n: int = PRIORITY_CRITICAL_N,
        cap_s: float = CAP_S,
    ) -> dict[str, Any]:
        """50,000 LOW then 100 CRITICAL, all due at T. Stops once every CRITICAL task has
        started (the LOW ones left are not waited for), or at T + cap."""
        self.redis.flush()
        run_dir = self.run_dir(f"{peer.name}-priority-{setting.name}")
        low = list(range(low_n))
        crit = list(range(1_000_000, 1_000_000 + critical_n))
        crit_set = set(crit)
        xlog = ExecLog(run_dir)
        seen_crit: set[int] = set()

        def all_critical_started() -> bool:
            # cheap enough every 50 ms for a file this size only near the end; parse lazily
            if xlog.lines < critical_n:
                return False
            seen_crit.update(r[0] for r in xlog.records() if r[0] in crit_set)
            return len(seen_crit) >= critical_n

        with Workers(setting, run_dir, _env(run_dir, self.redis.url)) as w:
            self._start_ready(peer, w, run_dir)
            due = float(math.ceil(time.time() + peer.lead_s(low_n + critical_n)))
            t0 = time.time()
            peer.schedule_priority([(i, due, False) for i in low] + [(i, due, True) for i in crit])
            enqueued = time.time()
            last_check = [0.0]

            def until() -> bool:
                if time.monotonic() - last_check[0] < 0.5:
                    return False
                last_check[0] = time.monotonic()
                return all_critical_started()

            xlog.wait(low_n + critical_n, due + cap_s, until=until)
            xlog.count()
        recs = xlog.records()
        crit_recs = [r for r in recs if r[0] in crit_set]
        low_recs = [r for r in recs if r[0] not in crit_set]
        crit_late = self._lateness(crit_recs, dict.fromkeys(crit, due), due, cap_s)
        return {
            "workload": "W2-priority",
            "peer": peer.name,
            "setting": setting.name,
            "n_low": low_n,
            "n_critical": critical_n,
            "enqueue_per_s": round((low_n + critical_n) / (enqueued - t0), 1),
            "lead_margin_s": round(due - enqueued, 2),
            "critical": crit_late,
            "low_started_when_last_critical_started": sum(
                1 for r in low_recs if crit_recs and r[1] <= max(c[1] for c in crit_recs)
            ),
            "low_started": len(low_recs),
            "critical_exactly_once": verify(crit_recs, crit)["exactly_once"],
            "duplicates": len(recs) - len({r[0] for r in recs}),
        }

    def spread(
        self, peer: Peer, setting: Setting, n: int = SPREAD_N, over_s: float = SPREAD_OVER_S, cap_s: float = CAP_S
    ) -> dict[str, Any]:
        self.redis.flush()
        run_dir = self.run_dir(f"{peer.name}-spread-{setting.name}")
        ids = range(n)
        xlog = ExecLog(run_dir)
        with Workers(setting, run_dir, _env(run_dir, self.redis.url)) as w:
            self._start_ready(peer, w, run_dir)
            start = float(math.ceil(time.time() + peer.lead_s(n)))
            dues = {i: start + i * over_s / n for i in ids}
            t0 = time.time()
            peer.schedule((i, dues[i]) for i in ids)
            enqueued = time.time()
            done = xlog.wait(n, start + over_s + cap_s)
            if done >= n:
                time.sleep(1.0)
            xlog.count()
        recs = xlog.records()
        lat = self._lateness(recs, dues, start, cap_s)
        return {
            "workload": "W2-spread",
            "peer": peer.name,
            "setting": setting.name,
            "n": n,
            "over_s": over_s,
            "enqueue_per_s": round(n / (enqueued - t0), 1),
            "lead_margin_s": round(start - enqueued, 2),
            "start_lateness_ms": lat["start_lateness_ms"],
            "started": lat["started"],
            "early": lat["early"],
            "t_to_last_start_s": lat["t_to_last_start_s"],
            "t_to_last_end_s": lat["t_to_last_end_s"],
            **verify(recs, ids),
        }

    @staticmethod
    def _lateness(
        recs: Sequence[tuple[int, float, float]], dues: dict[int, float], t: float, cap_s: float
    ) -> dict[str, Any]:
        first: dict[int, tuple[float, float]] = {}
        for task_id, s, e in recs:
            if task_id in dues and (task_id not in first or s < first[task_id][0]):
                first[task_id] = (s, e)
        late = [s - dues[i] for i, (s, _) in first.items()]
        n = len(dues)
        complete = len(first) == n
        return {
            "started": len(first),
            "started_by_120s": sum(1 for i, (s, _) in first.items() if s - dues[i] <= 120.0),
            "started_by_cap": sum(1 for i, (s, _) in first.items() if s - dues[i] <= cap_s),
            "cap_s": cap_s,
            "early": sum(1 for x in late if x < 0),
            "start_lateness_ms": percentiles_ms(late, total=n),
            "t_to_last_start_s": round(max(s for s, _ in first.values()) - t, 3) if complete else None,
            "t_to_last_end_s": round(max(e for _, e in first.values()) - t, 3) if complete else None,
        }

    # W3 ---------------------------------------------------------------------------------------

    def backlog(
        self,
        peer: Peer,
        setting: Setting,
        n: int = BACKLOG_N,
        ahead_s: float = BACKLOG_AHEAD_S,
        settle_timeout_s: float = 420.0,
    ) -> dict[str, Any]:
        self.redis.flush()
        run_dir = self.run_dir(f"{peer.name}-backlog-{setting.name}")
        env = _env(run_dir, self.redis.url)
        with Workers(setting, run_dir, env) as w:  # the idle worker, for its RSS with no backlog
            self._start_ready(peer, w, run_dir)
            time.sleep(2.0)
            idle_rss = w.rss_bytes()
        for marker in run_dir.glob("ready-*"):
            marker.unlink()
        self.redis.flush()
        base = self.redis.used_memory()
        due = time.time() + ahead_s
        t0 = time.perf_counter()
        peer.schedule((i, due) for i in range(n))
        enqueue_s = time.perf_counter() - t0
        queued = self.redis.used_memory()
        keys = self.redis.client.dbsize()
        with Workers(setting, run_dir, env) as w:
            self._start_ready(peer, w, run_dir, timeout=120)
            t_ready = time.time()
            samples: list[int] = []
            while True:
                time.sleep(2.0)
                samples.append(w.rss_bytes())
                stable = len(samples) >= 4 and (max(samples[-4:]) - min(samples[-4:])) < 0.005 * samples[-1] + 2**20
                if (stable and peer.backlog_fetched()) or time.time() - t_ready > settle_timeout_s:
                    break
            held_rss = w.rss_bytes()
            held = self.redis.used_memory()
            settled = peer.backlog_fetched() and stable
            processes = len(w.pids())
        executed = ExecLog(run_dir).count()
        return {
            "workload": "W3",
            "peer": peer.name,
            "setting": setting.name,
            "n": n,
            "ahead_s": ahead_s,
            "enqueue_per_s": round(n / enqueue_s, 1),
            "redis_keys": keys,
            "redis_bytes_per_task_queued": round((queued - base) / n, 1),
            "redis_bytes_per_task_with_worker": round((held - base) / n, 1),
            "worker_processes": processes,
            "worker_idle_rss_mb": round(idle_rss / 2**20, 1),
            "worker_rss_mb": round(held_rss / 2**20, 1),
            "worker_bytes_per_task": round((held_rss - idle_rss) / n, 1),
            "settle_s": round(time.time() - t_ready, 1),
            "settled": settled,
            "executed_early": executed,
        }


# -- driving --------------------------------------------------------------------------------

WORKLOADS = ("w1", "spike", "priority", "spread", "backlog")


def run_peer(bench: Bench, peer: Peer, workloads: Sequence[str], w3_n: int = BACKLOG_N) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    settings = peer.settings()

    def go(label: str, fn: Callable[[], dict[str, Any]]) -> None:
        log(f"{peer.name}: {label}")
        t = time.time()
        try:
            res = fn()
        except Exception as exc:  # report and go on: one peer's failure must not sink the run
            res = {"workload": label, "peer": peer.name, "error": repr(exc)}
        res["duration_s"] = round(time.time() - t, 1)
        res["loadavg_after"] = os.getloadavg()[0]
        log(f"  -> {summarize(res)}")
        out.append(res)

    for wl in workloads:
        if wl == "w1":
            for s in peer.w1_settings:
                go(f"W1/{s}", lambda s=s: bench.w1(peer, settings[s], n=peer.w1_n.get(s, W1_N)))
        elif wl == "spike":
            for s in peer.spike_settings:
                go(f"W2-spike/{s}", lambda s=s: bench.spike(peer, settings[s]))
        elif wl == "priority":
            if peer.supports_priority:
                go(f"W2-priority/{peer.priority_setting}", lambda: bench.priority(peer, peer.priority_settings()))
        elif wl == "spread":
            go(f"W2-spread/{peer.spread_setting}", lambda: bench.spread(peer, settings[peer.spread_setting]))
        elif wl == "backlog":
            go(f"W3/{peer.backlog_setting}", lambda: bench.backlog(peer, settings[peer.backlog_setting], n=w3_n))
    return out


def summarize(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    wl = r["workload"]
    if wl == "W1":
        return (
            f"enqueue {r['enqueue_per_s']:.0f}/s, steady {r['steady_runs_per_s']}/s, wall {r['wall_s']} s "
            f"({r['wall_runs_per_s']}/s), once={r['exactly_once']} dup={r['duplicates']} miss={r['missing']}"
        )
    if wl in ("W2-spike", "W2-spread"):
        p = r["start_lateness_ms"]
        return (
            f"lateness ms p50 {p['p50']} p95 {p['p95']} p99 {p['p99']} max {p['max']}; started {r['started']}"
            f"/{r['n']}; margin {r['lead_margin_s']} s; last end {r.get('t_to_last_end_s')}"
        )
    if wl == "W2-priority":
        p = r["critical"]["start_lateness_ms"]
        return (
            f"CRITICAL lateness ms p50 {p['p50']} p99 {p['p99']} max {p['max']}; LOW started by then "
            f"{r['low_started_when_last_critical_started']}; margin {r['lead_margin_s']} s"
        )
    if wl == "W3":
        return (
            f"redis {r['redis_bytes_per_task_queued']} B/task "
            f"(with worker {r['redis_bytes_per_task_with_worker']}),"
            f" worker RSS {r['worker_rss_mb']} MB (idle {r['worker_idle_rss_mb']}), "
            f"{r['worker_bytes_per_task']} B/task, settled={r['settled']}"
        )
    return json.dumps(r)


def machine_facts(redis: PrivateRedis, peers: Sequence[Peer]) -> dict[str, Any]:
    def ver(d: str) -> str | None:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            return None

    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(os.sysconf("SC_PHYS_PAGES") * PAGE / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "redis_server": redis.version,
        "versions": {d: ver(d) for d in ("celery", "kombu", "billiard", "dramatiq", "huey", "rq", "redis", "hiredis")},
        "peers": {
            p.name: {
                s.name: {"commands": [" ".join(c[1:]) for c in s.commands], "note": s.note}
                for s in p.settings().values()
            }
            for p in peers
        },
    }


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so worker groups and the private redis-server get stopped."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def cli_main(peer_cls: type[Peer]) -> None:
    """`python <peer>_bench.py [--workloads w1,spike,...] [--repeat N]`: print each run's figures."""
    parser = argparse.ArgumentParser(description=f"{peer_cls.name} peer benchmark")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated of {WORKLOADS}")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--w3-n", type=int, default=BACKLOG_N)
    parser.add_argument("--w1-settings", help="comma-separated W1 settings (default: the peer's pair)")
    parser.add_argument("--w1-n", type=int, help="W1 task count (default 20,000, or the peer's smaller one)")
    parser.add_argument("--json", type=Path, help="also write the runs here")
    args = parser.parse_args()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    stop_on_sigterm()
    redis = PrivateRedis()
    workdir = Path(tempfile.mkdtemp(prefix=f"peer-bench-{peer_cls.name}-"))
    try:
        peer = peer_cls(redis.url)
        if args.w1_settings:
            peer.w1_settings = tuple(args.w1_settings.split(","))
        if args.w1_n:
            peer.w1_n = dict.fromkeys(peer.settings(), args.w1_n)
        bench = Bench(redis, workdir)
        runs = []
        for k in range(args.repeat):
            log(f"== repeat {k + 1}/{args.repeat}")
            runs += run_peer(bench, peer, workloads, w3_n=args.w3_n)
        if args.json:
            args.json.write_text(json.dumps({"facts": machine_facts(redis, [peer]), "runs": runs}, indent=1))
        for r in runs:
            print(f"{r['peer']:9} {r['workload']:12} {r.get('setting', ''):10} {summarize(r)}")
    finally:
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def median_min_max(values: Sequence[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(vals), 1),
        "min": round(min(vals), 1),
        "max": round(max(vals), 1),
        "n": len(vals),
    }


@dataclass
class Row:
    key: tuple[str, str, str]
    metrics: dict[str, list[Any]] = field(default_factory=dict)
