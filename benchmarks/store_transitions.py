"""CPU per run of a worker's store calls, batch by batch: read the jobs, start, finish (issue 14).

    python benchmarks/store_transitions.py --stack sqlite --batch 1 10 50
    python benchmarks/store_transitions.py --stack postgres --batch 1 5 20 50

One-off jobs with one DISPATCHED run each are written first; then, `--batch` runs at a time, what a
worker's start and completion write to the store: `get_jobs`, the RUNNING transition (lease owner,
lease, start time, attempt) and the SUCCEEDED transition that also completes the job. Reported in
µs of CPU per run for each call: this process's (`time.process_time`) and, on PostgreSQL, the
server backend's (the store's pool holds one connection; its CPU is read from `/proc`, so the
server must run on this machine). Nothing else runs: it isolates the store's share of a run's
cost from the daemons around it, which `cpu_per_run.py` measures as a whole.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # the test factories

from factories import T0, key, make_job, make_run
from stacks import POSTGRES

from jobq.models import JobStatus, RunState, Transition
from jobq.ports import CreateRequest, JobStore

_TICKS = os.sysconf("SC_CLK_TCK")
_CALLS = ("get_jobs", "start", "finish")


def _open(stack: str) -> tuple[JobStore, Callable[[], float], Callable[[], None]]:
    """The store, a reader of its server's CPU seconds (0 for SQLite), and what drops it."""
    if stack == "sqlite":
        from jobq.store.sqlite import SqliteStore

        directory = tempfile.mkdtemp(prefix="jobq-transitions-")
        sqlite = SqliteStore.from_url(f"sqlite:///{directory}/store.db")
        return sqlite, lambda: 0.0, sqlite.close
    import psycopg

    from jobq.store.postgres import PostgresStore

    schema = f"jobq_bench_{uuid.uuid4().hex[:10]}"
    postgres = PostgresStore.from_url(f"{POSTGRES}?schema={schema}&pool_min=1&pool_max=1")
    [pid] = [row["pid"] for row in postgres.db.read("SELECT pg_backend_pid() AS pid")]

    def server_s() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def drop() -> None:
        postgres.close()
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    return postgres, server_s, drop


def once(stack: str, runs: int, batch: int) -> dict[str, dict[str, float]]:
    """µs of CPU per run for each call, {"client": ..., "server": ...}."""
    store, server_s, drop = _open(stack)
    try:
        requests = [
            CreateRequest(make_job(f"j{n}"), [make_run(f"j{n}", state=RunState.DISPATCHED, fence=1)], None)
            for n in range(runs)
        ]
        for i in range(0, runs, 200):
            store.create_job_group(requests[i : i + 200])
        spent = {call: [0.0, 0.0] for call in _CALLS}

        def timed(call: str, body: Callable[[], Any]) -> Any:
            server, client = server_s(), time.process_time()
            out = body()
            spent[call][0] += time.process_time() - client
            spent[call][1] += server_s() - server
            return out

        for first in range(0, runs - batch + 1, batch):
            numbers = range(first, first + batch)
            keys = [key(f"j{n}") for n in numbers]
            start = [
                Transition(
                    f"j{n}:{T0}",
                    frozenset({RunState.CLAIMED, RunState.DISPATCHED}),
                    RunState.RUNNING,
                    1,
                    {"lease_owner": "w", "lease_expires_ms": T0 + 30_000, "started_ms": T0 + n, "attempt": 1},
                    at_ms=T0 + n,
                )
                for n in numbers
            ]
            finish = [
                Transition(
                    f"j{n}:{T0}",
                    frozenset({RunState.RUNNING}),
                    RunState.SUCCEEDED,
                    1,
                    {"lease_owner": None, "lease_expires_ms": None, "finished_ms": T0 + n, "result": None},
                    expect_owner="w",
                    at_ms=T0 + n,
                    job_status=JobStatus.COMPLETED,
                )
                for n in numbers
            ]
            timed("get_jobs", lambda keys=keys: store.get_jobs(keys))
            assert all(timed("start", lambda start=start: store.transition(start)))
            assert all(timed("finish", lambda finish=finish: store.transition(finish)))
        done = runs - runs % batch
        return {
            side: {call: spent[call][i] / done * 1e6 for call in _CALLS} for i, side in enumerate(("client", "server"))
        }
    finally:
        drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{args.stack}, {args.runs} runs, median of {args.repeat} (min-max), µs of CPU per run; load {os.getloadavg()}"
    )
    for batch in args.batch:
        reps = [once(args.stack, args.runs, batch) for _ in range(args.repeat)]
        for side in ("client", "server") if args.stack == "postgres" else ("client",):
            cells = []
            for call in _CALLS:
                values = [r[side][call] for r in reps]
                cells.append(f"{call} {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
            print(f"batch {batch:3d} {side:6s} " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
