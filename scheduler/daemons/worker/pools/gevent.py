"""The gevent pool: each attempt is a greenlet, so `-c 1000` runs a thousand I/O-bound tasks at once
in one process (extra `jobq[gevent]`).

Greenlets only overlap where they wait cooperatively: `jobq worker -P gevent` monkey-patches the
standard library (`gevent.monkey.patch_all()`) before anything imports a socket, so `time.sleep`,
sockets, redis-py and boto3 yield to the hub; the worker's own loops (consumer, completer, lease
monitor, broker lane) then run as greenlets on the same hub. Used from Python without patching
(`Worker(pool="gevent")`), the pool runs its own hub on a thread of its own and the worker's loops
stay real threads off the hub; tasks must then wait with gevent's calls (`gevent.sleep`).

Time limits: the soft limit raises `SoftTimeLimitExceeded` in the greenlet (`Greenlet.kill` with
that exception); the hard limit kills the greenlet (`GreenletExit`) and its slot comes back. Both
land when the greenlet next yields: a greenlet that computes without yielding cannot be stopped,
and its slot is counted lost, as on the threads pool.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome
from jobq.daemons.worker.execution import execute
from jobq.daemons.worker.pools import Done
from jobq.errors import SoftTimeLimitExceeded
from jobq.extras import require

STOP_WAIT_S = 1.0  # how long `stop` waits for a killed greenlet to end before counting its slot lost


class GeventPool:
    name = "gevent"

    def __init__(self) -> None:
        self._gevent: Any = require("gevent", "gevent", "the gevent pool (-P gevent)")
        self._hub: Any = None
        self._closing: Any = None  # a gevent Event, set on the hub to end the hub thread
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._running: dict[AttemptKey, tuple[Any, threading.Event]] = {}  # greenlet, ended
        self.size = 0

    @staticmethod
    def patched() -> bool:
        """Whether the process was monkey-patched (then the worker's threads are greenlets)."""
        from gevent import monkey

        return bool(monkey.is_module_patched("socket"))

    def start(self, size: int) -> None:
        self.size = size  # greenlets are spawned per attempt: the worker's free slots bound them
        with self._lock:
            if self._thread is not None:
                return
            ready = threading.Event()
            self._thread = threading.Thread(target=self._hub_loop, args=(ready,), name="jobq-gevent-hub", daemon=True)
            self._thread.start()
        ready.wait(10)

    def submit(self, attempt: Attempt, done: Done) -> None:
        ended = threading.Event()
        self._hub.loop.run_callback_threadsafe(self._spawn, attempt, done, ended)

    def interrupt(self, attempt: Attempt) -> bool:
        with self._lock:
            entry = self._running.get(attempt.key)
        if entry is None:
            return False
        greenlet, _ = entry
        self._hub.loop.run_callback_threadsafe(_kill, greenlet, SoftTimeLimitExceeded("the soft time limit passed"))
        return True

    def stop(self, attempt: Attempt) -> bool:
        with self._lock:
            entry = self._running.get(attempt.key)
        if entry is None:
            return False
        greenlet, ended = entry
        self._hub.loop.run_callback_threadsafe(_kill, greenlet, None)
        return ended.wait(STOP_WAIT_S)

    def close(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running:
                    break
            time.sleep(0.02)
        with self._lock:
            left = [g for g, _ in self._running.values()]
        hub = self._hub
        if hub is None:
            return
        for greenlet in left:
            hub.loop.run_callback_threadsafe(_kill, greenlet, None)
        if self._closing is not None:
            hub.loop.run_callback_threadsafe(self._closing.set)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2)

    # -- on the hub -----------------------------------------------------------------------------

    def _hub_loop(self, ready: threading.Event) -> None:
        from gevent.event import Event

        self._hub = self._gevent.get_hub()
        self._closing = Event()
        ready.set()
        # A wait with a timeout keeps a timer on the loop; without one the hub would see nothing to
        # wait for (work arrives from other threads) and end the loop.
        while not self._closing.wait(1.0):
            pass

    def _spawn(self, attempt: Attempt, done: Done, ended: threading.Event) -> None:
        greenlet = self._gevent.spawn(self._run, attempt, done, ended)
        with self._lock:
            self._running[attempt.key] = (greenlet, ended)

    def _run(self, attempt: Attempt, done: Done, ended: threading.Event) -> None:
        from gevent import GreenletExit

        outcome: Outcome | None = None
        try:
            outcome = execute(attempt.task, attempt.ctx, attempt.payload)
        except GreenletExit:
            outcome = None  # the hard limit: the worker has written the attempt off
        except BaseException as exc:  # SystemExit and the like end the attempt, not the hub
            outcome = Outcome(exc=exc, error=f"{type(exc).__name__}: {exc}", retryable=False)
        finally:
            with self._lock:
                self._running.pop(attempt.key, None)
            ended.set()
        if outcome is not None:
            done(attempt.key, outcome)


def _kill(greenlet: Any, exception: BaseException | None) -> None:
    """On the hub: raise `exception` (GreenletExit when None) in `greenlet` at its next switch."""
    if exception is None:
        greenlet.kill(block=False)
    else:
        greenlet.kill(exception, block=False)
