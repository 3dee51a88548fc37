"""W3 backlog: schedule N runs due within the hour and measure what holding them costs.

    python benchmarks/backlog.py --runs 1000000            # PostgreSQL store, Redis index
    python benchmarks/backlog.py --runs 200000 --stack sqlite

Reports the schedule rate (bulk submission), time-index memory per run (`INFO memory` of a
redis-server of the benchmark's own), store size per run, a worker's RSS with the backlog held
against an empty deployment, and the cost of an idle scanner tick with the backlog present and
without it. The horizon is two hours, as the design sizes the index, so every run is indexed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import POSTGRES, private_redis, stack

from jobq.bench import Bench
from jobq.daemons.scanner import Scanner
from jobq.deployment import Deployment
from jobq.settings import Settings
from jobq.wiring import connect

RESULTS = Path(__file__).resolve().parent / "results"


def used_memory(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


def store_bytes(d: Deployment, urls: dict[str, str]) -> int:
    if urls["store"].startswith("sqlite"):
        path = Path(urls["store"].removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    import psycopg

    schema = urls["store"].split("schema=")[1].split("&")[0]
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'VACUUM ANALYZE "{schema}".jobq_runs')
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname IN ('jobq_jobs', 'jobq_runs')",
            [schema],
        ).fetchone()
    return int(row[0] or 0)


def worker_rss_kib(urls: dict[str, str], settle_s: float = 6.0) -> int:
    """The RSS of an idle worker process on this deployment, after it has settled."""
    env = {**os.environ, **{f"JOBQ_{k.upper()}": v for k, v in urls.items()}}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobq.cli", "worker", "-A", "jobq.bench", "-c", "64"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(settle_s)
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def idle_tick_ms(d: Deployment, ticks: int = 200) -> float:
    """The median cost of a scanner pass when nothing is due."""
    scanner = Scanner(d)
    times = []
    for _ in range(ticks):
        started = time.perf_counter()
        scanner.run_once(d.clock.now_ms())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--stack", choices=["postgres-redis", "sqlite"], default="postgres-redis")
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args()
    report: dict[str, Any] = {"runs": args.runs, "stack": args.stack}
    with private_redis() as redis_url, stack(args.stack, redis_url=redis_url, horizon_s="7200") as urls:
        d = connect(Settings.load(urls, env={}))
        try:
            report["idle_tick_ms_empty"] = idle_tick_ms(d)
            report["worker_rss_kib_empty"] = worker_rss_kib(urls)
            memory_before = used_memory(redis_url)
            size_before = store_bytes(d, urls)
            bench = Bench(d)
            now = d.clock.now_ms()
            started = time.perf_counter()
            for start in range(0, args.runs, args.batch):
                count = min(args.batch, args.runs - start)
                due = [now + 1_800_000 + (start + i) * 1_800_000 // args.runs for i in range(count)]
                bench.client.submit_many([bench._spec("ONE_OFF", run_at=ms) for ms in due])
                if start // args.batch % 50 == 0:
                    print(f"  scheduled {start + count:,}", flush=True)
            elapsed = time.perf_counter() - started
            report["schedule_per_s"] = args.runs / elapsed
            if not urls["store"].startswith("sqlite"):
                report["index_bytes_per_run"] = (used_memory(redis_url) - memory_before) / args.runs
            report["store_bytes_per_run"] = (store_bytes(d, urls) - size_before) / args.runs
            report["idle_tick_ms_backlog"] = idle_tick_ms(d)
            report["worker_rss_kib_backlog"] = worker_rss_kib(urls)
        finally:
            d.close()
    report["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(report, indent=1))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"backlog-{args.stack}-{args.runs}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
