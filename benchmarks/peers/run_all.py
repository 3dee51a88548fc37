"""Run every workload for every peer N times against a private redis-server; write
`benchmarks/results/peers-<date>.json` and print a table of medians (min-max).

    .venv/bin/python benchmarks/peers/run_all.py                       # everything, 3 times
    .venv/bin/python benchmarks/peers/run_all.py --priority-repeat 1 --w3-repeat 1
    .venv/bin/python benchmarks/peers/run_all.py --peers huey,rq --workloads w1,spike --repeat 5

Repeats are interleaved (every peer's workloads once, then again), so a noisy neighbour on the
machine spreads over the peers instead of sinking one. The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    BACKLOG_N,
    WORKLOADS,
    Bench,
    PrivateRedis,
    log,
    machine_facts,
    median_min_max,
    run_peer,
    stop_on_sigterm,
)

PEERS = ("celery", "dramatiq", "huey", "rq")
RESULTS = Path(__file__).resolve().parent.parent / "results"

# (workload, metric path, label) summarised as median/min/max
METRICS: dict[str, list[tuple[str, str]]] = {
    "W1": [
        ("enqueue_per_s", "enqueue/s"),
        ("steady_runs_per_s", "runs/s steady"),
        ("wall_runs_per_s", "runs/s incl. start-up"),
        ("wall_s", "wall s"),
        ("startup_s", "start-up s"),
    ],
    "W2-spike": [
        ("start_lateness_ms.p50", "p50 ms"),
        ("start_lateness_ms.p95", "p95 ms"),
        ("start_lateness_ms.p99", "p99 ms"),
        ("start_lateness_ms.max", "max ms"),
        ("t_to_last_start_s", "T->last start s"),
        ("t_to_last_end_s", "T->last end s"),
        ("started_by_120s", "started by T+120 s"),
        ("started_by_cap", "started by cap"),
        ("lead_margin_s", "lead margin s"),
    ],
    "W2-priority": [
        ("critical.start_lateness_ms.p50", "CRITICAL p50 ms"),
        ("critical.start_lateness_ms.p99", "CRITICAL p99 ms"),
        ("critical.start_lateness_ms.max", "CRITICAL max ms"),
        ("low_started_when_last_critical_started", "LOW started before last CRITICAL"),
        ("lead_margin_s", "lead margin s"),
    ],
    "W2-spread": [
        ("start_lateness_ms.p50", "p50 ms"),
        ("start_lateness_ms.p99", "p99 ms"),
        ("start_lateness_ms.max", "max ms"),
        ("early", "started early"),
        ("lead_margin_s", "lead margin s"),
    ],
    "W3": [
        ("enqueue_per_s", "enqueue/s"),
        ("redis_bytes_per_task_queued", "Redis B/task queued"),
        ("redis_bytes_per_task_with_worker", "Redis B/task, worker up"),
        ("worker_rss_mb", "worker RSS MB"),
        ("worker_idle_rss_mb", "idle worker RSS MB"),
        ("worker_bytes_per_task", "worker B/task"),
    ],
}


def make_peer(name: str, url: str):
    if name == "celery":
        from celery_bench import CeleryPeer as cls
    elif name == "dramatiq":
        from dramatiq_bench import DramatiqPeer as cls
    elif name == "huey":
        from huey_bench import HueyPeer as cls
    elif name == "rq":
        from rq_bench import RQPeer as cls
    else:
        raise SystemExit(f"unknown peer {name!r}")
    return cls(url)


def get(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)  # type: ignore[assignment]
    return d


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        if "error" not in r:
            groups[(r["peer"], r["workload"], r["setting"])].append(r)
    out = []
    for (peer, wl, setting), rs in groups.items():
        row: dict[str, Any] = {"peer": peer, "workload": wl, "setting": setting, "runs": len(rs), "metrics": {}}
        for path, label in METRICS.get(wl, []):
            values = [get(r, path) for r in rs]
            row["metrics"][label] = {**median_min_max(values), "incomplete_runs": sum(v is None for v in values)}
        checks = [r.get("exactly_once", r.get("critical_exactly_once")) for r in rs]
        row["exactly_once_all_runs"] = all(c is not False for c in checks) if wl != "W3" else None
        row["duplicates_total"] = sum(r.get("duplicates", 0) for r in rs)
        out.append(row)
    return out


def fmt(m: dict[str, Any], cap_note: str = "") -> str:
    if m["n"] == 0:
        return f"not reached{cap_note}"
    med, lo, hi = m["median"], m["min"], m["max"]
    big = max(abs(med), abs(lo), abs(hi)) >= 100
    f = (lambda v: f"{v:,.0f}") if big else (lambda v: f"{v:,.1f}")
    s = f(med) if lo == hi else f"{f(med)} ({f(lo)} to {f(hi)})"
    if m.get("incomplete_runs"):
        s += f" [{m['incomplete_runs']} run(s) not reached{cap_note}]"
    return s


def table(summary: list[dict[str, Any]]) -> str:
    lines = []
    for wl, metrics in METRICS.items():
        rows = [r for r in summary if r["workload"] == wl]
        if not rows:
            continue
        labels = [label for _, label in metrics]
        lines.append(f"\n### {wl}\n")
        lines.append("| peer | setting | runs | once | " + " | ".join(labels) + " |")
        lines.append("|" + "---|" * (4 + len(labels)))
        for r in rows:
            once = "" if r["exactly_once_all_runs"] is None else ("yes" if r["exactly_once_all_runs"] else "NO")
            cells = [fmt(r["metrics"][label], " by the cap") for label in labels]
            lines.append(f"| {r['peer']} | {r['setting']} | {r['runs']} | {once} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated of {WORKLOADS}")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each workload (default 3)")
    parser.add_argument("--priority-repeat", type=int, help="runs of the priority spike (default: --repeat)")
    parser.add_argument("--w3-repeat", type=int, help="runs of W3 (default: --repeat)")
    parser.add_argument("--w3-n", type=int, default=BACKLOG_N)
    parser.add_argument("--out", type=Path, default=RESULTS / f"peers-{date.today().isoformat()}.json")
    args = parser.parse_args()
    peers_wanted = [p for p in args.peers.split(",") if p]
    workloads = [w for w in args.workloads.split(",") if w]
    reps = dict.fromkeys(workloads, args.repeat)
    if args.priority_repeat is not None and "priority" in reps:
        reps["priority"] = args.priority_repeat
    if args.w3_repeat is not None and "backlog" in reps:
        reps["backlog"] = args.w3_repeat

    stop_on_sigterm()
    redis = PrivateRedis()
    workdir = Path(tempfile.mkdtemp(prefix="peer-bench-all-"))
    started = time.time()
    runs: list[dict[str, Any]] = []
    try:
        peers = [make_peer(p, redis.url) for p in peers_wanted]
        facts = machine_facts(redis, peers)
        facts["loadavg_at_start"] = os.getloadavg()
        bench = Bench(redis, workdir)
        doc: dict[str, Any] = {
            "date": date.today().isoformat(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "facts": facts,
            "repeats": reps,
            "runs": runs,
        }

        def save() -> None:
            doc["elapsed_s"] = round(time.time() - started, 1)
            doc["summary"] = summarize(runs)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n")

        # W1 and W2 interleaved by repeat; W3 (memory) after them, one peer at a time.
        light = [w for w in workloads if w != "backlog"]
        for k in range(max([reps[w] for w in light], default=0)):
            for peer in peers:
                todo = [w for w in light if k < reps[w]]
                log(f"== repeat {k + 1}: {peer.name} {todo}")
                runs.extend({**r, "repeat": k + 1} for r in run_peer(bench, peer, todo))
                save()
        for k in range(reps.get("backlog", 0)):
            for peer in peers:
                log(f"== W3 repeat {k + 1}: {peer.name}")
                runs.extend({**r, "repeat": k + 1} for r in run_peer(bench, peer, ["backlog"], w3_n=args.w3_n))
                save()
        facts["loadavg_at_end"] = os.getloadavg()
        save()
    finally:
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{len(runs)} runs in {time.time() - started:.0f} s; JSON: {args.out}")
    print(table(summarize(runs)))


if __name__ == "__main__":
    main()
