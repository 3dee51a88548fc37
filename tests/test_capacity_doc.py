"""docs/capacity.md's per-run store operations are the code's: each role's calls to the four ports,
counted in an in-process run on a real stack, must equal the doc's table.

The doc states calls per unit of work (per submitted job, per scanner pass, per worker consume
batch, per completion batch), independent of how many runs the unit carries; the test runs
batches of 1 and of 40 runs, so a call that crept in per run (a read per run in the scanner, a
write per run in the completer) makes the 40-run case fail. Only the outermost port call counts:
the SQLite and PostgreSQL indexes are views of the store, and their `claim_runs` is the one store
transaction it calls.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from stacks import stack

from jobq.app import App
from jobq.clock import SYSTEM_CLOCK, ManualClock
from jobq.daemons.beat import Beat
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.settings import Settings
from jobq.wiring import connect

DOC = Path(__file__).resolve().parent.parent / "docs" / "capacity.md"
STACKS = ("sqlite", "postgres-redis-rabbitmq")
PORTS = ("store", "index", "transport", "history")
# Calls that are not part of a run's path: registration, the task catalogue (read once per cache
# period, not per job), health and gauges.
SETUP = {
    "register_worker",
    "publish_tasks",
    "task_catalogue",
    "known_tasks",
    "heartbeat",
    "live_daemons",
    "depth",
    "queue_depth",
    "health_check",
}
NO_OPS = {"add", "discard"}  # on an index that is a view of the store (SQLite, PostgreSQL): no I/O


def documented() -> dict[str, dict[tuple[str, str, str], int]]:
    """The doc's table between its markers: (role, unit, port.call) -> calls, per stack column."""
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- calls-per-unit:begin -->")[1].split("<!-- calls-per-unit:end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    out: dict[str, dict[tuple[str, str, str], int]] = {name: {} for name in STACKS}
    for line in rows[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        role, unit, call = cells[0], cells[1], cells[2].strip("`")
        for name in STACKS:
            value = cells[header.index(name)]
            if value not in ("", "—"):
                out[name][(role, unit, call)] = int(value)
    return out


class Counting:
    """Counts each thread's outermost port calls under the current role; calls with an empty
    batch (`add([])`, `transition([])`) are no round trip and are not counted."""

    def __init__(self) -> None:
        self.role = "setup"
        self.calls: Counter[tuple[str, str]] = Counter()
        self._depth = threading.local()

    def wrap(self, port: str, obj: Any) -> None:
        for name in dir(type(obj)):
            if name.startswith("_") or name == "close" or name in SETUP:
                continue
            if port == "index" and obj.derived_from_store and name in NO_OPS:
                continue
            fn = getattr(obj, name)
            if callable(fn):
                setattr(obj, name, self._counted(port, name, fn))

    def _counted(self, port: str, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            empty = bool(args) and isinstance(args[0], list | tuple) and not args[0]
            if depth == 0 and not empty:
                self.calls[(self.role, f"{port}.{name}")] += 1
            self._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth

        return counted

    @contextmanager
    def acting(self, role: str) -> Iterator[None]:
        self.role = role
        try:
            yield
        finally:
            self.role = "setup"


@pytest.mark.parametrize("runs", [1, 40])
@pytest.mark.parametrize("name", STACKS)
def test_each_roles_port_calls_per_unit_of_work_match_docs_capacity(name: str, runs: int, tmp_path: Path) -> None:
    expected = documented()[name]
    clock = ManualClock(SYSTEM_CLOCK.now_ms())  # real time: Redis expires the index's buckets by its own clock
    with stack(name, tmp_path) as built:
        d = connect(Settings.load({**built.urls, "history_flush_s": 0}, env={}), clock)
        app = App(clock=clock)
        app.use(d)

        @app.task(name="capacity.noop")
        def noop() -> None:
            return None

        beat, scanner = Beat(d), Scanner(d, scanner_id="scanner-capacity")
        worker = Worker(d, app.registry, concurrency=64, background=False)
        try:
            worker.start()  # registers and publishes the task first, as a deployment's workers have
            counting = Counting()
            for port in PORTS:
                counting.wrap(port, getattr(d, port))
            if scanner.index is not d.index:  # a Redis index hands each scanner its own view
                counting.wrap("index", scanner.index)

            with counting.acting("client"):
                for _ in range(runs):
                    noop.schedule(delay_s=5)
            clock.advance(s=6)
            now = clock.now_ms()
            with counting.acting("beat"):
                beat.run_once(now)
            with counting.acting("scanner"):
                assert scanner.run_once(now) == runs  # one pass takes them all (scan_batch 500)
            consumed, batches = 0, 0
            with counting.acting("worker"):
                for _ in range(100):
                    taken = worker.run_once(now, wait_s=0.5)
                    consumed += taken
                    batches += taken > 0
                    if consumed == runs:
                        break
                assert consumed == runs
                assert worker.state.wait(lambda: worker.state.executing() == 0, 30)
                assert worker.complete_once(now) == runs  # every outcome in one completion batch
                assert worker.wait_idle(30)

            units = {
                "per submitted job": runs,
                "per pass": 1,
                "per repair pass": 1,
                "per consume batch": batches,
                "per completion batch": 1,
            }
            want: Counter[tuple[str, str]] = Counter()
            for (role, unit, call), n in expected.items():
                want[(role, call)] += n * units[unit]
            got = +Counter({k: v for k, v in counting.calls.items() if k[0] != "setup"})
            # Empty polls (a consume that found nothing yet) are waiting, not work per run.
            got[("worker", "transport.consume")] = batches
            assert dict(got) == dict(+want)
        finally:
            worker.shutdown()
            d.close()


def test_the_doc_table_names_only_port_calls_that_exist() -> None:
    from jobq import ports

    methods = {
        "store": set(dir(ports.JobStore)),
        "index": set(dir(ports.TimeIndex)) | set(dir(ports.ClaimingIndex)),
        "transport": set(dir(ports.Transport)),
        "history": set(dir(ports.HistorySink)),
    }
    for table in documented().values():
        for _, _, call in table:
            port, method = call.split(".")
            assert method in methods[port], call
    assert re.search(r"<!-- calls-per-unit:begin -->", DOC.read_text(encoding="utf-8"))
