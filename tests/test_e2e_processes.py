"""End to end with real processes on one SQLite file: beats, scanners, workers and reapers.

Every task execution inserts a row into a side-effect table keyed by run id (no unique key), so
a run executed twice shows up as two rows.
"""

from __future__ import annotations

import sqlite3
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import Processes, alive, wait_until
from stacks import STACKS, Stack, stack

from jobq.client import Client
from jobq.codec import Envelope
from jobq.daemons.worker import Worker
from jobq.daemons.worker.attempt import Attempt, Outcome
from jobq.deployment import Deployment
from jobq.metrics import METRICS
from jobq.models import Priority, RunState, TaskTarget
from jobq.ports import Delivery, RunQuery
from jobq.submission import JobSpec
from jobq.tasks import TaskContext, TaskDef, TaskRegistry

pytestmark = pytest.mark.slow

TASKS = textwrap.dedent(
    """
    import os, sqlite3, time
    from jobq import App, RetryPolicy, current_context

    app = App("e2e")

    def record(kind):
        ctx = current_context()
        conn = sqlite3.connect(os.environ["E2E_EFFECTS"], timeout=30)
        with conn:
            conn.execute(
                "INSERT INTO effects (run_id, attempt, fence, worker, kind) VALUES (?, ?, ?, ?, ?)",
                (ctx.run_id, ctx.attempt, ctx.fence, ctx.worker_id, kind),
            )
        conn.close()

    @app.task(name="e2e.record")
    def done():
        record("done")

    @app.task(name="e2e.slow", retry=RetryPolicy(max_retries=3, initial_interval_sec=0.2, max_interval_sec=0.5))
    def slow(seconds):
        record("started")
        if current_context().attempt == 1:
            time.sleep(seconds)
        record("done")
    """
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "e2e_tasks.py").write_text(TASKS)
    effects = sqlite3.connect(tmp_path / "effects.db")
    effects.execute("CREATE TABLE effects (run_id TEXT, attempt INT, fence INT, worker TEXT, kind TEXT)")
    effects.execute("PRAGMA journal_mode=WAL")
    effects.commit()
    effects.close()
    return tmp_path


# (stack, pool): the default pool (prefork) on every stack; the other pools on the embedded stack
# only, which is the cheapest cell (what differs between pools is execution, not the backends).
CELLS = [(name, "prefork") for name in STACKS] + [("sqlite", pool) for pool in ("threads", "gevent", "asyncio")]


@pytest.fixture(params=CELLS, ids=[f"{name}-{pool}" for name, pool in CELLS])
def deployed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Stack, Deployment, str]]:
    name, pool = request.param
    if pool == "gevent":
        pytest.importorskip("gevent", reason="the gevent pool needs jobq[gevent]")
    with stack(name, tmp_path) as built:
        d = built.connect()
        yield built, d, pool
        d.close()


def _env(built: Stack, workdir: Path, **settings: str) -> dict[str, str]:
    env = {**built.env, "E2E_EFFECTS": str(workdir / "effects.db")}
    env.update({f"JOBQ_{k.upper()}": v for k, v in settings.items()})
    return env


def _effects(workdir: Path, kind: str = "done") -> list[tuple[str, int, int, str]]:
    conn = sqlite3.connect(workdir / "effects.db", timeout=30)
    rows = conn.execute("SELECT run_id, attempt, fence, worker FROM effects WHERE kind = ?", (kind,)).fetchall()
    conn.close()
    return rows


def _spec(task: str, **fields: object) -> JobSpec:
    return JobSpec.model_validate({"target": TaskTarget(task=task), "schedule_type": "IMMEDIATE", **fields})


def _all_runs(d: Deployment) -> list:  # type: ignore[type-arg]
    runs, cursor = [], None
    while True:
        page = d.store.list_runs(RunQuery(cursor=cursor, limit=1000))
        runs += page.items
        if page.next_cursor is None:
            return runs
        cursor = page.next_cursor


def test_every_run_succeeds_exactly_once_across_real_processes(
    workdir: Path, deployed: tuple[Stack, Deployment, str]
) -> None:
    """Two copies of every daemon: copies must never duplicate a run."""
    built, deployment, pool = deployed
    instant_n, delayed_n, cron_s = round(500 * built.scale), max(5, round(50 * built.scale)), 10
    procs = Processes(workdir, _env(built, workdir))
    try:
        for name in ("beat", "scanner", "reaper"):
            for copy in range(1, built.copies + 1):
                procs.start(f"{name}-{copy}", name)
        procs.start("worker-1", "worker", "-A", "e2e_tasks", "-c", "4", "-P", pool)
        procs.start("worker-2", "worker", "-A", "e2e_tasks", "-c", "4", "-P", pool)
        wait_until(lambda: all("serving" in procs.log(w) for w in ("worker-1", "worker-2")), 60, "both workers")
        client = Client(deployment)
        tiers = list(Priority)
        instant = [client.submit(_spec("e2e.record", priority=tiers[i % 4])).job.job_id for i in range(instant_n)]
        delayed = [
            client.submit(_spec("e2e.record", schedule_type="ONE_OFF", delay_seconds=1 + i % 5)).job.job_id
            for i in range(delayed_n)
        ]
        cron = client.submit(
            _spec("e2e.record", schedule_type="CRON", cron_expression="* * * * * *", overlap_policy="ALLOW_ALL")
        ).job
        time.sleep(cron_s)
        client.cancel(cron.job_id)
        cancelled_at = deployment.clock.now_ms()

        def finished() -> bool:
            return all(r.state.terminal for r in _all_runs(deployment))

        wait_until(finished, 180, "every run to finish")
        runs = _all_runs(deployment)
        one_offs = [r for r in runs if r.job_id != cron.job_id]
        cron_runs = [r for r in runs if r.job_id == cron.job_id]
        assert {r.job_id for r in one_offs} == set(instant) | set(delayed)
        assert all(r.state is RunState.SUCCEEDED for r in one_offs), procs.logs()
        fired = [r for r in cron_runs if r.state is RunState.SUCCEEDED]
        assert len(fired) >= cron_s - 2, [(r.run_id, r.state) for r in cron_runs]
        # Runs due well before the cancellation ran; any other was cancelled (and is never executed).
        assert all(r.state is RunState.SUCCEEDED for r in cron_runs if r.nominal_ms < cancelled_at - 5000)
        assert all(r.state is RunState.CANCELLED for r in cron_runs if r.state is not RunState.SUCCEEDED)

        effects = _effects(workdir)
        executed = [row[0] for row in effects]
        assert len(executed) == len(set(executed)), "a run executed twice"
        assert set(executed) == {r.run_id for r in runs if r.state is RunState.SUCCEEDED}
        workers = {row[3] for row in effects}
        assert len(workers) == 2, "both workers took runs"
    finally:
        codes = procs.stop_all()
    assert all(code == 0 for code in codes.values()), (codes, procs.logs())


def test_a_killed_worker_s_run_is_reclaimed_and_completed_elsewhere_with_a_higher_fence(
    workdir: Path, deployed: tuple[Stack, Deployment, str]
) -> None:
    built, deployment, pool = deployed
    procs = Processes(
        workdir, _env(built, workdir, lease_s="3", heartbeat_s="1", claim_lease_s="3", visibility_timeout_s="60")
    )
    try:
        for name in ("beat", "scanner", "reaper"):
            procs.start(name, name)
        procs.start("worker-a", "worker", "-A", "e2e_tasks", "-c", "1", "-P", pool, "--worker-id", "worker-a")
        client = Client(deployment)
        job = client.submit(_spec("e2e.slow", payload={"args": [30]})).job

        def held_by_a() -> bool:
            run = client.get(job.job_id).current_run
            return run is not None and run.state is RunState.RUNNING and run.lease_owner == "worker-a"

        wait_until(held_by_a, 30, "worker-a to start the run")
        wait_until(lambda: bool(_effects(workdir, "started")), 10, "the task to start")
        held = client.get(job.job_id).current_run
        assert held is not None
        children = procs.descendants("worker-a")
        if pool == "prefork":
            assert len(children) >= 2, "a prefork worker runs its tasks in children of its zygote"
        procs.kill9("worker-a")
        # A prefork child outlives a worker killed by SIGKILL only briefly: its zygote sees the worker
        # gone and exits, and the children see the zygote gone and exit.
        wait_until(lambda: not any(alive(pid) for pid in children), 10, "the killed worker's children to exit")
        procs.start("worker-b", "worker", "-A", "e2e_tasks", "-c", "1", "-P", pool, "--worker-id", "worker-b")

        final = client.wait(job.job_id, timeout_s=60)
        assert final.state is RunState.SUCCEEDED, procs.logs()
        assert final.attempt == 2
        assert final.fence > held.fence
        done = _effects(workdir)
        assert [(w, a) for _, a, _, w in done] == [("worker-b", 2)]
        assert done[0][2] == final.fence

        # The killed worker's completion, arriving late with its old fence, is rejected and counted:
        # a worker holding the old start runs the task to its end and writes the outcome.
        registry = TaskRegistry()
        registry.add(TaskDef("e2e.slow", lambda *args: None))
        late_worker = Worker(deployment, registry, worker_id="worker-a", background=False)
        before = METRICS.fenced_writes.value(op="complete")
        envelope = Envelope(held.run_id, held.job_id, held.fence, "e2e.slow", held.priority, held.attempt, {})
        ctx = TaskContext(held.run_id, held.job_id, held.attempt, held.fence, "e2e.slow", "worker-a")
        task = registry.get("e2e.slow")
        assert task is not None
        delivery = Delivery("default", b"", "0:stale", 1)
        stale = Attempt(held, None, envelope, delivery, task, {}, ctx, started_ms=0, timeout_s=None, beat_ms=0)
        late_worker.state.add([stale])
        late_worker.finished(stale.key, Outcome(result=None))
        assert late_worker.complete_once(deployment.clock.now_ms()) == 1
        assert METRICS.fenced_writes.value(op="complete") == before + 1
        after = client.run(held.run_id)
        assert (after.state, after.fence, after.attempt) == (RunState.SUCCEEDED, final.fence, 2)
    finally:
        procs.stop_all()
