"""Run a whole jobq deployment locally for a minute: what the deployment examples share.

Given backend URLs, it creates the schema (`jobq init`), starts one process per role (beat,
scanner, reaper, and two workers, one of them serving only the CRITICAL and HIGH queues),
submits the quickstart's jobs through the Python API, waits until they have run, prints what
happened and stops every process. Then it removes what it created on the servers (the PostgreSQL
schema, the Redis keys and the RabbitMQ queues under its name) unless JOBQ_EXAMPLE_KEEP=1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from jobq import App, Client, RunState
from jobq.settings import Settings
from jobq.wiring import connect, init_store

ROLES = {
    "beat": ["beat"],
    "scanner": ["scanner"],
    "reaper": ["reaper"],
    "worker-1": ["worker", "-A", "examples.quickstart", "-c", "4"],
    "worker-2": ["worker", "-A", "examples.quickstart", "-c", "4", "-Q", "critical,high"],
}


def run(urls: Mapping[str, str], title: str, timeout_s: float = 60.0) -> int:
    """Returns 0 when every job ended as expected (the failing one on the dead-letter list)."""
    env = {**os.environ, **{f"JOBQ_{k.upper()}": v for k, v in urls.items()}, "JOBQ_LOG_LEVEL": "WARNING"}
    settings = Settings.load(dict(urls), env={})
    print(f"{title}: {init_store(settings)}")
    procs = {name: subprocess.Popen([sys.executable, "-m", "jobq.cli", *args], env=env) for name, args in ROLES.items()}
    deployment = connect(settings)
    try:
        from examples import quickstart

        app: App = quickstart.app
        app.use(deployment)
        jobs = {
            "hello (instant, HIGH)": quickstart.hello.delay("deployment"),
            "hello in 2 s": quickstart.hello.schedule(delay_s=2, kwargs={"name": "two seconds later"}),
            "flaky (fails twice)": quickstart.flaky.delay(),
            "broken (dead-lettered)": quickstart.broken.delay(),
        }
        client = Client(deployment)
        deadline = time.monotonic() + timeout_s
        runs = {}
        while time.monotonic() < deadline:
            runs = {name: client.get(h.job_id).current_run for name, h in jobs.items()}
            if all(r is not None and r.state.terminal for r in runs.values()):
                break
            time.sleep(0.25)
        for name, r in runs.items():
            state = "not run" if r is None else f"{r.state.value} at attempt {r.attempt} (fence {r.fence})"
            print(f"  {name:<24} {state}")
        expected = {name: RunState.FAILED if "broken" in name else RunState.SUCCEEDED for name in jobs}
        ok = all(r is not None and r.state is expected[name] for name, r in runs.items())
        print("all jobs ran as expected" if ok else "some jobs did not run as expected")
        return 0 if ok else 1
    finally:
        deployment.close()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=60)
        if os.environ.get("JOBQ_EXAMPLE_KEEP") != "1":
            for what in clean_up(urls):
                print(f"removed {what}")


def clean_up(urls: Mapping[str, str]) -> list[str]:
    """Remove what a deployment on these URLs created: a PostgreSQL store's schema, the keys under
    a Redis index's or broker's prefix, a RabbitMQ broker's queues. Returns what was removed."""
    from urllib.parse import parse_qs, urlsplit

    removed = []
    for role, url in urls.items():
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if role == "store" and parts.scheme in ("postgresql", "postgres") and "schema" in query:
            import psycopg

            plain = url.split("?", 1)[0]
            with psycopg.connect(plain, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{query["schema"]}" CASCADE')
            removed.append(f"PostgreSQL schema {query['schema']}")
        elif parts.scheme in ("redis", "rediss") and "prefix" in query:
            import redis

            client = redis.Redis.from_url(url.split("?", 1)[0])
            keys = list(client.scan_iter(match=f"{query['prefix']}*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
            client.close()
            removed.append(f"{len(keys)} Redis keys under {query['prefix']} ({role})")
        elif parts.scheme in ("amqp", "amqps") and "prefix" in query:
            from kombu import Connection

            with Connection(url.split("?", 1)[0]) as conn:
                channel = conn.default_channel
                for tier in ("critical", "high", "default", "low"):
                    with contextlib.suppress(Exception):  # a queue never declared
                        channel.queue_delete(f"{query['prefix']}-{tier}")
            removed.append(f"RabbitMQ queues {query['prefix']}-*")
    return removed
