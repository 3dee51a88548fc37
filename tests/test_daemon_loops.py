"""Daemon loops never die of a transient error, turn unhealthy when they keep failing, and a loop
that ends unexpectedly makes the process exit non-zero (design §14.6)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobq.clock import SYSTEM_CLOCK
from jobq.daemons.base import Daemon
from jobq.daemons.scanner import Scanner
from jobq.deployment import Deployment
from jobq.errors import StoreUnavailable
from jobq.settings import Settings
from jobq.wiring import connect


class _FlakyIndex:
    """The deployment's index, whose `next_due_ms` raises the first `failures` times."""

    def __init__(self, inner: Any, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0

    def next_due_ms(self) -> int | None:
        self.calls += 1
        if self.calls <= self.failures:
            raise StoreUnavailable("the index stalled")
        return self.inner.next_due_ms()  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def d(tmp_path: Path) -> Iterator[Deployment]:
    deployment = connect(
        Settings.load({"store": "memory://", "history_flush_s": 0, "scan_interval_s": 0.01}, env={}), SYSTEM_CLOCK
    )
    yield deployment
    deployment.close()


def _run_for(daemon: Daemon, seconds: float) -> threading.Thread:
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run_forever, args=(stop,), daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(5)
    return thread


def test_the_scanner_loop_survives_an_index_that_fails_while_it_waits(d: Deployment) -> None:
    scanner = Scanner(d)
    flaky = _FlakyIndex(scanner.index, failures=1)
    scanner.index = flaky  # type: ignore[assignment]
    _run_for(scanner, 1.0)
    assert flaky.calls > 2, "the loop went on asking for the next due time after the failure"
    assert scanner.passes > 2


def test_a_loop_that_keeps_failing_turns_unhealthy_and_recovers(d: Deployment) -> None:
    scanner = Scanner(d)
    flaky = _FlakyIndex(scanner.index, failures=10**9)
    scanner.index = flaky  # type: ignore[assignment]
    stop = threading.Event()
    thread = threading.Thread(target=scanner.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.6)
        assert scanner.failing_since is not None
        assert scanner.healthy(max_silence_s=60)  # failing, but not for long yet
        assert not scanner.healthy(max_silence_s=0.1)
        flaky.failures = 0
        deadline = time.monotonic() + 10
        while scanner.failing_since is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scanner.healthy(max_silence_s=0.1)
    finally:
        stop.set()
        thread.join(10)


class _Ends(Daemon):
    """A daemon whose loop returns at once, as if by a bug."""

    name = "broken"

    def run_forever(self, stop: threading.Event) -> None:
        return


class _Waits(Daemon):
    name = "patient"

    def run_forever(self, stop: threading.Event) -> None:
        stop.wait(30)


def test_a_loop_that_ends_unexpectedly_stops_the_process_with_a_non_zero_status(d: Deployment) -> None:
    from jobq.cli.daemons import run_until_stopped

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        with pytest.raises(SystemExit) as exited:
            run_until_stopped(d, [_Ends(d), _Waits(d)])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert exited.value.code == 1
    assert time.monotonic() - started < 10, "the other loops were stopped, not waited out"
