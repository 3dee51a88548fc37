"""`jobq status` (no job), `jobq workers` and `jobq top`: what an operator sees of a deployment."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from harness import Harness
from procs import JOBQ, Processes, wait_until
from rich.console import Console
from services import free_port

from jobq.cli.main import cli
from jobq.cli.observe import age, top_view
from jobq.clock import SYSTEM_CLOCK, ManualClock
from jobq.daemons.registrar import Registrar
from jobq.metrics import Histogram
from jobq.models import Priority
from jobq.overview import take_overview
from jobq.registry import DaemonRecord, Role, Running
from jobq.trends import Trends, quantile

Invoke = Callable[..., Result]


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    # The CLI reads the real time: the harness starts 100 s back, so a test may advance it that far.
    harness = Harness("sqlite", tmp_path, ManualClock(SYSTEM_CLOCK.now_ms() - 100_000))
    yield harness
    harness.close()


@pytest.fixture
def run(h: Harness, tmp_path: Path) -> Invoke:
    store = f"sqlite:///{tmp_path / 'jobq.db'}"

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli, list(args), env={"JOBQ_STORE": store}, catch_exceptions=False)

    return invoke


def _real_time(h: Harness) -> Harness:
    """Registry entries are read against the CLI's real clock: write them at the real time."""
    h.clock.set(SYSTEM_CLOCK.now_ms())
    return h


def _worker_record(h: Harness, **more: object) -> DaemonRecord:
    now = h.clock.now_ms()
    fields: dict[str, object] = {
        "daemon_id": "worker-box-7",
        "role": Role.WORKER,
        "host": "box",
        "pid": 7,
        "version": "0.1.0",
        "started_ms": now - 60_000,
        "seen_ms": now,
        "queues": ("critical", "high"),
        "pool": "threads",
        "concurrency": 4,
        "busy": 1,
        "free": 2,
        "lost": 1,
        "done": 42,
        "running": (Running("default/job_9:1790000000000", "billing.aggregate", 2, now - 12_500),),
    }
    fields.update(more)
    return DaemonRecord(**fields)  # type: ignore[arg-type]


def test_status_without_a_job_warns_when_no_scanner_beat_or_reaper_is_alive(run: Invoke, h: Harness) -> None:
    _real_time(h)
    Registrar(h.d, [h.worker()]).run_once(h.clock.now_ms())
    result = run("status")
    assert result.exit_code == 0, result.output
    assert (
        "WARNING: no live scanner, beat, reaper: delayed and cron jobs will not run "
        "(start `jobq scanner` `jobq beat` `jobq reaper`, or `jobq dev`)" in result.output
    )
    assert "worker 1" in result.output


def test_status_names_only_the_missing_role(run: Invoke, h: Harness) -> None:
    _real_time(h)
    Registrar(h.d, [h.worker(), h.scanner, h.beat]).run_once(h.clock.now_ms())
    assert "WARNING: no live reaper: delayed and cron jobs will not run" in run("status").output
    Registrar(h.d, [h.reaper]).run_once(h.clock.now_ms())
    assert "WARNING" not in run("status").output


def test_status_shows_backlog_due_runs_states_dead_letters_and_last_errors(run: Invoke, h: Harness) -> None:
    @h.app.task(name="t.noop", priority="CRITICAL")
    def noop() -> None:
        pass

    @h.app.task(name="t.boom", retry={"max_retries": 0})
    def boom() -> None:
        raise ValueError("bad [red]input[/red]")

    boom.delay()
    h.cycle()
    noop.delay()
    noop.delay()
    h.dispatch()
    noop.schedule(delay_s=1)
    h.advance(91)
    result = run("status")
    lines = result.output.splitlines()
    (critical,) = [line.split() for line in lines if line.startswith("critical")]
    assert critical[1] == "2" and critical[2].startswith("1m"), "two waiting, the oldest for over 90 s"
    assert critical[3] == "1" and critical[4].startswith("1m"), "one due, over 90 s late"
    assert "runs     SCHEDULED=1 DISPATCHED=2 FAILED=1" in result.output
    assert "dead letters  1" in result.output
    assert "ValueError: bad [red]input[/red]" in result.output, "error text is printed as it is, never as markup"


def test_status_json_is_one_document_for_scripts(run: Invoke, h: Harness) -> None:
    _real_time(h)
    Registrar(h.d, [h.scanner]).run_once(h.clock.now_ms())
    doc = json.loads(run("status", "--json").output)
    assert doc["daemons_alive"] == {"api": 0, "beat": 0, "scanner": 1, "reaper": 0, "worker": 0}
    assert doc["missing_roles"] == ["beat", "reaper"]
    assert set(doc["backlog"]) == {"critical", "high", "default", "low"}
    assert doc["backlog"]["low"] == {
        "waiting": 0,
        "oldest_age_s": None,
        "due_undispatched": 0,
        "due_oldest_late_s": None,
    }
    assert doc["runs"] == {} and doc["dead_letters"] == 0 and doc["runs_exact"] is True


def test_workers_lists_every_live_daemon_and_what_it_runs_now(run: Invoke, h: Harness) -> None:
    _real_time(h)
    h.d.registry.heartbeat([_worker_record(h)], 15_000)
    Registrar(h.d, [h.scanner]).run_once(h.clock.now_ms())
    result = run("workers")
    assert result.exit_code == 0
    out = result.output
    assert "worker-box-7" in out and "scanner-test" in out
    assert "critical,high (threads)" in out and "1/2/1" in out
    assert "default/job_9:1790000000000 billing.aggregate #2 for 1" in out
    (entry,) = [d for d in json.loads(run("workers", "--json").output) if d["role"] == "worker"]
    assert entry["slots"] == {"busy": 1, "free": 2, "lost": 1}
    assert entry["running"][0]["task"] == "billing.aggregate" and entry["running"][0]["running_s"] >= 12.5


def test_workers_says_so_when_nothing_is_alive(run: Invoke) -> None:
    assert "no live daemons" in run("workers").output


def test_ages_read_at_a_glance() -> None:
    assert [age(None), age(0.25), age(12.54), age(245), age(3 * 3600 + 120), age(50 * 3600)] == [
        "-",
        "250ms",
        "12.5s",
        "4m05s",
        "3h02m",
        "2d02h",
    ]


def _buckets(*latenesses: float) -> tuple[float, ...]:
    h = Histogram("x", "x")
    for value in latenesses:
        h.observe(value)
    return tuple(h.snapshot()[()])


def test_quantiles_interpolate_within_a_bucket() -> None:
    buckets = list(_buckets(*([0.003] * 50), *([0.2] * 49), 2.0))
    assert quantile(0.5, buckets) == pytest.approx(0.005)
    assert 0.1 < quantile(0.99, buckets) <= 0.25  # type: ignore[operator]
    assert quantile(0.5, [0.0] * (len(Histogram.BUCKETS) + 2)) is None


def test_top_shows_throughput_lateness_and_dead_letter_growth_per_tier(h: Harness) -> None:
    trends = Trends(window_s=10)
    first = take_overview(h.d, h.clock.now_ms())
    worker = _worker_record(h, start_lateness={"HIGH": _buckets(0.02)})
    h.d.registry.heartbeat([worker], 15_000)
    trends.add(take_overview(h.d, h.clock.now_ms()))
    h.advance(5)
    later = _buckets(0.02, *([0.3] * 10), *([0.04] * 39))  # 50 more starts in 5 s
    h.d.registry.heartbeat([_worker_record(h, start_lateness={"HIGH": later})], 15_000)
    overview = take_overview(h.d, h.clock.now_ms(), dead_letters=5)
    trends.add(overview)
    assert trends.throughput(Priority.HIGH) == pytest.approx(49 / 5)
    assert trends.throughput(Priority.LOW) == 0
    assert first.census.dead_letters == 0 and trends.dead_letter_growth_per_min() == 0

    screen = Console(record=True, width=200, file=io.StringIO())
    screen.print(top_view(overview, trends, "sqlite:///jobq.db"))
    text = screen.export_text()
    (high,) = [line.split() for line in text.splitlines() if line.startswith("high")]
    # 49 starts in 5 s; p50 within (25 ms, 50 ms], p99 within (250 ms, 500 ms], interpolated
    assert high[-3:] == ["9.8", "41ms", "488ms"]
    assert "WARNING: no live scanner, beat, reaper" in text
    assert "worker-box-7" in text and "(q or Ctrl-C quits)" in text


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_top_runs_full_screen_in_a_terminal_and_q_quits(tmp_path: Path) -> None:
    primary, secondary = pty.openpty()
    env = {**os.environ, "JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}", "COLUMNS": "160", "LINES": "50"}
    subprocess.run([*JOBQ, "init"], env=env, cwd=tmp_path, check=True, capture_output=True)  # top creates no store
    proc = subprocess.Popen([*JOBQ, "top"], stdin=secondary, stdout=secondary, stderr=secondary, env=env, cwd=tmp_path)
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while b"daemons" not in seen and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                seen += os.read(primary, 65536)
        assert b"jobq top" in seen and b"\x1b[?1049h" in seen, "full screen (alternate buffer)"
        os.write(primary, b"q")
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(primary)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_started_alone_warns_within_30_s_and_status_says_the_same(tmp_path: Path) -> None:
    procs = Processes(tmp_path, {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}"})
    started = time.monotonic()
    procs.start("worker", "worker")
    try:
        wait_until(lambda: "will not run" in procs.log("worker"), 60, "the lone worker's warning")
        assert time.monotonic() - started < 45, "within 30 s of starting (and a heartbeat)"
        assert "no live scanner, beat, reaper: delayed and cron jobs will not run" in procs.log("worker")
        status = subprocess.run(
            [*JOBQ, "status"], cwd=tmp_path, env=procs.env, capture_output=True, text=True, timeout=30, check=True
        )
        assert "WARNING: no live scanner, beat, reaper: delayed and cron jobs will not run" in status.stdout
        assert "worker 1" in status.stdout
    finally:
        codes = procs.stop_all()
    assert codes["worker"] == 0, procs.logs()
    assert sys.executable


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_daemon_metrics_port_serves_the_gauges_and_a_killed_daemon_drops_out(tmp_path: Path) -> None:
    port = free_port()
    store = f"sqlite:///{tmp_path / 'jobq.db'}"
    procs = Processes(tmp_path, {"JOBQ_STORE": store, "JOBQ_REGISTRY_HEARTBEAT_S": "0.5"})
    procs.start("scanner", "scanner", "--metrics-port", str(port))
    procs.start("reaper", "reaper")

    def metrics() -> str:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return ""

    try:
        # Both daemons register on their own first heartbeat, and the gauges come from an overview
        # cached for up to 5 s: one taken between the two registrations shows only the first.
        expected = ('jobq_daemons_alive{role="reaper"} 1', 'jobq_daemons_alive{role="scanner"} 1')

        def both_alive() -> bool:
            text = metrics()
            return all(line in text for line in expected)

        wait_until(both_alive, 30, "both daemons in the scanner's gauges")
        assert 'jobq_queue_backlog{queue="critical"} 0' in metrics()
        procs.kill9("reaper")  # no deregistration: its entry expires after three heartbeats
        wait_until(lambda: 'jobq_daemons_alive{role="reaper"} 0' in metrics(), 30, "the killed reaper to drop out")
    finally:
        procs.stop_all()
