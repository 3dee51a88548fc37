"""The threads pool: `size` threads take attempts from one queue.

Python cannot kill a thread: an attempt past its hard time limit is fenced off by the worker
and its thread is left to return on its own; until then its slot is counted as lost
(`jobq_worker_slots{state="lost"}`), and the worker reports unhealthy once every slot is lost.
"""

from __future__ import annotations

import queue
import threading
import time

from jobq.daemons.worker.attempt import Attempt, Outcome
from jobq.daemons.worker.execution import execute
from jobq.daemons.worker.pools import Done

_STOP = None


class ThreadPool:
    name = "threads"

    def __init__(self) -> None:
        self._work: queue.Queue[tuple[Attempt, Done] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, size: int) -> None:
        with self._lock:
            while len(self._threads) < size:
                thread = threading.Thread(target=self._loop, name=f"jobq-task-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def submit(self, attempt: Attempt, done: Done) -> None:
        self._work.put((attempt, done))

    def stop(self, attempt: Attempt) -> bool:
        return False

    def close(self, wait_s: float) -> None:
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._work.put(_STOP)
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        while (item := self._work.get()) is not _STOP:
            attempt, done = item
            try:
                outcome = execute(attempt.task, attempt.ctx, attempt.payload)
            except BaseException as exc:  # SystemExit and the like from task code end the attempt, not the thread
                outcome = Outcome(exc=exc, error=f"{type(exc).__name__}: {exc}", retryable=False)
            done(attempt.key, outcome)
