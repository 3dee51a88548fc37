"""CPU, round trips and bytes per run by role, in one process on PostgreSQL + Redis (docs/capacity.md).

    .venv/bin/python benchmarks/role_cost.py [--runs 5000] [--repeat 3]

Each repetition makes a fresh deployment (`stacks.stack("postgres-redis")`: a PostgreSQL schema, a
Redis index and broker prefix), then times each role's own work with the CPU clock of the process
(`time.process_time`: every thread of this process, none of the servers'):

* client: `submit_many` of `--runs` one-off jobs due now, 1,000 per call (the bulk path), and 500
  single `submit` calls;
* scanner: `Scanner.run_once` until nothing is due (claim in the index, claim in the store, jobs
  read, publish, DISPATCHED written), with the index's Redis round trips counted;
* worker: a `threads -c 64` worker (its completer stepped by hand) consuming, starting, running
  the no-op task, completing and acking every run.

Bytes: the envelope on the broker, a run's and a job's DynamoDB item (DynamoDB's own size rules:
attribute names plus values, numbers at about one byte per two digits), a run's row in
PostgreSQL (`pg_column_size`), a history event as JSON. Raw JSON goes to
`benchmarks/results/role-cost-<date>.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import POSTGRES, machine, result_stem, stack

from jobq.bench import NOOP, Bench, bench_app
from jobq.codec import encode, envelope_for
from jobq.daemons.base import event
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.ports import RunQuery
from jobq.settings import Settings
from jobq.store.dynamodb_items import job_item, run_item
from jobq.wiring import connect


def dynamodb_size(item: dict[str, Any]) -> int:
    """An item's size by DynamoDB's rules: UTF-8 name + value; a number about 1 byte per 2 digits + 1."""
    size = 0
    for name, value in item.items():
        size += len(name.encode())
        ((kind, raw),) = value.items()
        if kind == "S":
            size += len(raw.encode())
        elif kind == "N":
            size += len(raw.lstrip("-").replace(".", "")) // 2 + 1
        elif kind in {"BOOL", "NULL"}:
            size += 1
        else:
            size += len(json.dumps(raw))
    return size


def one(runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with stack("postgres-redis") as urls:
        d = connect(Settings.load({**urls, "history_flush_s": "0"}, env={}))
        bench = Bench(d)
        worker = Worker(d, bench_app.registry, concurrency=64, background=False)
        worker.start()
        try:
            now = d.clock.now_ms()
            cpu = time.process_time()
            for start in range(0, runs, 1000):
                count = min(1000, runs - start)
                bench.client.submit_many([bench._spec("ONE_OFF", run_at=now + 1) for _ in range(count)])
            out["client submit_many cpu_us/run"] = (time.process_time() - cpu) / runs * 1e6
            cpu = time.process_time()
            singles = [bench.client.submit(bench._spec("ONE_OFF", run_at=now + 1)) for _ in range(500)]
            out["client submit cpu_us/run"] = (time.process_time() - cpu) / len(singles) * 1e6
            total = runs + len(singles)
            d.store.analyze()  # type: ignore[attr-defined]
            time.sleep(0.01)

            scanner = Scanner(d, scanner_id="scanner-cost")
            trips, cpu, passes, dispatched = scanner.index.round_trips, time.process_time(), 0, 0  # type: ignore[attr-defined]
            while n := scanner.run_once(d.clock.now_ms()):
                dispatched += n
                passes += 1
            out["scanner cpu_us/run"] = (time.process_time() - cpu) / dispatched * 1e6
            out["scanner passes"] = passes
            out["scanner index round trips/pass"] = (scanner.index.round_trips - trips) / passes  # type: ignore[attr-defined]
            assert dispatched == total, (dispatched, total)

            cpu, done, wall = time.process_time(), 0, time.perf_counter()
            while done < total:
                worker.run_once(d.clock.now_ms(), wait_s=0.05)
                worker.state.wait(lambda: worker.state.executing() == 0, 10)  # a full completion batch
                done += worker.complete_once(d.clock.now_ms())
            assert worker.wait_idle(60)
            out["worker cpu_us/run"] = (time.process_time() - cpu) / total * 1e6
            out["worker wall runs/s"] = total / (time.perf_counter() - wall)

            job = d.store.get_jobs([singles[0].job.key])[singles[0].job.key]
            run = d.store.list_runs(RunQuery(job=job.key, limit=1)).items[0]
            out["bytes envelope"] = len(encode(envelope_for(run, job)))
            out["bytes dynamodb run item"] = dynamodb_size(run_item(run))
            out["bytes dynamodb job item"] = dynamodb_size(job_item(job))
            out["bytes history event json"] = len(event(run, "SUCCEEDED", now).model_dump_json())
            import psycopg

            schema = urls["store"].split("schema=")[1].split("&")[0]
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                row = conn.execute(f'SELECT avg(pg_column_size(r.*)) FROM "{schema}".jobq_runs r').fetchone()
                out["bytes postgres run row"] = float(row[0]) if row else 0.0
                row = conn.execute(f'SELECT avg(pg_column_size(j.*)) FROM "{schema}".jobq_jobs j').fetchone()
                out["bytes postgres job row"] = float(row[0]) if row else 0.0
        finally:
            worker.shutdown()
            d.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    results = []
    for i in range(args.repeat):
        results.append(one(args.runs))
        print(f"run {i + 1}: {json.dumps(results[-1])}", flush=True)
    summary = {
        name: {
            "median": statistics.median(r[name] for r in results),
            "min": min(r[name] for r in results),
            "max": max(r[name] for r in results),
        }
        for name in results[0]
    }
    report = {
        "runs": args.runs,
        "task": NOOP,
        "repeats": results,
        "summary": summary,
        "machine": machine(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for name, s in summary.items():
        print(f"  {name:36} median {s['median']:>10,.1f}   min {s['min']:>10,.1f}   max {s['max']:>10,.1f}")
    path = result_stem("role-cost").with_suffix(".json")
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
