"""Worker pools measured (issue 13), on demand, never in tests:

    python benchmarks/pools.py w1 --runs 20000            # W1 on every pool, 1 and 2 workers
    python benchmarks/pools.py io --runs 10000            # 100 ms sleeps: gevent, asyncio, Celery gevent
    python benchmarks/pools.py cpu --runs 200             # pure Python spins: prefork vs threads, -c 2
                                                          # (--spin-n 1300000: ~55 ms each on this machine)
    python benchmarks/pools.py hardlimit                  # a task looping forever under a 1 s limit
    python benchmarks/pools.py autoscale --runs 5000      # a burst of 50 ms sleeps, --autoscale 64,2
    python benchmarks/pools.py memory --runs 300          # a leaking task, with and without recycling

Every jobq figure comes from the runs' own `started_ms`/`finished_ms` (first start to last finish),
on a fresh deployment of the chosen stack (default PostgreSQL + Redis). Celery needs
`pip install -r benchmarks/peers/requirements.txt` and gevent; its figures come from each task's own
start and end times. Results go to benchmarks/results/pools-<what>-<date>.json with the load
average seen at the start: the machine is shared, so compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import REDIS, STACKS, stack

from jobq.bench import FOREVER, LEAK, NOOP, SLEEP, SLEEP_ASYNC, SPIN, Bench, Result
from jobq.client import Client
from jobq.models import RetryPolicy, RunState, TaskTarget
from jobq.settings import Settings
from jobq.submission import JobSpec
from jobq.wiring import connect

RESULTS = Path(__file__).resolve().parent / "results"
W1_CONCURRENCY = {"prefork": 4, "threads": 64, "gevent": 64, "asyncio": 64, "solo": 1}


def bench(stack_name: str, pool: str, concurrency: int, task: str, n: int, args: list[Any], workers: int = 1) -> Result:
    with stack(stack_name, log_level="WARNING") as urls:
        d = connect(Settings.load(urls, env={}))
        try:
            return Bench(d, workers=workers, concurrency=concurrency, pool=pool).instant(n, task=task, args=args)
        finally:
            d.close()


def row(label: str, result: Result) -> dict[str, Any]:
    rate, batch = result.runs_per_s, result.elapsed_s
    print(f"  {label:<40} {rate:>10,.0f} runs/s  batch {batch:6.2f} s  once={result.executed_once}")
    return {"label": label, "runs_per_s": result.runs_per_s, "batch_s": result.elapsed_s, "once": result.executed_once}


def w1(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for workers in args.workers:
        for pool in args.pools.split(","):
            c = args.w1_concurrency or W1_CONCURRENCY[pool]
            out.append(row(f"W1 {pool} -c {c} x{workers}", bench(args.stack, pool, c, NOOP, args.runs, [], workers)))
    return out


def io(args: argparse.Namespace) -> list[dict[str, Any]]:
    n, c = args.runs, args.concurrency
    out = [row(f"noop drain, threads -c 64 ({n})", bench(args.stack, "threads", 64, NOOP, n, []))]
    out.append(row(f"sleep 0.1 s, gevent -c {c}", bench(args.stack, "gevent", c, SLEEP, n, [0.1])))
    out.append(row(f"async sleep 0.1 s, asyncio -c {c}", bench(args.stack, "asyncio", c, SLEEP_ASYNC, n, [0.1])))
    try:
        out.append(celery_io(n, c))
    except Exception as exc:  # no Celery here: say so in the results
        print(f"  Celery -P gevent: not run ({exc})")
        out.append({"label": "celery gevent", "error": str(exc)})
    return out


CELERY_TASKS = textwrap.dedent(
    """
    import os, time
    from celery import Celery

    app = Celery("pools_io", broker=os.environ["BENCH_BROKER"])
    app.conf.worker_prefetch_multiplier = 4

    @app.task(name="bench.sleep")
    def sleep(i):
        start = time.time()
        time.sleep(0.1)
        fd = os.open(os.environ["BENCH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{i} {start:.6f} {time.time():.6f}\\n".encode())
        os.close(fd)
    """
)


def celery_io(n: int, concurrency: int) -> dict[str, Any]:
    import redis

    work = Path(tempfile.mkdtemp(prefix="celery-io-"))
    (work / "pools_io.py").write_text(CELERY_TASKS)
    broker = REDIS.rsplit("/", 1)[0] + "/7"  # a database of its own, flushed before and after
    redis.Redis.from_url(broker).flushdb()
    log = work / "executed.log"
    env = {**os.environ, "BENCH_BROKER": broker, "BENCH_LOG": str(log), "PYTHONPATH": str(work)}
    sys.path.insert(0, str(work))
    os.environ.update(BENCH_BROKER=broker, BENCH_LOG=str(log))
    import pools_io  # type: ignore[import-not-found]

    for i in range(n):
        pools_io.sleep.delay(i)
    celery = str(Path(sys.executable).parent / "celery")
    command = [celery, "-A", "pools_io", "worker", "-P", "gevent", "-c", str(concurrency), "--loglevel", "WARNING"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    proc = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while _lines(log) < n and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        redis.Redis.from_url(broker).flushdb()
    records = [line.split() for line in log.read_text().splitlines()]
    ids = [int(r[0]) for r in records]
    first, last = min(float(r[1]) for r in records), max(float(r[2]) for r in records)
    rate = len(records) / (last - first)
    once = sorted(ids) == list(range(n))
    label = f"sleep 0.1 s, Celery -P gevent -c {concurrency}"
    print(f"  {label:<40} {rate:>10,.0f} runs/s  batch {last - first:6.2f} s  once={once}")
    return {"label": f"celery gevent -c {concurrency}", "runs_per_s": rate, "batch_s": last - first, "once": once}


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def cpu(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for pool in ("threads", "prefork"):
        result = bench(args.stack, pool, 2, SPIN, args.runs, [args.spin_n] if args.spin_n else [])
        utilisation = result.notes.get("slot_utilisation", 0.0)
        line = row(f"spin, {pool} -c 2", result)
        print(f"  {'':<40} slot utilisation {utilisation:.3f} (start write to outcome, over 2 slots)")
        out.append({**line, "slot_utilisation": utilisation})
    return out


@contextmanager
def daemons(urls: dict[str, str], worker: list[str], port: int) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    env = {**os.environ, **{f"JOBQ_{k.upper()}": v for k, v in urls.items()}, "JOBQ_LOG_LEVEL": "INFO"}
    env["JOBQ_BENCH_LOG_DIR"] = tempfile.mkdtemp(prefix="executed-")
    jobq = [sys.executable, "-m", "jobq.cli"]
    log = open(Path(env["JOBQ_BENCH_LOG_DIR"]) / "worker.log", "wb")  # noqa: SIM115
    procs = [
        subprocess.Popen([*jobq, name], env=env, stdout=subprocess.DEVNULL) for name in ("beat", "scanner", "reaper")
    ]
    w = subprocess.Popen(
        [*jobq, "worker", "-A", "jobq.bench", "--metrics-port", str(port), *worker], env=env, stdout=log, stderr=log
    )
    try:
        yield w, Path(env["JOBQ_BENCH_LOG_DIR"])
    finally:
        for p in [*procs, w]:
            p.send_signal(signal.SIGTERM)
        for p in [*procs, w]:
            p.wait(60)


def metric(port: int, name: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def spec(task: str, args: list[Any], retry: RetryPolicy | None = None) -> JobSpec:
    fields: dict[str, Any] = {"schedule_type": "IMMEDIATE", "target": TaskTarget(task=task), "job_name": "bench"}
    fields["payload"] = {"args": args, "kwargs": {}}
    if retry is not None:
        fields["retry_policy"] = retry
    return JobSpec.model_validate(fields)


def hardlimit(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    with stack(args.stack) as urls:
        d = connect(Settings.load(urls, env={}))
        client = Client(d)
        with daemons(urls, ["-P", "prefork", "-c", "1", "--time-limit", "1"], 9465):
            time.sleep(3)
            for _ in range(args.repeat):
                stuck = client.submit(spec(FOREVER, [], RetryPolicy(max_retries=0))).job
                after = client.submit(spec(NOOP, [])).job
                ran = client.wait(after.job_id, timeout_s=60)
                killed = client.wait(stuck.job_id, timeout_s=60)
                assert killed.state is RunState.FAILED and killed.started_ms and killed.finished_ms
                held_s = (killed.finished_ms - killed.started_ms) / 1000
                next_s = ((ran.started_ms or 0) - killed.finished_ms) / 1000
                print(
                    f"  limit 1 s: stopped {held_s:.2f} s after its start; the next task started {next_s:.2f} s later"
                )
                out.append({"stopped_after_s": held_s, "next_started_after_s": next_s, "error": killed.last_error})
        d.close()
    return out


def autoscale(args: argparse.Namespace) -> list[dict[str, Any]]:
    port = 9466
    samples: list[tuple[float, float]] = []
    with stack(args.stack) as urls:
        d = connect(Settings.load(urls, env={}))
        client = Client(d)
        worker = ["-P", args.pool, "-c", "2", "--autoscale", "64,2"]
        with daemons(urls, worker, port) as (_, logs):
            while metric(port, "jobq_worker_pool_size") is None:
                time.sleep(0.2)
            t0 = time.time()
            client.submit_many([spec(SLEEP, [0.05]) for _ in range(args.runs)])
            drained_at = grown_at = None
            while time.time() - t0 < 300:
                size = metric(port, "jobq_worker_pool_size") or 0
                samples.append((time.time() - t0, size))
                if grown_at is None and size > 2:
                    grown_at = time.time() - t0
                if drained_at is None and _executed(logs) >= args.runs:
                    drained_at = time.time() - t0
                if drained_at is not None and size == 2:
                    break
                time.sleep(0.25)
        d.close()
    peak = max(s for _, s in samples)
    back = samples[-1][0] if samples[-1][1] == 2 else None
    print(f"  {args.pool}: grew after {grown_at} s to a peak of {peak:g}; drained at {drained_at} s; at 2 at {back} s")
    return [
        {
            "pool": args.pool,
            "grew_after_s": grown_at,
            "peak": peak,
            "drained_at_s": drained_at,
            "back_to_min_at_s": back,
            "samples": samples,
        }
    ]


def memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for label, extra in (("no recycling", []), ("--max-memory-per-child 204800", ["--max-memory-per-child", "204800"])):
        with stack(args.stack) as urls:
            d = connect(Settings.load(urls, env={}))
            client = Client(d)
            with daemons(urls, ["-P", "prefork", "-c", "2", *extra], 9467) as (w, logs):
                time.sleep(3)
                client.submit_many([spec(LEAK, [4096]) for _ in range(args.runs)])
                peak = 0
                while _executed(logs) < args.runs:
                    peak = max(peak, _tree_rss_kib(w.pid))
                    time.sleep(0.25)
                end = _tree_rss_kib(w.pid)
            d.close()
        print(f"  {label:<32} worker + children RSS: peak {peak / 1024:,.0f} MiB, at the end {end / 1024:,.0f} MiB")
        out.append({"label": label, "peak_mib": peak / 1024, "end_mib": end / 1024})
    return out


def _executed(logs: Path) -> int:
    return sum(p.read_text().count("\n") for p in logs.glob("executed-*.log"))


def _tree_rss_kib(pid: int) -> int:
    total = 0
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    for p in pids:
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        except OSError:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["w1", "io", "cpu", "hardlimit", "autoscale", "memory"])
    parser.add_argument("--stack", choices=STACKS, default="postgres-redis")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--pools", default="prefork,threads,gevent,asyncio,solo")
    parser.add_argument("--pool", default="threads", help="autoscale: the pool to grow")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spin-n", type=int, default=None, help="cpu: loop count of each spin (600,000: ~23 ms here)")
    parser.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    parser.add_argument("--w1-concurrency", type=int, default=None, help="w1: one -c for every pool")
    args = parser.parse_args()
    defaults = {"w1": 20_000, "io": 10_000, "cpu": 200, "hardlimit": 0, "autoscale": 5_000, "memory": 300}
    args.runs = args.runs or defaults[args.what]
    load = os.getloadavg()
    print(f"{args.what} on {args.stack}, load average {load[0]:.1f} (2 cores, shared)")
    results = globals()[args.what](args)
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "what": args.what,
        "stack": args.stack,
        "runs": args.runs,
        "load_average_at_start": load,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }
    path = RESULTS / f"pools-{args.what}-{args.stack}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
