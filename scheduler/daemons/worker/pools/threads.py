"""The threads pool: `size` threads take attempts from one queue.

The queue is a `queue.SimpleQueue`: a put is one call into C that wakes one blocked `get`, where a
`queue.Queue` takes a mutex and runs `Condition.notify` in Python for every attempt handed over
(issue 14: the hand-off was the worker's hottest function in the profile). Nothing here needs
`Queue`'s extras (`join`, `task_done`, a bound: the worker never submits more than its free slots).

Python cannot kill a thread: an attempt past its hard time limit is fenced off by the worker
and its thread is left to return on its own; until then its slot is counted as lost
(`jobq_worker_slots{state="lost"}`), and the worker reports unhealthy once every slot is lost.
The soft limit raises `SoftTimeLimitExceeded` in the task's thread as an asynchronous exception:
it arrives at the next Python instruction, so a thread blocked in one long system call (a
`time.sleep(60)`, a socket read without a timeout) sees it only when that call returns.
"""

from __future__ import annotations

import queue
import threading
import time

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome
from jobq.daemons.worker.execution import execute
from jobq.daemons.worker.pools import Done, raise_in_thread

_STOP = None


class ThreadPool:
    name = "threads"

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Attempt, Done] | None] = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()
        self._stops = 0  # stop markers queued and not yet taken: threads about to end
        self._serial = 0
        self._lock = threading.Lock()
        self._running: dict[AttemptKey, int] = {}  # attempt -> the ident of the thread running it

    def start(self, size: int) -> None:
        with self._lock:
            active = len(self._threads) - self._stops
            # Threads over the size retire when they next take from the queue (a stop marker each).
            for _ in range(active - size):
                self._stops += 1
                self._work.put(_STOP)
            for _ in range(size - active):
                self._serial += 1
                thread = threading.Thread(target=self._loop, name=f"jobq-task-{self._serial}", daemon=True)
                self._threads.add(thread)
                thread.start()

    @property
    def size(self) -> int:
        with self._lock:
            return len(self._threads) - self._stops

    def submit(self, attempt: Attempt, done: Done) -> None:
        self._work.put((attempt, done))

    def interrupt(self, attempt: Attempt) -> bool:
        with self._lock:
            ident = self._running.get(attempt.key)
            return ident is not None and raise_in_thread(ident)

    def stop(self, attempt: Attempt) -> bool:
        return False

    def close(self, wait_s: float) -> None:
        with self._lock:
            threads = list(self._threads)
            self._stops += len(threads)
        for _ in threads:
            self._work.put(_STOP)
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while (item := self._work.get()) is not _STOP:
                attempt, done = item
                self._run(attempt, done)
        finally:
            with self._lock:
                if me in self._threads:
                    self._threads.discard(me)
                    self._stops = max(0, self._stops - 1)

    def _run(self, attempt: Attempt, done: Done) -> None:
        outcome: Outcome | None = None
        with self._lock:
            self._running[attempt.key] = threading.get_ident()
        try:
            try:
                outcome = execute(attempt.task, attempt.ctx, attempt.payload)
            finally:
                with self._lock:
                    self._running.pop(attempt.key, None)
        except BaseException as exc:  # SystemExit and the like from task code end the attempt, not the thread
            # A soft limit that lands just after the task returned leaves its outcome as it was.
            if outcome is None:
                outcome = Outcome(exc=exc, error=f"{type(exc).__name__}: {exc}", retryable=False)
        done(attempt.key, outcome)
