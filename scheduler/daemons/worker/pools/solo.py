"""The solo pool: each attempt runs inline, in the thread that submits it, one at a time.

For debugging (a breakpoint in a task just works) and the simplest deployments. The soft limit
raises `SoftTimeLimitExceeded` in that thread, as on the threads pool; the hard limit cannot
interrupt an inline call: the worker fences the attempt off when it passes.
"""

from __future__ import annotations

import threading

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome
from jobq.daemons.worker.execution import execute
from jobq.daemons.worker.pools import Done, raise_in_thread


class SoloPool:
    name = "solo"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: tuple[AttemptKey, int] | None = None

    def start(self, size: int) -> None:
        pass

    def submit(self, attempt: Attempt, done: Done) -> None:
        outcome: Outcome | None = None
        with self._lock:
            self._running = (attempt.key, threading.get_ident())
        try:
            try:
                outcome = execute(attempt.task, attempt.ctx, attempt.payload)
            finally:
                with self._lock:
                    self._running = None
        except BaseException as exc:  # SystemExit and the like from task code end the attempt, not the worker
            # (a soft limit that lands just after the task returned leaves its outcome as it was)
            if outcome is None:
                outcome = Outcome(exc=exc, error=f"{type(exc).__name__}: {exc}", retryable=False)
        done(attempt.key, outcome)

    def interrupt(self, attempt: Attempt) -> bool:
        with self._lock:
            running = self._running
            return running is not None and running[0] == attempt.key and raise_in_thread(running[1])

    def stop(self, attempt: Attempt) -> bool:
        return False

    def close(self, wait_s: float) -> None:
        pass
