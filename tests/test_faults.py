"""Outages of a dependency, with real processes: nothing is lost or duplicated, daemons recover."""

from __future__ import annotations

import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from private_redis import PrivateRedis
from procs import Processes, wait_until
from services import free_port
from test_e2e_processes import TASKS, _effects

from jobq.client import Client
from jobq.deployment import Deployment
from jobq.models import JobKey, JobStatus, Priority, RunState, TaskTarget
from jobq.ports import RunQuery
from jobq.settings import Settings
from jobq.submission import JobSpec
from jobq.wiring import connect

pytestmark = pytest.mark.slow


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "e2e_tasks.py").write_text(TASKS)
    effects = sqlite3.connect(tmp_path / "effects.db")
    effects.execute("CREATE TABLE effects (run_id TEXT, attempt INT, fence INT, worker TEXT, kind TEXT)")
    effects.commit()
    effects.close()
    return tmp_path


def _health(port: int) -> int:
    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_a_redis_outage_loses_and_duplicates_nothing_and_workers_report_it(workdir: Path, redis: PrivateRedis) -> None:
    store = f"sqlite:///{workdir / 'jobq.db'}"
    env = {
        "JOBQ_STORE": store,
        "JOBQ_INDEX": redis.url,  # the time index and the broker both live on the Redis that goes away
        "JOBQ_BROKER": redis.url,
        "JOBQ_SCHEDULE_TO_START_S": "5",  # messages lost with the broker are re-dispatched soon
        "JOBQ_REPAIR_INTERVAL_S": "1",
        "E2E_EFFECTS": str(workdir / "effects.db"),
    }
    urls = {"store": store, "index": redis.url, "broker": redis.url, "history_flush_s": 0}
    d: Deployment = connect(Settings.load(urls, env={}))
    procs = Processes(workdir, env)
    health_port = free_port()
    try:
        for name in ("beat", "scanner", "reaper"):
            procs.start(name, name)
        procs.start("worker-1", "worker", "-A", "e2e_tasks", "-c", "4", "--metrics-port", str(health_port))
        procs.start("worker-2", "worker", "-A", "e2e_tasks", "-c", "4")
        wait_until(lambda: _health(health_port) == 200, 30, "the worker to report healthy")
        client = Client(d)

        def spec(**fields: object) -> JobSpec:
            return JobSpec.model_validate({"target": TaskTarget(task="e2e.record"), **fields})

        for i in range(200):
            client.submit(spec(schedule_type="IMMEDIATE", priority=list(Priority)[i % 4]))
        for i in range(100):  # due before, during and after the outage
            client.submit(spec(schedule_type="ONE_OFF", delay_seconds=0.1 * i))
        time.sleep(1.5)
        redis.stop()
        wait_until(lambda: _health(health_port) == 503, 30, "the worker to report the lost broker")
        time.sleep(5)
        redis.start()
        wait_until(lambda: _health(health_port) == 200, 60, "the worker to recover")

        def everything_done() -> bool:
            runs = d.store.list_runs(RunQuery(limit=1000)).items
            return len(runs) == 300 and all(r.state is RunState.SUCCEEDED for r in runs)

        wait_until(everything_done, 120, "every run to succeed after the outage")
        executed = [row[0] for row in _effects(workdir)]
        assert len(executed) == len(set(executed)) == 300, "a run was lost or executed twice"
    finally:
        codes = procs.stop_all()
        d.close()
    assert all(code == 0 for code in codes.values()), (codes, procs.logs())
    assert "scanner pass failed" in procs.log("scanner"), "the scanner should log the outage"
    assert "consume failed" in procs.log("worker-1"), "the worker should log the outage"


def test_flushing_the_time_index_mid_run_loses_nothing_because_beat_repairs_it(
    workdir: Path, redis: PrivateRedis
) -> None:
    store = f"sqlite:///{workdir / 'jobq.db'}"
    env = {
        "JOBQ_STORE": store,
        "JOBQ_INDEX": redis.url,
        "JOBQ_REPAIR_INTERVAL_S": "1",
        "E2E_EFFECTS": str(workdir / "effects.db"),
    }
    d = connect(Settings.load({"store": store, "index": redis.url, "history_flush_s": 0}, env={}))
    procs = Processes(workdir, env)
    try:
        client = Client(d)
        for i in range(1000):  # due over the next 8 seconds
            spec = JobSpec.model_validate(
                {"target": TaskTarget(task="e2e.record"), "schedule_type": "ONE_OFF", "delay_seconds": 0.008 * i}
            )
            client.submit(spec)
        for name in ("beat", "scanner", "reaper"):
            procs.start(name, name)
        procs.start("worker", "worker", "-A", "e2e_tasks", "-c", "8")
        wait_until(lambda: len(_effects(workdir)) >= 100, 60, "the first runs")
        import redis as redis_client

        flusher = redis_client.Redis.from_url(redis.url)
        assert flusher.dbsize() > 0
        flusher.flushall()  # the index loses every entry still waiting
        flusher.close()

        def everything_done() -> bool:
            runs = d.store.list_runs(RunQuery(limit=2000)).items
            return len(runs) == 1000 and all(r.state is RunState.SUCCEEDED for r in runs)

        wait_until(everything_done, 120, "every run to succeed after the flush")
        executed = [row[0] for row in _effects(workdir)]
        assert len(executed) == len(set(executed)) == 1000
        assert "re-indexed" in procs.log("beat"), "beat should have repaired the index"
    finally:
        codes = procs.stop_all()
        d.close()
    assert all(code == 0 for code in codes.values()), (codes, procs.logs())


@pytest.mark.timeout(300)  # its own waits add up to more than the default 120 s
def test_a_stalled_redis_holds_up_no_outcome_and_duplicates_no_finished_run(workdir: Path, redis: PrivateRedis) -> None:
    """Redis (broker and index) is SIGSTOPped past the leases, not killed: nothing crashes, so no
    run may execute twice. Workers keep writing outcomes and renewing leases in the store while
    their acks and visibility extensions wait for the broker."""
    import os
    import signal

    store = f"sqlite:///{workdir / 'jobq.db'}"
    env = {
        "JOBQ_STORE": store,
        "JOBQ_INDEX": redis.url,
        "JOBQ_BROKER": redis.url,
        "JOBQ_LEASE_S": "6",  # the stall lasts twice a lease
        "JOBQ_HEARTBEAT_S": "2",
        "JOBQ_CLAIM_LEASE_S": "6",
        "E2E_EFFECTS": str(workdir / "effects.db"),
    }
    d = connect(Settings.load({"store": store, "index": redis.url, "broker": redis.url, "history_flush_s": 0}, env={}))
    procs = Processes(workdir, env)
    try:
        for name in ("beat", "scanner", "reaper"):
            procs.start(name, name)
        for n in (1, 2):
            procs.start(f"worker-{n}", "worker", "-A", "e2e_tasks", "-c", "8")
        client = Client(d)
        spec = JobSpec.model_validate({"target": TaskTarget(task="e2e.slow"), "schedule_type": "IMMEDIATE"})
        work = spec.model_copy(update={"payload": {"args": [0.05]}})
        for _ in range(600):
            client.submit(work)
        wait_until(lambda: len(_effects(workdir)) >= 200, 60, "work under way")
        assert redis.proc is not None
        os.kill(redis.proc.pid, signal.SIGSTOP)
        time.sleep(12)
        os.kill(redis.proc.pid, signal.SIGCONT)

        def everything_done() -> bool:
            runs = d.store.list_runs(RunQuery(limit=1000)).items
            return len(runs) == 600 and all(r.state is RunState.SUCCEEDED for r in runs)

        wait_until(everything_done, 120, "every run to succeed after the stall")
        runs = d.store.list_runs(RunQuery(limit=1000)).items
        assert {r.attempt for r in runs} == {1}, "no finished run was taken back and run again"
        started = [row[0] for row in _effects(workdir, "started")]
        assert len(started) == len(set(started)) == 600, "a run was executed twice with nothing crashed"
    finally:
        if redis.proc is not None:
            os.kill(redis.proc.pid, signal.SIGCONT)
        codes = procs.stop_all()
        d.close()
    assert all(code == 0 for code in codes.values()), (codes, procs.logs())


# The pools whose outcome path differs most: prefork (the default: outcomes come back from
# children), threads, and gevent (store calls yield to the hub while PostgreSQL is away).
@pytest.mark.timeout(300)
@pytest.mark.parametrize("pool", ["prefork", "threads", "gevent"])
def test_a_store_outage_during_completion_loses_no_outcome(workdir: Path, pool: str) -> None:
    """PostgreSQL is cut off (connections dropped, new ones refused) for 4 s while tasks finish:
    workers hold the finished attempts, keep retrying their outcome writes and renewing their
    leases, and every run ends SUCCEEDED on its first attempt."""
    import uuid

    from services import require_postgres
    from stacks import self_hosted_cleanups
    from tcp_proxy import TcpProxy

    from jobq.wiring import init_store

    dsn = require_postgres()
    proxy = TcpProxy("127.0.0.1", 5432)
    tag = f"t{uuid.uuid4().hex[:10]}"
    direct = f"{dsn}?schema={tag}"
    proxied = f"postgresql://127.0.0.1:{proxy.port}/test?schema={tag}&pool_timeout=1"  # an outage raises, not waits
    init_store(Settings.load({"store": direct}, env={}))
    env = {
        "JOBQ_STORE": proxied,
        "JOBQ_INDEX": proxied,
        "JOBQ_BROKER": f"sqlite:///{workdir / 'queue.db'}",
        # The outage is 4 s; after it the connection pool reconnects with a backoff of its own,
        # so renewals may resume seconds later: a 15 s lease leaves room for both on a busy machine.
        "JOBQ_LEASE_S": "15",
        "JOBQ_HEARTBEAT_S": "2",
        "JOBQ_CLAIM_LEASE_S": "10",
        "E2E_EFFECTS": str(workdir / "effects.db"),
    }
    d = connect(Settings.load({"store": direct, "broker": env["JOBQ_BROKER"], "history_flush_s": 0}, env={}))
    procs = Processes(workdir, env)
    try:
        for name in ("scanner", "reaper"):
            procs.start(name, name)
        if pool == "gevent":
            pytest.importorskip("gevent", reason="the gevent pool needs jobq[gevent]")
        procs.start("worker", "worker", "-A", "e2e_tasks", "-c", "16", "-P", pool)
        client = Client(d)
        spec = JobSpec.model_validate(
            {"target": TaskTarget(task="e2e.slow"), "schedule_type": "IMMEDIATE", "payload": {"args": [0.3]}}
        )
        for _ in range(300):
            client.submit(spec)
        wait_until(lambda: len(_effects(workdir)) >= 60, 60, "work under way")
        proxy.cut()
        time.sleep(4)
        proxy.restore()

        def everything_done() -> bool:
            runs = d.store.list_runs(RunQuery(limit=1000)).items
            return len(runs) == 300 and all(r.state is RunState.SUCCEEDED for r in runs)

        wait_until(everything_done, 120, "every run to succeed after the outage")
        time.sleep(16)  # past every lease: a dropped outcome would now be reclaimed and run again
        runs = d.store.list_runs(RunQuery(limit=1000)).items
        assert {(r.state, r.attempt) for r in runs} == {(RunState.SUCCEEDED, 1)}
        started = [row[0] for row in _effects(workdir, "started")]
        assert len(started) == len(set(started)) == 300, "a finished run was executed again"
        assert "could not record" in procs.log("worker"), "the outcome writes did meet the outage"
    finally:
        proxy.restore()
        codes = procs.stop_all()
        d.close()
        proxy.close()
        for cleanup in self_hosted_cleanups(tag)[:1]:
            cleanup()
    assert all(code == 0 for code in codes.values()), (codes, procs.logs())


def test_a_job_row_that_does_not_decode_never_stops_the_healthy_cron_job_beside_it(workdir: Path) -> None:
    """Issue 9 item 1: a job stored with `max_retries: -1` stopped every beat, scanner and reaper
    pass, and a valid `*/1 * * * * *` job beside it ran 0 times. Now the daemons quarantine it once
    and go on."""
    store = f"sqlite:///{workdir / 'jobq.db'}"
    d = connect(Settings.load({"store": store, "history_flush_s": 0}, env={}))
    procs = Processes(workdir, {"JOBQ_STORE": store, "E2E_EFFECTS": str(workdir / "effects.db")})
    try:
        client = Client(d)
        every_second = {"schedule_type": "CRON", "cron_expression": "*/1 * * * * *"}
        for job_id in ("poison", "healthy"):
            client.submit(
                JobSpec.model_validate({"job_id": job_id, "target": TaskTarget(task="e2e.record"), **every_second})
            )
        raw = sqlite3.connect(workdir / "jobq.db")  # as an older version, a hand edit or a bug left it
        with raw:
            raw.execute("UPDATE jobq_jobs SET doc = json_set(doc, '$.retry.max_retries', -1) WHERE job_id = 'poison'")
        raw.close()
        assert client.job("poison").corrupt is not None
        for name in ("beat", "scanner", "reaper"):
            procs.start(name, name)
        procs.start("worker", "worker", "-A", "e2e_tasks", "-c", "4")

        def healthy_runs() -> int:
            return sum(run_id.startswith("healthy:") for run_id, *_ in _effects(workdir))

        wait_until(lambda: healthy_runs() >= 8, 60, "the healthy cron job to run 8 times")
        wait_until(lambda: client.job("poison").status is JobStatus.QUARANTINED, 30, "the poison job's quarantine")
        started = healthy_runs()
        time.sleep(3)
        assert healthy_runs() >= started + 2, "the healthy job goes on running"
        assert not [run_id for run_id, *_ in _effects(workdir) if run_id.startswith("poison:")]
        poison_runs = d.store.list_runs(RunQuery(job=JobKey("default", "poison"), limit=1000)).items
        assert poison_runs and all(r.state is RunState.FAILED and r.dead_letter for r in poison_runs)
        assert all((r.last_error or "").startswith("Corrupt: ") for r in poison_runs)
    finally:
        codes = procs.stop_all()
        d.close()
    assert all(code == 0 for code in codes.values()), (codes, procs.logs())
    logs = "".join(procs.log(name) for name in procs.procs)
    assert logs.count("quarantined job poison:") == 1, procs.logs()
    assert "pass failed" not in logs, procs.logs()
