"""The registrar: every daemon shows up in the registry with its counters and running attempts;
a lone worker warns that delayed and cron jobs will not run; a failing registry never stops or
sickens a daemon."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.daemons.registrar import Registrar
from jobq.errors import StoreUnavailable
from jobq.registry import Role


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock)
    yield harness
    harness.close()


def test_a_worker_entry_shows_its_slots_and_what_it_runs_now(h: Harness) -> None:
    release = threading.Event()

    @h.app.task(name="t.wait")
    def wait() -> None:
        assert release.wait(10)

    worker = h.worker(concurrency=3, queues=["default"])
    job = wait.delay()
    h.dispatch()
    assert worker.run_once(h.clock.now_ms()) == 1
    registrar = Registrar(h.d, [worker, h.scanner])
    try:
        assert registrar.run_once(h.clock.now_ms()) == 2
        entries = {r.role: r for r in h.d.registry.live_daemons(h.clock.now_ms())}
        entry = entries[Role.WORKER]
        assert (entry.daemon_id, entry.queues, entry.pool, entry.concurrency) == (
            worker.worker_id,
            ("default",),
            "threads",
            3,
        )
        assert (entry.busy, entry.free, entry.lost) == (1, 2, 0)
        (running,) = entry.running
        run = h.client.get(job.job_id).current_run
        assert run is not None
        assert (running.run_id, running.task, running.attempt) == (run.run_id, "t.wait", 1)
        assert entries[Role.SCANNER].daemon_id == "scanner-test"
    finally:
        release.set()
    assert worker.wait_idle(10)
    registrar.run_once(h.clock.now_ms())
    (entry,) = [r for r in h.d.registry.live_daemons(h.clock.now_ms()) if r.role is Role.WORKER]
    assert (entry.done, entry.busy, entry.running) == (1, 0, ())


def test_a_failed_attempt_is_counted_with_its_error(h: Harness) -> None:
    @h.app.task(name="t.boom", retry={"max_retries": 0})
    def boom() -> None:
        raise ValueError("no [such] thing")

    worker = h.worker()
    boom.delay()
    h.cycle()
    registrar = Registrar(h.d, [worker])
    registrar.run_once(h.clock.now_ms())
    (entry,) = h.d.registry.live_daemons(h.clock.now_ms())
    assert entry.failures == 1 and entry.last_error is not None and "no [such] thing" in entry.last_error


def test_a_lone_worker_warns_after_30_s_naming_the_missing_roles(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    registrar = Registrar(h.d, [h.worker()])
    caplog.set_level(logging.INFO, logger="jobq")
    registrar.run_once(h.clock.now_ms())
    h.advance(29)
    registrar.run_once(h.clock.now_ms())
    assert "will not run" not in caplog.text
    h.advance(2)
    registrar.run_once(h.clock.now_ms())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "no live scanner, beat, reaper: delayed and cron jobs will not run "
        "(start `jobq scanner` `jobq beat` `jobq reaper`, or `jobq dev`)"
    ]
    h.advance(30)
    registrar.run_once(h.clock.now_ms())
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1, "warned once per absence"


def test_a_worker_beside_live_scheduling_roles_does_not_warn(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    others = Registrar(h.d, [h.scanner, h.beat, h.reaper])
    registrar = Registrar(h.d, [h.worker()])
    for _ in range(4):
        others.run_once(h.clock.now_ms())
        registrar.run_once(h.clock.now_ms())
        h.advance(10)
    assert "will not run" not in caplog.text
    assert registrar.missing == ()


def test_the_warning_names_only_the_missing_role(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    others = Registrar(h.d, [h.scanner, h.beat])
    registrar = Registrar(h.d, [h.worker()])
    for _ in range(4):
        others.run_once(h.clock.now_ms())
        registrar.run_once(h.clock.now_ms())
        h.advance(10)
    assert "no live reaper: delayed and cron jobs will not run" in caplog.text


class _BrokenRegistry:
    """The deployment's store, whose registry calls raise."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def heartbeat(self, records: Any, ttl_ms: int) -> None:
        self.calls += 1
        raise StoreUnavailable("the store is down")

    def live_daemons(self, now_ms: int) -> Any:
        raise StoreUnavailable("the store is down")

    def deregister(self, daemon_ids: Any) -> None:
        raise StoreUnavailable("the store is down")

    def census(self, now_ms: int) -> Any:
        raise StoreUnavailable("the store is down")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_failing_registry_never_raises_nor_turns_health_red(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    broken = _BrokenRegistry(h.d.store)
    h.d.store = broken  # type: ignore[assignment]
    registrar = Registrar(h.d, [h.scanner])
    assert registrar.run_once(h.clock.now_ms()) == 0
    assert registrar.run_once(h.clock.now_ms()) == 0
    assert broken.calls == 2 and registrar.healthy()
    assert registrar.last_error == "StoreUnavailable: the store is down"
    assert caplog.text.count("daemon registry heartbeat failed") == 1, "logged once per outage"
    registrar.on_stop()  # deregistering fails quietly too
    h.d.store = broken.inner


def test_a_registrar_loop_deregisters_its_daemons_when_stopped(h: Harness) -> None:
    registrar = Registrar(h.d, [h.scanner, h.reaper], interval_s=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=registrar.run_forever, args=(stop,))
    thread.start()
    try:
        deadline = 100
        while not h.d.registry.live_daemons(h.clock.now_ms()) and deadline:
            stop.wait(0.05)
            deadline -= 1
        assert {r.role for r in h.d.registry.live_daemons(h.clock.now_ms())} == {Role.SCANNER, Role.REAPER}
    finally:
        stop.set()
        thread.join(10)
    assert h.d.registry.live_daemons(h.clock.now_ms()) == []
