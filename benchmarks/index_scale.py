"""W3 at scale: the Redis time index holding 10,000,000 scheduled runs, on a redis-server of its own.

    .venv/bin/python benchmarks/index_scale.py [--runs 10000000] [--chunk 1000] [--maxmemory 4gb]

Starts a private redis-server (no persistence, `maxmemory` capped so that a mistake fails instead
of filling the machine), indexes `--runs` runs through `RedisTimeIndex` in chunks of `--chunk`
(generated as they go, so the benchmark's own memory stays small) from `--adders` processes at
once, each with its own index object (as several beats or clients add), and reports:

* bytes per indexed run: `INFO memory` used_memory before and after, and `MEMORY USAGE` summed
  over every key; the server's RSS and peak; how many bucket and id-directory keys left the
  listpack encoding (each one that does costs ~3x per member);
* the idle scanner tick (`claim_due` with nothing due + `next_due_ms`) with the backlog held;
* a scanner pass over a full minute: `claim_due` called as the scanner calls it (batch 500,
  doubling to 2,000 while batches come back full) until the minute is drained, twice: the first
  minute of the backlog, which holds the top-of-the-hour spike, then the next (an ordinary
  minute). For each: wall time, round trips, Redis commands executed (`INFO commandstats`), and
  the CPU both sides spent (the client's `process_time`, the server's `used_cpu_user+sys`).

The runs are distributed as in `redis_index.py`, anchored on the current hour H: due uniformly
over [H, H + 2 h), a third of them moved up to the next minute mark, and a tenth of those onto an
hour mark (H or H + 1 h), so minute H holds a cron spike. Priorities 5% CRITICAL, 15% HIGH, 60%
DEFAULT, 20% LOW. The server is flushed and stopped at the end. Raw JSON goes to
`benchmarks/results/index-scale-<runs>-<date>.json`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import redis
from stacks import machine, result_stem

from jobq.ids import new_job_id
from jobq.models import Priority
from jobq.ports import IndexEntry
from jobq.timeindex.redis import RedisTimeIndex

MINUTE = 60_000
HOUR = 3_600_000
HORIZON_MS = 2 * HOUR
TIERS = [Priority.CRITICAL, Priority.HIGH, Priority.DEFAULT, Priority.LOW]
WEIGHTS = [5, 15, 60, 20]


def chunks(count: int, size: int, hour_ms: int, seed: int = 1) -> Iterator[list[IndexEntry]]:
    rng = random.Random(seed)
    tiers = [t for t, w in zip(TIERS, WEIGHTS, strict=True) for _ in range(w)]
    out: list[IndexEntry] = []
    for _ in range(count):
        due = hour_ms + rng.randrange(HORIZON_MS)
        if rng.random() < 1 / 3:
            if rng.random() < 0.1:
                due -= (due - hour_ms) % HOUR  # onto H or H + 1 h: the top-of-the-hour spike
            else:
                due += -due % MINUTE
        job_id = new_job_id(hour_ms - rng.randrange(90 * 24 * HOUR))
        out.append(IndexEntry(f"{job_id}:{due}", due, tiers[rng.randrange(len(tiers))]))
        if len(out) == size:
            yield out
            out = []
    if out:
        yield out


def load_share(args: tuple[int, int, int, int, int, int]) -> tuple[dict[int, int], float]:
    """One adder process: index `count` runs (seed `seed`) through its own `RedisTimeIndex`, as
    several beats or clients would. Returns its runs per minute and its CPU seconds."""
    port, count, size, hour_ms, seed, capacity = args
    client = redis.Redis(port=port)
    index = RedisTimeIndex(client, prefix="jobq", capacity=capacity)
    per_minute: dict[int, int] = {}
    cpu = time.process_time()
    for chunk in chunks(count, size, hour_ms, seed):
        index.add(chunk)
        for e in chunk:
            minute = (e.due_ms - hour_ms) // MINUTE
            per_minute[minute] = per_minute.get(minute, 0) + 1
    client.close()
    return per_minute, time.process_time() - cpu


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(port: int, maxmemory: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--maxmemory", maxmemory, "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server on port {port} did not start")


def server_cpu_s(client: Any) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def commandstats(client: Any) -> dict[str, tuple[int, int]]:
    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in client.info("commandstats").items()
    }


def memory(client: Any) -> dict[str, int]:
    deadline = time.monotonic() + 120
    while int(client.info("memory").get("lazyfree_pending_objects", 0)) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    info = client.info("memory")
    return {k: int(info[k]) for k in ("used_memory", "used_memory_rss", "used_memory_peak")}


def key_census(client: Any) -> dict[str, float]:
    """MEMORY USAGE over every key, and keys of each kind outside the listpack encoding."""
    total = keys = 0
    loose = {"schedule": 0, "ids": 0}
    counts = {"schedule": 0, "ids": 0, "buckets": 0}
    batch: list[bytes] = []

    def flush() -> None:
        nonlocal total
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.memory_usage(key, samples=0)
            pipe.object("encoding", key)
        replies = pipe.execute()
        total += sum(replies[0::2])
        for key, encoding in zip(batch, replies[1::2], strict=True):
            kind = key.split(b":")[1].decode()
            if kind in counts:
                counts[kind] += 1
            if kind in loose and encoding != b"listpack":
                loose[kind] += 1
        batch.clear()

    for key in client.scan_iter(count=10_000):
        keys += 1
        batch.append(key)
        if len(batch) == 5000:
            flush()
    if batch:
        flush()
    return {
        "memory_usage_sum": total,
        "keys": keys,
        "bucket_keys": counts["schedule"],
        "id_shards": counts["ids"],
        "bucket_keys_not_listpack": loose["schedule"],
        "id_shards_not_listpack": loose["ids"],
    }


def idle_tick(index: RedisTimeIndex, now_ms: int, ticks: int = 300) -> dict[str, float]:
    index.next_due_ms()
    times = []
    trips = index.round_trips
    for _ in range(ticks):
        started = time.perf_counter()
        assert index.claim_due(now_ms, 500) == []
        index.next_due_ms()
        times.append((time.perf_counter() - started) * 1e6)
    times.sort()
    return {"median_us": times[len(times) // 2], "round_trips": (index.round_trips - trips) / ticks}


def minute_pass(client: Any, index: RedisTimeIndex, now_ms: int, expected: int) -> dict[str, Any]:
    """Drain every run due by `now_ms` as the scanner would: batches of 500, doubling while full."""
    stats_before, cpu_before, trips = commandstats(client), server_cpu_s(client), index.round_trips
    batch, calls, claimed = 500, 0, 0
    wall, cpu = time.perf_counter(), time.process_time()
    while True:
        got = index.claim_due(now_ms, batch)
        calls += 1
        claimed += len(got)
        if len(got) < batch:
            break
        batch = min(batch * 2, 2000)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server = server_cpu_s(client) - cpu_before
    after = commandstats(client)
    per_command = {
        name: (calls_ - stats_before.get(name, (0, 0))[0], usec - stats_before.get(name, (0, 0))[1])
        for name, (calls_, usec) in after.items()
        if calls_ != stats_before.get(name, (0, 0))[0] and name != "info"
    }
    commands = sum(c for c, _ in per_command.values())
    assert claimed == expected, (claimed, expected)
    return {
        "runs": claimed,
        "claim_due_calls": calls,
        "seconds": wall,
        "runs_per_s": claimed / wall,
        "round_trips": index.round_trips - trips,
        "redis_commands": commands,
        "redis_commands_per_run": commands / claimed,
        "commands": {k: {"calls": c, "usec": u} for k, (c, u) in sorted(per_command.items())},
        "client_cpu_us_per_run": cpu / claimed * 1e6,
        "server_cpu_us_per_run": server / claimed * 1e6,
        "server_command_usec_per_run": sum(u for _, u in per_command.values()) / claimed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--maxmemory", default="4gb")
    parser.add_argument("--adders", type=int, default=3, help="processes indexing at once, each its own index")
    args = parser.parse_args(argv)

    now_ms = time.time_ns() // 1_000_000
    hour_ms = now_ms - now_ms % HOUR
    port = free_port()
    proc = start_redis(port, args.maxmemory)
    client = redis.Redis(port=port)
    report: dict[str, Any] = {"runs": args.runs, "chunk": args.chunk, "maxmemory": args.maxmemory}
    try:
        report["redis_version"] = client.info("server")["redis_version"]
        index = RedisTimeIndex(client, prefix="jobq", capacity=args.runs)
        report["idle_tick_empty"] = idle_tick(index, hour_ms - 1)
        before = memory(client)
        report["memory_empty"] = before
        per_minute: dict[int, int] = {}
        started = time.perf_counter()
        server_before = server_cpu_s(client)
        share = -(-args.runs // args.adders)
        jobs = [
            (port, min(share, args.runs - i * share), args.chunk, hour_ms, i + 1, args.runs) for i in range(args.adders)
        ]
        with multiprocessing.get_context("fork").Pool(args.adders) as pool:
            shares = pool.map(load_share, jobs)
        elapsed = time.perf_counter() - started
        for counts, _ in shares:
            for minute, n in counts.items():
                per_minute[minute] = per_minute.get(minute, 0) + n
        report["add"] = {
            "adders": args.adders,
            "seconds": elapsed,
            "runs_per_s": args.runs / elapsed,
            "client_cpu_us_per_run_incl_generation": sum(c for _, c in shares) / args.runs * 1e6,
            "server_cpu_us_per_run": (server_cpu_s(client) - server_before) / args.runs * 1e6,
        }
        after = memory(client)
        report["memory_backlog"] = after
        report["bytes_per_run_used_memory"] = (after["used_memory"] - before["used_memory"]) / args.runs
        census = key_census(client)
        report["census"] = census
        report["bytes_per_run_memory_usage"] = census["memory_usage_sum"] / args.runs
        report["runs_per_minute"] = {
            "max": max(per_minute.values()),
            "median": sorted(per_minute.values())[len(per_minute) // 2],
            "minute_0": per_minute.get(0, 0),
            "minute_1": per_minute.get(1, 0),
        }
        print(json.dumps({k: report[k] for k in ("add", "memory_backlog", "bytes_per_run_used_memory", "census")}))
        report["idle_tick_backlog"] = idle_tick(index, hour_ms - 1)
        report["pass_minute_0_spike"] = minute_pass(client, index, hour_ms + MINUTE - 1, per_minute.get(0, 0))
        report["pass_minute_1"] = minute_pass(client, index, hour_ms + 2 * MINUTE - 1, per_minute.get(1, 0))
        print(json.dumps({k: report[k] for k in ("idle_tick_backlog", "pass_minute_0_spike", "pass_minute_1")}))
    finally:
        try:
            client.flushall()
        finally:
            client.close()
            proc.kill()
            proc.wait(timeout=30)
    report["machine"] = machine()
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = result_stem(f"index-scale-{args.runs}").with_suffix(".json")
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
