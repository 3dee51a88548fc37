"""Pool choice and pool options: prefork recycling, `async def` tasks on every pool, the missing
gevent extra, and `-P`/`JOBQ_POOL`/TOML settings."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from harness import Harness

from jobq.cli.daemons import _GEVENT_BOOTED as _GEVENT_ENV
from jobq.cli.main import cli
from jobq.clock import ManualClock
from jobq.daemons.worker.pools import make_pool
from jobq.daemons.worker.pools.prefork import rss_kib
from jobq.errors import ConfigError, MissingExtra
from jobq.models import RunState
from jobq.settings import Settings


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness("sqlite", tmp_path, clock)
    yield harness
    harness.close()


def _pids_of_runs(h: Harness, handles: list, worker_kw: dict) -> list[int]:  # type: ignore[type-arg]
    h.dispatch()
    worker = h.worker(pool="prefork", concurrency=1, **worker_kw)
    pids = []
    for handle in handles:
        h.work(worker)
        run = h.client.get(handle.job_id).current_run
        assert run is not None and run.state is RunState.SUCCEEDED, run
        pids.append(run.result)
    return pids


@pytest.mark.slow
def test_prefork_replaces_a_child_after_max_tasks_per_child(tmp_path: Path, clock: ManualClock) -> None:
    h = Harness("sqlite", tmp_path, clock, max_tasks_per_child=2)
    try:

        @h.app.task(name="t.pid")
        def pid() -> int:
            return os.getpid()

        pids = _pids_of_runs(h, [pid.delay() for _ in range(5)], {})
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
        assert os.getpid() not in pids
    finally:
        h.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prefork_children_start_with_every_lock_free_while_the_worker_s_threads_use_sqlite(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A fork copies every lock as it is at that instant. Children the worker forked itself, while
    its threads were inside SQLite, hung for ever in their first `sqlite3.connect` (SQLite's
    allocator mutex, copied held): about once in a hundred forks, a slot lost for good (the
    stalled-Redis fault test on the SQLite store). Children now come from the zygote, forked before
    those threads exist. Every task here runs in a fresh child while three threads use SQLite."""
    import sqlite3
    import threading

    h = Harness("sqlite", tmp_path, clock, max_tasks_per_child=1)
    stop = threading.Event()
    side = str(tmp_path / "side.db")
    try:

        @h.app.task(name="t.sqlite")
        def use_sqlite() -> int:
            conn = sqlite3.connect(side, timeout=30)
            try:
                return int(conn.execute("SELECT 1").fetchone()[0])
            finally:
                conn.close()

        handles = [use_sqlite.delay() for _ in range(400)]
        h.dispatch()
        worker = h.worker(pool="prefork", concurrency=2)  # the pool (and its zygote) before the threads

        def use_sqlite_here() -> None:
            while not stop.is_set():
                conn = sqlite3.connect(str(tmp_path / "busy.db"), timeout=30)
                with conn:
                    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
                    conn.execute("INSERT INTO t VALUES (?)", (b"x" * 1000,))
                conn.close()

        for _ in range(3):
            threading.Thread(target=use_sqlite_here, daemon=True).start()
        h.work(worker, rounds=1000)  # fails if a child hangs: the worker is not idle within 10 s
        runs = [h.client.get(handle.job_id).current_run for handle in handles]
        assert {(r.state, r.result) for r in runs if r is not None} == {(RunState.SUCCEEDED, 1)}
        assert len(runs) == 400
    finally:
        stop.set()
        h.close()


LEAK: list[bytes] = []


@pytest.mark.slow
def test_prefork_replaces_a_child_whose_memory_passes_the_limit(tmp_path: Path, clock: ManualClock) -> None:
    limit_kib = rss_kib() + 64 * 1024  # a child starts as big as this process
    h = Harness("sqlite", tmp_path, clock, max_memory_per_child_kib=limit_kib)
    try:

        @h.app.task(name="t.leak")
        def leak(mib: int) -> int:
            LEAK.append(os.urandom(mib * 1024 * 1024))  # kept: the child's memory only grows
            return os.getpid()

        pids = _pids_of_runs(h, [leak.delay(1), leak.delay(128), leak.delay(1)], {})
        assert pids[0] == pids[1], "under the limit the child stays"
        assert pids[2] != pids[1], "past the limit (after the 128 MiB task) the child was replaced"
    finally:
        h.close()


@pytest.mark.parametrize("pool", ["threads", "solo", "prefork", "asyncio"])
def test_an_async_def_task_runs_on_every_pool(h: Harness, pool: str) -> None:
    @h.app.task(name="t.async")
    async def double(x: int) -> int:
        await asyncio.sleep(0.01)
        return x * 2

    handle = double.delay(21)
    h.dispatch()
    h.work(h.worker(pool=pool, concurrency=2))
    run = h.client.get(handle.job_id).current_run
    assert run is not None and run.state is RunState.SUCCEEDED and run.result == 42


def test_a_sync_task_on_the_asyncio_pool_runs_in_a_thread_not_on_the_loop(h: Harness) -> None:
    @h.app.task(name="t.where")
    def where() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return True  # no loop in this thread: the loop is free for the async tasks
        return False

    handle = where.delay()
    h.dispatch()
    h.work(h.worker(pool="asyncio", concurrency=2))
    run = h.client.get(handle.job_id).current_run
    assert run is not None and run.result is True


def test_an_unknown_pool_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="prefork, threads, gevent, asyncio, solo"):
        make_pool("fibers")


def test_the_gevent_pool_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gevent", None)  # as if it were not installed
    with pytest.raises(MissingExtra, match=r"jobq\[gevent\]"):
        make_pool("gevent")


def test_the_pool_and_limits_come_from_variables_and_a_worker_table_in_the_file(tmp_path: Path) -> None:
    config = tmp_path / "jobq.toml"
    config.write_text('[jobq]\nstore = "sqlite:///x.db"\n\n[jobq.worker]\npool = "asyncio"\nconcurrency = 500\n')
    from_file = Settings.load(config_file=config, env={})
    assert (from_file.pool, from_file.concurrency) == ("asyncio", 500)
    from_env = Settings.load(env={"JOBQ_POOL": "gevent", "JOBQ_AUTOSCALE": "8,2", "JOBQ_TIME_LIMIT_S": "30"})
    assert (from_env.pool, from_env.autoscale, from_env.time_limit_s) == ("gevent", (8, 2), 30.0)


def test_worker_help_lists_every_pool() -> None:
    result = CliRunner().invoke(cli, ["worker", "--help"])
    assert result.exit_code == 0
    assert "prefork|threads|gevent|asyncio|solo" in result.output
    for flag in ("--autoscale", "--time-limit", "--soft-time-limit", "--max-tasks-per-child", "--max-memory-per-child"):
        assert flag in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-P", "fibers"], "fibers"),
        (["--autoscale", "2,8"], "autoscale"),
        (["--autoscale", "lots"], "MAX,MIN"),
        (["--soft-time-limit", "10", "--time-limit", "5"], "soft_time_limit_s"),
    ],
)
def test_bad_worker_options_exit_2_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["worker", "--store", f"sqlite:///{tmp_path / 'x.db'}", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("segfault", "killed by signal SIGSEGV"),
        ("oom-kill", "killed by signal SIGKILL"),  # what the OOM killer sends
        ("exit", "exit code 3"),
    ],
)
def test_a_prefork_child_dying_mid_task_fails_the_attempt_with_the_reason_and_the_worker_goes_on(
    h: Harness, how: str, reason: str
) -> None:
    import signal

    @h.app.task(name="t.die")
    def die(how: str) -> None:
        if how == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif how == "oom-kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)

    @h.app.task(name="t.pid")
    def pid() -> int:
        return os.getpid()

    dying = die.delay(how)
    h.dispatch()
    worker = h.worker(pool="prefork", concurrency=1)
    h.work(worker)
    run = h.client.get(dying.job_id).current_run
    assert run is not None and run.attempt == 2 and run.state is RunState.SCHEDULED
    assert run.last_error is not None and "WorkerLost" in run.last_error and reason in run.last_error
    after = pid.delay()
    h.dispatch()
    h.work(worker)
    alive = h.client.get(after.job_id).current_run
    assert alive is not None and alive.state is RunState.SUCCEEDED and alive.result != os.getpid()


@pytest.mark.slow
def test_a_gevent_worker_starts_where_trio_is_installed(tmp_path: Path) -> None:
    """gevent's patch removes `select.epoll`; importing trio then raises AttributeError, and httpcore
    (the webhook client) imports trio whenever it is installed: `jobq worker -P gevent` died at start.
    A stand-in trio that fails as the real one does under the patch proves the worker no longer
    reaches it."""
    pytest.importorskip("gevent", reason="the gevent pool needs jobq[gevent]")
    fake = tmp_path / "site" / "trio"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import select\nselect.epoll  # gone under gevent's patch, as in trio\n")
    (tmp_path / "tasks_mod.py").write_text(
        "from jobq import App\napp = App('t')\n\n@app.task\ndef noop():\n    return 1\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(tmp_path)]),
        "JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}",
        "JOBQ_REGISTRY_HEARTBEAT_S": "0",
    }
    env.pop(_GEVENT_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobq.cli", "worker", "-A", "tasks_mod", "-P", "gevent", "-c", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "serving" in line or "Traceback" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert any("serving" in line for line in lines), "".join(lines)
