"""What the daemon registry and the gauges cost: W1 with them off and on, and each call timed.

    python benchmarks/observe_cost.py --stack sqlite --repeat 3
    python benchmarks/observe_cost.py --stack postgres-redis --repeat 3

1. Calls: on a store holding W1's end state (20,000 runs, 1% still waiting), the median time of
   one heartbeat (`Registrar.run_once` for the five roles), one overview (census, registry read,
   broker depth per tier), one full `/metrics` scrape with the gauges, and one census that also
   counts the finished runs (what SQLite does once a minute); then one overview with as many runs
   again all waiting (W1's start: the census reads every waiting run).
2. W1 off/on, interleaved (off, on, off, on, ...) so that drift on a shared machine hits both:
   off is `JOBQ_REGISTRY_HEARTBEAT_S=0` and no scrape; on is the default heartbeat (5 s) in every
   daemon plus an overview read every `--scrape-every` seconds: 3 s by default, what Prometheus'
   default 15 s interval costs when it scrapes the five processes of W1 (each reads its own).

Figures print and go to benchmarks/results/observe-cost-<stack>-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import STACKS, stack

from jobq.bench import Bench
from jobq.daemons.beat import Beat
from jobq.daemons.reaper import Reaper
from jobq.daemons.registrar import Presence, Registrar
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.gauges import register_gauges
from jobq.metrics import METRICS
from jobq.models import Job, JobKey, Priority, Run, RunState, Schedule, ScheduleType, TaskTarget
from jobq.overview import take_overview
from jobq.registry import Role
from jobq.settings import Settings
from jobq.tasks import TaskRegistry
from jobq.wiring import connect

RESULTS = Path(__file__).resolve().parent / "results"


def _median_ms(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _w1_end_state(runs: int, now_ms: int, prefix: str = "job", waiting: bool = False) -> list[tuple[Job, list[Run]]]:
    items = []
    for i in range(runs):
        key = JobKey("default", f"{prefix}_{i:08d}")
        job = Job.model_validate(
            {
                "job_id": key.job_id,
                "name": "bench",
                "target": TaskTarget(task="jobq.bench.noop"),
                "schedule": Schedule(type=ScheduleType.IMMEDIATE),
                "created_ms": now_ms,
                "updated_ms": now_ms,
            }
        )
        state = RunState.SUCCEEDED if i % 100 and not waiting else RunState.SCHEDULED
        run = Run.model_validate(
            {
                "run_id": Run.make_id(key, now_ms),
                "job_id": key.job_id,
                "nominal_ms": now_ms,
                "due_ms": now_ms,
                "priority": Priority.DEFAULT,
                "state": state,
                "created_ms": now_ms,
                "updated_ms": now_ms,
            }
        )
        items.append((job, [run]))
    return items


def calls(stack_name: str, runs: int) -> dict[str, float]:
    with stack(stack_name, log_level="WARNING") as urls:
        d = connect(Settings.load(urls, env={}))
        try:
            now = d.clock.now_ms()
            items = _w1_end_state(runs, now)
            for start in range(0, len(items), 1000):
                d.store.create_jobs(items[start : start + 1000])
            worker = Worker(d, TaskRegistry(), background=False)
            daemons = [Beat(d), Scanner(d), Reaper(d), worker, Presence(d, Role.API)]
            registrar = Registrar(d, daemons)
            clock = [0.0]
            cache = register_gauges(d, monotonic=lambda: clock[0])

            def scrape() -> None:
                clock[0] += 60  # every scrape finds the cached overview stale, as one every 15 s would
                METRICS.render()

            def census_with_finished_scan() -> None:
                if hasattr(d.store, "_finished"):
                    d.store._finished = None  # SQLite: the scan of finished runs it makes once a minute
                d.census.census(d.clock.now_ms())

            figures = {
                "census_with_finished_scan_ms": _median_ms(census_with_finished_scan, 10),
                "heartbeat_ms": _median_ms(lambda: registrar.run_once(d.clock.now_ms()), 50),
                "overview_ms": _median_ms(lambda: take_overview(d, d.clock.now_ms()), 20),
                "scrape_ms": _median_ms(scrape, 20),
            }
            assert cache.reads == 20, "one overview per scrape"
            # W1's start: as many runs again, all waiting (the census reads every waiting run).
            waiting = _w1_end_state(runs, now, prefix="wait", waiting=True)
            for start in range(0, len(waiting), 1000):
                d.store.create_jobs(waiting[start : start + 1000])
            figures["overview_all_waiting_ms"] = _median_ms(lambda: take_overview(d, d.clock.now_ms()), 20)
            return figures
        finally:
            d.close()


def _w1(stack_name: str, runs: int, on: bool, scrape_every_s: float) -> float:
    previous = os.environ.get("JOBQ_REGISTRY_HEARTBEAT_S")
    os.environ["JOBQ_REGISTRY_HEARTBEAT_S"] = "5" if on else "0"
    try:
        with stack(stack_name, log_level="WARNING") as urls:
            d = connect(Settings.load(urls, env={}))
            stop = threading.Event()
            scraper = None
            if on:

                def scrape() -> None:
                    while not stop.wait(scrape_every_s):
                        take_overview(d, d.clock.now_ms())

                scraper = threading.Thread(target=scrape, daemon=True)
                scraper.start()
            try:
                result = Bench(d, workers=1, concurrency=64).instant(runs)
                assert result.executed_once
                return result.runs_per_s
            finally:
                stop.set()
                if scraper is not None:
                    scraper.join(10)
                d.close()
    finally:
        if previous is None:
            os.environ.pop("JOBQ_REGISTRY_HEARTBEAT_S", None)
        else:
            os.environ["JOBQ_REGISTRY_HEARTBEAT_S"] = previous


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=STACKS, default="sqlite")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--scrape-every", type=float, default=3.0, help="seconds between overview reads when on")
    parser.add_argument("--calls-only", action="store_true", help="time the calls, skip the W1 runs")
    args = parser.parse_args()

    figures = calls(args.stack, args.runs)
    print(json.dumps(figures, indent=1), flush=True)
    if args.calls_only:
        return
    off: list[float] = []
    on: list[float] = []
    for i in range(args.repeat):
        off.append(_w1(args.stack, args.runs, False, args.scrape_every))
        on.append(_w1(args.stack, args.runs, True, args.scrape_every))
        print(f"  #{i + 1}: W1 off {off[-1]:,.0f} runs/s, on {on[-1]:,.0f} runs/s", flush=True)

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    doc: dict[str, Any] = {
        "stack": args.stack,
        "runs": args.runs,
        "scrape_every_s": args.scrape_every,
        "calls": figures,
        "w1_runs_per_s": {"off": spread(off), "on": spread(on)},
        "on_vs_off": statistics.median(on) / statistics.median(off) - 1,
        # Per process: one heartbeat every 5 s; per scrape of one process: one overview.
        "heartbeat_share_of_a_core": figures["heartbeat_ms"] / 5000,
        "scrape_share_of_a_core_at_15s": figures["scrape_ms"] / 15000,
        "finished_scan_share_of_a_core": figures["census_with_finished_scan_ms"] / 60000,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(doc, indent=1))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"observe-cost-{args.stack}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
