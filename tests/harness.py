"""An in-process deployment driven by a manual clock: every daemon's `run_once`, step by step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlite_template import fresh_sqlite

from jobq.app import App
from jobq.clock import ManualClock
from jobq.daemons.beat import Beat
from jobq.daemons.reaper import Reaper
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.deployment import Deployment
from jobq.settings import Settings
from jobq.wiring import connect


def make_deployment(kind: str, tmp_path: Path, clock: ManualClock, **settings: Any) -> Deployment:
    url = "memory://" if kind == "memory" else f"sqlite:///{fresh_sqlite(tmp_path / 'jobq.db')}"
    return connect(Settings.load({"store": url, "history_flush_s": 0, **settings}, env={}), clock)


class Harness:
    def __init__(self, kind: str, tmp_path: Path, clock: ManualClock, **settings: Any) -> None:
        self.clock = clock
        self.d = make_deployment(kind, tmp_path, clock, **settings)
        self.app = App(clock=clock)
        self.app.use(self.d)
        self.client = self.app.client
        self.beat = Beat(self.d)
        self.scanner = Scanner(self.d, scanner_id="scanner-test")
        self.reaper = Reaper(self.d)
        self._workers: list[Worker] = []

    def worker(self, **kw: Any) -> Worker:
        w = Worker(self.d, self.app.registry, **kw)
        self._workers.append(w)
        return w

    def advance(self, s: float) -> int:
        return self.clock.advance(s=s)

    def dispatch(self) -> int:
        """One beat pass and scanner passes until nothing more is due."""
        now = self.clock.now_ms()
        self.beat.run_once(now)
        total = 0
        while (n := self.scanner.run_once(now)) > 0:
            total += n
        return total

    def work(self, worker: Worker | None = None, *, rounds: int = 50) -> int:
        """Let a worker take and finish everything visible on its queues."""
        w = worker or (self._workers[0] if self._workers else self.worker())
        done = 0
        for _ in range(rounds):
            n = w.run_once(self.clock.now_ms())
            assert w.wait_idle(10)
            if n == 0:
                break
            done += n
        return done

    def cycle(self, s: float = 0.0) -> int:
        """Advance the clock, then beat, scan and work until quiet."""
        if s:
            self.advance(s)
        self.dispatch()
        return self.work()

    def close(self) -> None:
        for w in self._workers:
            w.shutdown()
        self.d.close()
