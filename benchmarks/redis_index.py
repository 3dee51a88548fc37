"""Benchmark the Redis time index: memory per indexed run, add rate, claim rates, idle tick cost.

    .venv/bin/python benchmarks/redis_index.py [--runs 1000000] [--repeat 3] [--batch 1000]
                                               [--url redis://127.0.0.1:6379/0] [--baseline]

Memory is the server's own `INFO memory` used_memory before and after indexing `--runs` runs
under a fresh prefix, divided by the runs (sampled once earlier deletions have been freed).
used_memory is server-wide, so keep the server otherwise idle while measuring; `MEMORY USAGE`
summed over the prefix's keys is printed beside it as a cross-check that other clients cannot
disturb. Nothing is flushed: the prefix's keys are deleted afterwards.

The runs look like production: ids from `jobq.ids` (`job_<26 base32>:<fire ms>`), due over the
next two hours (the horizon the design buffers in the index), a third of them on minute marks
and a tenth of those on the hour (cron spikes), priorities 5% CRITICAL, 15% HIGH, 60% DEFAULT,
20% LOW. `--baseline` also measures the plain design: one sorted set per (priority, minute)
holding the full run id, scored by due time.

Rates: `add` and `claim_due` go through `RedisTimeIndex` with `--batch` runs per call;
`lua claim` is the claim script alone on the same buckets, `--batch` runs per round trip, without
the id-directory confirmation that `claim_due` adds. The idle tick is what a scanner pays when
nothing is due: `claim_due` plus `next_due_ms`, with the whole backlog in the future and with an
empty index. Each figure is the median of `--repeat` runs, with min and max.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from jobq.ids import new_job_id
from jobq.models import Priority
from jobq.ports import IndexEntry
from jobq.timeindex.redis import CLAIM, FILL, RedisTimeIndex

MINUTE = 60_000
HORIZON_MS = 2 * 3_600_000
TIERS = [Priority.CRITICAL, Priority.HIGH, Priority.DEFAULT, Priority.LOW]
WEIGHTS = [5, 15, 60, 20]


def make_runs(count: int, now_ms: int, seed: int = 1) -> list[IndexEntry]:
    rng = random.Random(seed)
    runs = []
    for _ in range(count):
        due = now_ms + rng.randrange(HORIZON_MS)
        if rng.random() < 1 / 3:
            mark = 3_600_000 if rng.random() < 0.1 else MINUTE
            due += -due % mark  # the next minute (or hour) mark: still in the future
        job_id = new_job_id(now_ms - rng.randrange(90 * 24 * 3_600_000))  # created up to 90 days ago
        runs.append(IndexEntry(f"{job_id}:{due}", due, rng.choices(TIERS, WEIGHTS)[0]))
    return runs


def used_memory(client: Any) -> int:
    """used_memory once the background frees of earlier UNLINKs are done and client buffers settled."""
    deadline = time.monotonic() + 120
    while int(client.info("memory").get("lazyfree_pending_objects", 0)) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    return int(client.info("memory")["used_memory"])


def key_memory(client: Any, prefix: str) -> tuple[int, int, int]:
    """(MEMORY USAGE summed over the prefix's keys, keys, keys not in a compact encoding): a
    cross-check of used_memory that other clients of the server cannot disturb."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=5000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
        pipe.object("encoding", key)
    replies = pipe.execute()
    runs_keys = [b":schedule:" in k or b":ids:" in k for k in keys]  # the directories are few, and skiplists
    loose = sum(1 for e, mine in zip(replies[1::2], runs_keys, strict=True) if mine and e != b"listpack")
    return sum(replies[0::2]), len(keys), loose


def delete_prefix(client: Any, prefix: str) -> None:
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=5000):
        batch.append(key)
        if len(batch) == 5000:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


@contextmanager
def fresh_prefix(client: Any) -> Iterator[str]:
    prefix = f"jobq-bench-{uuid.uuid4().hex[:8]}"
    try:
        yield prefix
    finally:
        delete_prefix(client, prefix)


def in_batches(items: Sequence[IndexEntry], size: int) -> Iterator[Sequence[IndexEntry]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def measure_index(client: Any, runs: list[IndexEntry], batch: int, now_ms: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with fresh_prefix(client) as prefix:
        index = RedisTimeIndex(client, prefix=prefix, capacity=len(runs))
        before = used_memory(client)
        started = time.perf_counter()
        for chunk in in_batches(runs, batch):
            index.add(chunk)
        out["add runs/s"] = len(runs) / (time.perf_counter() - started)
        out["bytes/run"] = (used_memory(client) - before) / len(runs)
        usage, _, loose = key_memory(client, prefix)
        out["MEMORY USAGE bytes/run"] = usage / len(runs)
        out["bucket/id keys not listpack"] = loose
        buckets = sum(1 for _ in client.scan_iter(match=f"{prefix}:schedule:*", count=5000))
        out["runs/bucket"] = len(runs) / buckets

        # An idle scanner tick with the whole backlog in the future: claim_due + next_due_ms.
        out["idle tick us (backlog)"], out["idle tick round trips (backlog)"] = idle_tick(index, now_ms)

        claimed = 0
        started, trips = time.perf_counter(), index.round_trips
        while got := index.claim_due(now_ms + HORIZON_MS + 3_600_000, batch):  # hour marks may pass 2 h
            claimed += len(got)
        out["claim_due runs/s"] = claimed / (time.perf_counter() - started)
        out["claim_due round trips/call"] = (index.round_trips - trips) / -(-claimed // batch)
        assert claimed == len({r.run_id for r in runs}), (claimed, len(runs))

        with fresh_prefix(client) as empty:
            out["idle tick us (empty)"], out["idle tick round trips (empty)"] = idle_tick(
                RedisTimeIndex(client, prefix=empty), now_ms
            )
    return out


def idle_tick(index: RedisTimeIndex, now_ms: int, ticks: int = 300) -> tuple[float, float]:
    """Median microseconds and round trips of a scanner's idle tick: claim_due finds nothing due,
    then next_due_ms says how long to sleep."""
    index.next_due_ms()  # the scanner has been ticking already
    times: list[float] = []
    before = index.round_trips
    for _ in range(ticks):
        started = time.perf_counter()
        assert index.claim_due(now_ms - 1, 500) == []
        index.next_due_ms()
        times.append((time.perf_counter() - started) * 1e6)
    return statistics.median(times), (index.round_trips - before) / ticks


def measure_lua(client: Any, runs: list[IndexEntry], batch: int, now_ms: int) -> dict[str, float]:
    """The claim script alone, on the index's own buckets: `batch` runs per round trip."""
    with fresh_prefix(client) as prefix:
        index = RedisTimeIndex(client, prefix=prefix, capacity=len(runs))
        for chunk in in_batches(runs, 1000):
            index.add(chunk)
        buckets = list(client.scan_iter(match=f"{prefix}:schedule:*", count=5000))
        per_call = min(FILL, batch)
        calls = max(1, batch // per_call)
        client.script_load(CLAIM.source)
        claimed = 0
        started = time.perf_counter()
        for i in range(0, len(buckets), calls):
            pipe = client.pipeline(transaction=False)
            for key in buckets[i : i + calls]:
                pipe.evalsha(CLAIM.sha, 1, key, 10**12, per_call)  # every member is due
            claimed += sum(len(taken) // 2 for taken, _ in pipe.execute())
        elapsed = time.perf_counter() - started
        assert claimed == len({r.run_id for r in runs}), (claimed, len(runs))
    return {"lua claim runs/s": claimed / elapsed}


def measure_baseline(client: Any, runs: list[IndexEntry]) -> dict[str, float]:
    """The plain design: `<prefix>:schedule:<P>:<minute>`, member = run id, score = due ms."""
    with fresh_prefix(client) as prefix:
        before = used_memory(client)
        for chunk in in_batches(runs, 1000):
            pipe = client.pipeline(transaction=False)
            for r in chunk:
                pipe.zadd(f"{prefix}:schedule:{r.priority.value}:{r.due_ms // MINUTE}", {r.run_id: r.due_ms})
            pipe.execute()
        after = used_memory(client)
        usage, _, _ = key_memory(client, prefix)
        return {"baseline bytes/run": (after - before) / len(runs), "baseline MEMORY USAGE/run": usage / len(runs)}


def report(results: list[dict[str, float]]) -> None:
    for name in results[0]:
        values = [r[name] for r in results]
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"  {name:34} median {mid:>12,.1f}   min {low:>12,.1f}   max {high:>12,.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000, help="runs per add and per claim call")
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--baseline", action="store_true", help="also measure the plain one-member-per-run design")
    args = parser.parse_args(argv)

    client = redis.Redis.from_url(args.url)
    server = client.info("server")
    config = client.config_get("zset-max-listpack-*")
    print(f"Redis {server['redis_version']} at {args.url}; {config}")
    now_ms = time.time_ns() // 1_000_000
    started = time.perf_counter()
    runs = make_runs(args.runs, now_ms)
    print(f"{args.runs:,} runs generated in {time.perf_counter() - started:.1f} s; batch {args.batch}")

    steps: list[tuple[str, Callable[[], dict[str, float]]]] = [
        ("index", lambda: measure_index(client, runs, args.batch, now_ms)),
        ("lua", lambda: measure_lua(client, runs, args.batch, now_ms)),
    ]
    if args.baseline:
        steps.append(("baseline", lambda: measure_baseline(client, runs)))
    results: list[dict[str, float]] = []
    for i in range(args.repeat):
        merged: dict[str, float] = {}
        for _, step in steps:
            merged |= step()
        results.append(merged)
        print(f"run {i + 1}/{args.repeat}: " + ", ".join(f"{k} {v:,.1f}" for k, v in merged.items()), flush=True)
    print(f"median of {args.repeat} runs (min, max):")
    report(results)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
