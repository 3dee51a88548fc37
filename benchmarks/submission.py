"""Submission rate: durable `task.delay()` calls per second, one call per task (issue 14).

For each stack and each producer count (threads in one process, each calling `delay` in a loop),
measures submissions/s with group commit off (every `submit` its own transaction: "before") and
on ("after"), alternating the two within each repetition so both see the same machine. Each
measurement runs on a fresh deployment (`stacks.stack`). The task is jobq's bench no-op, published
in the task catalogue first (as a running worker would have), so a submission reads nothing.

    python benchmarks/submission.py --stack sqlite --stack postgres-redis --producers 1 --producers 16 --repeat 3

Prints a table and writes the raw figures to benchmarks/results/submission-<time>.json. With
`--api`, also measures `POST /v1/jobs` from 32 concurrent HTTP clients (raw keep-alive sockets,
since httpx is slower than the server) against `jobq api` started on the stack.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stacks import REDIS, stack

RESULTS = Path(__file__).resolve().parent / "results"


def measure(urls: dict[str, str], *, grouped: bool, producers: int, n: int) -> dict[str, float]:
    """`n` submissions from `producers` threads (n / producers each) on a deployment of `urls`."""
    from jobq.app import App
    from jobq.bench import NOOP, bench_app
    from jobq.client import _group
    from jobq.settings import Settings
    from jobq.wiring import connect

    settings = Settings.load({**urls, "group_commit": str(grouped).lower()}, env={})
    d = connect(settings)
    try:
        app = App("submission-bench", settings=settings)
        app.use(d)
        noop = app.task(name=NOOP)(lambda: None)
        now = d.clock.now_ms()
        d.store.publish_tasks([t.info("bench", now) for t in bench_app.registry])
        for i in range(20):  # warm the pool, the catalogue cache and the code paths
            noop.delay(i)
        group = _group(d.store)
        groups0, items0 = group.groups, group.items
        each = n // producers
        elapsed, cpu = _produce(noop.delay, producers, each)
        groups = group.groups - groups0
        return {
            "per_s": each * producers / elapsed,
            # CPU of this process (every thread) per submission: what the shared machine's load
            # does not change much, unlike the wall-clock rate.
            "cpu_us": cpu / (each * producers) * 1e6,
            "mean_group": (group.items - items0) / groups if groups else 1.0,
        }
    finally:
        d.close()


def peer_rate(peer: str, *, producers: int, n: int) -> dict[str, float]:
    """The peer's non-durable enqueue (one call per task, as its own benchmark does) into this
    machine's Redis under a namespace of its own, from `producers` threads; the keys are dropped."""
    import uuid

    import redis

    tag = f"subbench{uuid.uuid4().hex[:8]}"
    if peer == "huey":
        from huey import RedisHuey

        huey = RedisHuey(tag, url=REDIS)
        call = huey.task()(_peer_noop)
    else:
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=REDIS, namespace=tag)
        dramatiq.set_broker(broker)
        call = dramatiq.actor(_peer_noop, actor_name=f"noop_{tag}", broker=broker).send
    each = n // producers
    elapsed, cpu = _produce(call, producers, each)
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=f"*{tag}*", count=1000):
        client.delete(key)
    return {"per_s": each * producers / elapsed, "cpu_us": cpu / (each * producers) * 1e6}


def _produce(call: Callable[[int], Any], producers: int, each: int) -> tuple[float, float]:
    """`call(i)` `each` times from each of `producers` threads started together: the wall time
    and this process's CPU time (every thread) they took. A failed call fails the figure."""
    start = threading.Barrier(producers + 1)
    errors: list[BaseException] = []

    def produce() -> None:
        start.wait()
        try:
            for i in range(each):
                call(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce) for _ in range(producers)]
    for t in threads:
        t.start()
    start.wait()
    began, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - began, time.process_time() - cpu


def _peer_noop(i: int) -> None:
    """The peers' task: never run here (only enqueued)."""


def api_rate(urls: dict[str, str], *, clients: int, n: int, grouped: bool) -> dict[str, float]:
    """`POST /v1/jobs` from `clients` keep-alive connections against `jobq api` on the stack."""
    from jobq.bench import bench_app
    from jobq.settings import Settings
    from jobq.wiring import connect

    port = _free_port()
    # No rate limit: the figure is the server's, not the limiter's.
    env_urls = {
        **urls,
        "group_commit": str(grouped).lower(),
        "rate_limit_per_s": "1000000",
        "rate_limit_burst": "1000000",
    }
    settings = Settings.load(env_urls, env={})
    d = connect(settings)
    d.store.publish_tasks([t.info("bench", d.clock.now_ms()) for t in bench_app.registry])
    d.close()
    env = {**os.environ, **{f"JOBQ_{k.upper()}": v for k, v in env_urls.items()}}
    token = subprocess.run(
        [sys.executable, "-m", "jobq.cli", "tokens", "create", "--tenant", "default", "-q"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    server = subprocess.Popen(
        [sys.executable, "-m", "jobq.cli", "api", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_port(port, server)
        body = json.dumps(
            {"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "jobq.bench.noop"}}
        ).encode()
        request = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        each = n // clients
        start = threading.Barrier(clients + 1)
        failures: list[str] = []

        def client() -> None:
            sock = socket.create_connection(("127.0.0.1", port))
            reader = sock.makefile("rb")
            _post(sock, reader, request)  # warm
            start.wait()
            for _ in range(each):
                status = _post(sock, reader, request)
                if status != 201:
                    failures.append(str(status))
            sock.close()

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        start.wait()
        began = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - began
        if failures:
            raise RuntimeError(f"{len(failures)} requests failed: {failures[:3]}")
        return {"per_s": each * clients / elapsed}
    finally:
        server.terminate()
        server.wait(timeout=30)


def _post(sock: socket.socket, reader: Any, request: bytes) -> int:
    sock.sendall(request)
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    reader.read(length)
    return status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"jobq api exited: {server.stderr.read().decode() if server.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("jobq api did not start listening within 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", action="append", choices=("sqlite", "postgres-redis"))
    parser.add_argument("--producers", action="append", type=int)
    parser.add_argument("--n", type=int, default=3000, help="submissions per measurement")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--api", action="store_true", help="also POST /v1/jobs from 32 clients")
    parser.add_argument("--api-n", type=int, default=6400)
    parser.add_argument("--peers", action="store_true", help="also Huey's and Dramatiq's enqueue (if installed)")
    args = parser.parse_args()
    stacks = args.stack or ["sqlite", "postgres-redis"]
    producers = args.producers or [1, 16]
    raw: dict[str, list[dict[str, float]]] = {}
    for rep in range(args.repeat):
        if args.peers:
            for peer in ("huey", "dramatiq"):
                for p in producers:
                    got = peer_rate(peer, producers=p, n=args.n)
                    label = f"{peer} {p} producer(s) enqueue (not durable)"
                    raw.setdefault(label, []).append(got)
                    print(f"rep {rep + 1}: {label}: {got['per_s']:,.0f}/s, {got['cpu_us']:.0f} us CPU each")
        for name in stacks:
            for p in producers:
                for grouped in (False, True) if rep % 2 == 0 else (True, False):
                    with stack(name) as urls:
                        got = measure(urls, grouped=grouped, producers=p, n=args.n)
                    label = f"{name} {p} producer(s) {'group commit' if grouped else 'one transaction each'}"
                    raw.setdefault(label, []).append(got)
                    print(
                        f"rep {rep + 1}: {label}: {got['per_s']:,.0f}/s, {got['cpu_us']:.0f} us CPU each "
                        f"(mean group {got['mean_group']:.1f})"
                    )
            if args.api:
                for grouped in (False, True):
                    with stack(name) as urls:
                        got = api_rate(urls, clients=32, n=args.api_n, grouped=grouped)
                    label = f"{name} POST /v1/jobs 32 clients {'group commit' if grouped else 'one transaction each'}"
                    raw.setdefault(label, []).append(got)
                    print(f"rep {rep + 1}: {label}: {got['per_s']:,.0f}/s")
    print()
    print("| measurement | submissions/s, median (min-max) | producer CPU per submission | mean group |")
    print("| --- | --- | --- | --- |")
    summary = {}
    for label, runs in raw.items():
        rates = [r["per_s"] for r in runs]
        groups = [r.get("mean_group", 1.0) for r in runs]
        cpu = [r["cpu_us"] for r in runs if "cpu_us" in r]
        cpu_text = f"{statistics.median(cpu):,.0f} us ({min(cpu):,.0f}-{max(cpu):,.0f})" if cpu else "-"
        summary[label] = {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": runs}
        print(
            f"| {label} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) "
            f"| {cpu_text} | {statistics.median(groups):.1f} |"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"submission-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps({"args": vars(args), "summary": summary}, indent=2))
    print(f"\nraw figures: {out}")


if __name__ == "__main__":
    main()
