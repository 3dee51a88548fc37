"""The asyncio pool: `async def` tasks run on one event loop (a thread of the worker), with the
worker's concurrency as the limit; a plain function registered with the same `@app.task` runs in a
thread, so it cannot block the loop.

Time limits: the soft limit raises `SoftTimeLimitExceeded` in the coroutine at the `await` it is
suspended in (the task is woken by cancellation, and the pool throws the soft-limit exception in
place of the `CancelledError`), so it can clean up and even carry on; in a sync task's thread it
is an asynchronous exception, as on the threads pool. The hard limit cancels the coroutine and
its slot comes back once it has unwound; a coroutine that blocks the loop (computes or calls a
blocking function without awaiting) cannot be cancelled, and neither can a sync task's thread:
those slots are counted lost until the call returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Coroutine, Generator
from typing import Any

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome
from jobq.daemons.worker.execution import execute, execute_async, failed
from jobq.daemons.worker.pools import Done, raise_in_thread
from jobq.errors import SoftTimeLimitExceeded

STOP_WAIT_S = 1.0  # how long `stop` waits for a cancelled coroutine to unwind before counting its slot lost
_SYNC_THREADS_MAX = 10_000  # threads are started only as sync tasks need them; free slots bound them


class _Interruptible:
    """Awaits a coroutine and lets the pool throw `SoftTimeLimitExceeded` into it at its current
    `await`: the pool sets `pending` and cancels the task to wake it; the cancellation reaching
    this frame is swapped for the pending exception (and the task's cancel request withdrawn)."""

    def __init__(self, coro: Coroutine[Any, Any, Outcome]) -> None:
        self.coro = coro
        self.pending: BaseException | None = None

    def __await__(self) -> Generator[Any, Any, Outcome]:
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                yielded = self.coro.send(send) if throw is None else self.coro.throw(throw)
            except StopIteration as stop:
                outcome: Outcome = stop.value
                return outcome
            send, throw = None, None
            try:
                send = yield yielded
            except asyncio.CancelledError as exc:
                if self.pending is not None:
                    throw, self.pending = self.pending, None
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()
                else:
                    throw = exc
            except BaseException as exc:
                throw = exc


class AsyncioPool:
    name = "asyncio"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(_SYNC_THREADS_MAX, thread_name_prefix="jobq-sync")
        self._lock = threading.Lock()
        # attempt -> (its asyncio task, its interruptible wrapper, the thread of a sync task, ended)
        self._tasks: dict[AttemptKey, tuple[asyncio.Task[None], _Interruptible | None, threading.Event]] = {}
        self._threads: dict[AttemptKey, int] = {}
        self.size = 0

    def start(self, size: int) -> None:
        self.size = size  # one coroutine per attempt: the worker's free slots bound them
        with self._lock:
            if self._thread is not None:
                return
            ready = threading.Event()
            self._thread = threading.Thread(target=self._run_loop, args=(ready,), name="jobq-asyncio", daemon=True)
            self._thread.start()
        ready.wait(10)

    def submit(self, attempt: Attempt, done: Done) -> None:
        assert self._loop is not None, "start the pool first"
        self._loop.call_soon_threadsafe(self._spawn, attempt, done)

    def interrupt(self, attempt: Attempt) -> bool:
        with self._lock:
            entry = self._tasks.get(attempt.key)
            ident = self._threads.get(attempt.key)
        if ident is not None:
            return raise_in_thread(ident)
        if entry is None or entry[1] is None or self._loop is None:
            return False
        task, wrapper, _ = entry
        assert wrapper is not None

        def wake() -> None:
            wrapper.pending = SoftTimeLimitExceeded("the soft time limit passed")
            task.cancel()

        self._loop.call_soon_threadsafe(wake)
        return True

    def stop(self, attempt: Attempt) -> bool:
        with self._lock:
            entry = self._tasks.get(attempt.key)
            in_thread = attempt.key in self._threads
        if entry is None or in_thread or self._loop is None:
            return False
        task, _, ended = entry
        self._loop.call_soon_threadsafe(task.cancel)
        return ended.wait(STOP_WAIT_S)

    def close(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._tasks:
                    break
            time.sleep(0.02)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with self._lock:
                left = [task for task, _, _ in self._tasks.values()]
            for task in left:
                loop.call_soon_threadsafe(task.cancel)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(2)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- on the loop ----------------------------------------------------------------------------

    def _run_loop(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _spawn(self, attempt: Attempt, done: Done) -> None:
        ended = threading.Event()
        is_async = asyncio.iscoroutinefunction(attempt.task.fn)
        wrapper = _Interruptible(execute_async(attempt.task, attempt.ctx, attempt.payload)) if is_async else None
        task = asyncio.get_running_loop().create_task(self._run(attempt, done, wrapper, ended))
        with self._lock:
            self._tasks[attempt.key] = (task, wrapper, ended)

    async def _run(self, attempt: Attempt, done: Done, wrapper: _Interruptible | None, ended: threading.Event) -> None:
        outcome: Outcome | None = None
        try:
            if wrapper is not None:
                outcome = await wrapper
            else:
                loop = asyncio.get_running_loop()
                outcome = await loop.run_in_executor(self._executor, self._in_thread, attempt)
        except asyncio.CancelledError:
            outcome = None  # the hard limit (or shutdown): the worker has written the attempt off
        except BaseException as exc:  # SystemExit and the like end the attempt, not the loop
            outcome = Outcome(exc=exc, error=f"{type(exc).__name__}: {exc}", retryable=False)
        finally:
            with self._lock:
                self._tasks.pop(attempt.key, None)
            ended.set()
        if outcome is not None:
            done(attempt.key, outcome)

    def _in_thread(self, attempt: Attempt) -> Outcome:
        with self._lock:
            self._threads[attempt.key] = threading.get_ident()
        outcome: Outcome | None = None
        try:
            try:
                outcome = execute(attempt.task, attempt.ctx, attempt.payload)
            finally:
                with self._lock:
                    self._threads.pop(attempt.key, None)
        except SoftTimeLimitExceeded as exc:  # landed just after the task returned
            if outcome is None:
                outcome = failed(exc)
        return outcome
