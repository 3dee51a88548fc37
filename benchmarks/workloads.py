"""W1 and W2 on a chosen stack, several times each: medians with min and max.

    python benchmarks/workloads.py --stack postgres-redis --repeat 3
    python benchmarks/workloads.py --stack sqlite --only w1 --workers 2

Each repetition runs on a fresh deployment (new schema, key prefix or file). Figures print as a
table and go to benchmarks/results/jobq-<stack>-<date>.json with the machine's facts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import STACKS, stack

from jobq.bench import Bench, Result
from jobq.settings import Settings
from jobq.wiring import connect

RESULTS = Path(__file__).resolve().parent / "results"


def _once(name: str, workload: Callable[[Bench], Result], workers: int, concurrency: int) -> Result:
    # Quiet logs and a history that keeps up: the bench measures dispatch, not logging.
    with stack(name, log_level="WARNING") as urls:
        d = connect(Settings.load(urls, env={}))
        try:
            return workload(Bench(d, workers=workers, concurrency=concurrency))
        finally:
            d.close()


def _summary(results: list[Result]) -> dict[str, Any]:
    def spread(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    out: dict[str, Any] = {"name": results[0].name, "runs": results[0].runs, "repeats": len(results)}
    out["executed_once"] = all(r.executed_once for r in results)
    if results[0].runs_per_s:
        out["runs_per_s"] = spread([r.runs_per_s for r in results])
        out["enqueue_per_s"] = spread([r.enqueue_per_s for r in results])
        out["wall_s"] = spread([r.notes.get("wall_s", 0.0) for r in results])
    for key in ("dispatch_lateness_ms", "start_lateness_ms"):
        if getattr(results[0], key) is not None:
            out[key] = {q: spread([getattr(getattr(r, key), q) for r in results]) for q in ("p50", "p95", "p99", "max")}
    if results[0].elapsed_s and not results[0].runs_per_s:
        out["all_ran_s"] = spread([r.elapsed_s for r in results])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=STACKS, default="sqlite")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--only", choices=["w1", "spike", "priority", "spread"], action="append")
    parser.add_argument("--scale", type=float, default=1.0, help="share of the issue's run counts")
    parser.add_argument(
        "--lead",
        type=float,
        default=90.0,
        help="seconds from the start of submission to the instant W2 priority's runs are due; more than "
        "the submission time plus the horizon (60 s) puts every run beyond the horizon when submitted",
    )
    parser.add_argument(
        "--spike-lead", type=float, default=15.0, help="seconds between submitting a spike and its due time"
    )
    args = parser.parse_args()
    n = lambda k: max(10, round(k * args.scale))  # noqa: E731
    workloads: dict[str, Callable[[Bench], Result]] = {
        "w1": lambda b: b.instant(n(20_000)),
        "spike": lambda b: b.spike(n(10_000), lead_s=args.spike_lead),
        "priority": lambda b: b.spike(n(50_000), lead_s=args.lead, critical=100),
        "spread": lambda b: b.spread(n(1_000), over_s=10),
    }
    chosen = args.only or list(workloads)
    summaries = []
    for key in chosen:
        results = []
        for i in range(args.repeat):
            result = _once(args.stack, workloads[key], args.workers, args.concurrency)
            results.append(result)
            print(
                f"  {result.name} #{i + 1}: runs/s {result.runs_per_s:,.0f} "
                f"start p99 {result.start_lateness_ms.p99 if result.start_lateness_ms else 0:,.0f} ms "
                f"once={result.executed_once}",
                flush=True,
            )
        summaries.append(_summary(results))
        print(json.dumps(summaries[-1], indent=1), flush=True)
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "stack": args.stack,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "scale": args.scale,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": summaries,
    }
    path = RESULTS / f"jobq-{args.stack}-w{args.workers}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
