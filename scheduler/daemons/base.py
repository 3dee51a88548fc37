"""The shape every daemon shares: a pass that reports its work, and a paced loop around it."""

from __future__ import annotations

import logging
import threading
import time

from jobq.deployment import Deployment
from jobq.ids import new_worker_id
from jobq.metrics import METRICS
from jobq.models import Run, RunEvent
from jobq.registry import ERROR_MAX_CHARS

# After a failing pass, wait 0.5 s, 1 s, 2 s, ... up to this: short outages of a broker or a store
# are the common case, and a daemon should be back within seconds of its dependency.
MAX_BACKOFF_S = 5.0


class Daemon:
    """Subclasses implement `run_once`. The loop is drift-corrected (a slow pass does not push
    every later tick back), runs again at once while a pass fills its batch, backs off
    exponentially after errors, and never dies of one: a failing pass is logged and counted."""

    name = "daemon"
    interval_s = 1.0

    def __init__(self, deployment: Deployment) -> None:
        self.d = deployment
        self.store = deployment.store
        self.clock = deployment.clock
        self.settings = deployment.settings
        self.log = logging.getLogger(f"jobq.{self.name}")
        self.total = 0
        self.passes = 0
        self.last_beat = time.monotonic()  # when the loop last came round; see `healthy`
        self.failing_since: float | None = None  # when the current run of failing passes began
        self.daemon_id = new_worker_id(self.name)  # its name in the daemon registry (and its leases)
        self.errors = 0  # passes that raised, for the registry
        self.last_error: str | None = None
        self.last_error_ms: int | None = None

    def run_once(self, now_ms: int) -> int:
        """Do one pass of work as of `now_ms`; return how many items it handled."""
        raise NotImplementedError

    def busy(self, done: int) -> bool:
        """Whether the last pass suggests more work is waiting right now (a full batch)."""
        return False

    def wait_s(self, default_s: float) -> float:
        """How long to sleep before the next pass when idle; the scanner sleeps until the next due run."""
        return default_s

    def on_stop(self) -> None:
        pass

    def report(self) -> dict[str, object]:
        """What the daemon registry shows of this daemon besides who it is (`DaemonRecord` fields):
        items handled, failed passes and the last error. The worker adds its slots and runs."""
        return {
            "done": self.total,
            "failures": self.errors,
            "last_error": self.last_error,
            "last_error_ms": self.last_error_ms,
        }

    def note_error(self, exc: BaseException) -> None:
        """Remember `exc` as the last error the registry shows."""
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS]
        self.last_error_ms = self.clock.now_ms()

    def healthy(self, max_silence_s: float = 60.0) -> bool:
        """Whether the loop is still coming round (a pass, or a wait between passes, ended within
        `max_silence_s`) and has not been failing for longer than `max_silence_s`: a loop stuck in a
        call that never returns, or retrying a dependency that stays down, turns this False."""
        now = time.monotonic()
        if self.failing_since is not None and now - self.failing_since > max(max_silence_s, 3 * self.interval_s):
            return False
        return now - self.last_beat <= max(max_silence_s, 3 * self.interval_s)

    def run_forever(self, stop: threading.Event) -> None:
        """Pass after pass until `stop`. Every call of a pass, the pacing included (the scanner asks
        its index when the next run is due), is under one retry with exponential backoff, so a
        transient error never ends the loop; a loop that does end otherwise is a bug, and the
        process exits non-zero (`jobq.cli.daemons.run_until_stopped`)."""
        self.log.info("%s started", self.name)
        next_tick = time.monotonic()
        failures = 0
        while not stop.is_set():
            self.last_beat = time.monotonic()
            try:
                done = self.run_once(self.clock.now_ms())
                busy = self.busy(done)
                sleep_s = 0.0
                if not busy:
                    next_tick += self.interval_s
                    now = time.monotonic()
                    next_tick = max(next_tick, now)  # fell behind: resume the cadence from here rather than bursting
                    sleep_s = max(0.0, min(next_tick - now, self.wait_s(self.interval_s)))
                    next_tick = min(next_tick, now + sleep_s)  # an early wake-up starts the next cadence
                else:
                    next_tick = time.monotonic()
            except Exception as exc:
                failures += 1
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                self.note_error(exc)
                METRICS.loop_errors.inc(daemon=self.name)
                self.log.exception("%s pass failed (%d in a row)", self.name, failures)
                stop.wait(min(MAX_BACKOFF_S, 0.25 * 2**failures))
                next_tick = time.monotonic()
                continue
            failures = 0
            self.failing_since = None
            self.total += done
            self.passes += 1
            if sleep_s > 0:
                stop.wait(sleep_s)
        self.on_stop()
        self.log.info("%s stopped after %d passes, %d items", self.name, self.passes, self.total)


def event(run: Run, kind: str, now_ms: int, **more: object) -> RunEvent:
    """A history line for `run` as it is now (built without re-validating what a run already holds)."""
    return RunEvent.trusted(
        {
            "run_id": run.run_id,
            "job_id": run.job_id,
            "tenant_id": run.tenant_id,
            "attempt": run.attempt,
            "fence": run.fence,
            "kind": kind,
            "at_ms": now_ms,
            "worker": None,
            "error": run.last_error,
            "duration_ms": None,
            **more,
        }
    )
