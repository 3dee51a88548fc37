"""Where tasks execute. A pool runs attempts and reports each outcome; it never talks to the store
or the broker (the worker does), so a new pool is one module implementing `Pool`.

    prefork   child processes; the parent alone talks to the store and the broker (the default of
              `jobq worker`); hard limits kill the child, soft limits signal it
    threads   threads in the worker process; a thread cannot be killed (its slot is lost)
    gevent    greenlets on gevent's hub, for thousands of I/O-bound tasks (extra `jobq[gevent]`)
    asyncio   `async def` tasks on one event loop; plain functions run in a thread
    solo      inline, one at a time
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome
from jobq.errors import ConfigError, SoftTimeLimitExceeded
from jobq.tasks import TaskRegistry

if TYPE_CHECKING:
    from jobq.settings import Settings

Done = Callable[[AttemptKey, Outcome], None]

POOLS = ("prefork", "threads", "gevent", "asyncio", "solo")


class Pool(Protocol):
    """Runs attempts, at most `size` at once (the worker never submits more than its free slots)."""

    name: str

    def start(self, size: int) -> None:
        """Get ready to run `size` attempts at once. Called again with another size to grow or
        shrink (autoscaling): capacity beyond the new size retires once it is idle."""
        ...

    def submit(self, attempt: Attempt, done: Done) -> None:
        """Run `attempt.task` with `attempt.payload` and `attempt.ctx`; call `done(attempt.key, outcome)`
        exactly once when it returns or raises (from any thread). Never raises."""
        ...

    def interrupt(self, attempt: Attempt) -> bool:
        """The soft time limit passed: raise `SoftTimeLimitExceeded` inside the running task so it
        can clean up. False when the attempt is not running here or the pool cannot interrupt it."""
        ...

    def stop(self, attempt: Attempt) -> bool:
        """Stop an execution the worker gave up on (its hard time limit passed). True when the
        execution is gone and its slot is free again; False when the pool cannot stop it (a
        thread): it runs on, its slot is lost until it returns, and `done` is still called then."""
        ...

    def close(self, wait_s: float) -> None:
        """Stop taking work; wait up to `wait_s` for running attempts to return."""
        ...


@dataclass(frozen=True)
class PoolOptions:
    """What some pools need besides a size: prefork children look tasks up by name in `registry`
    (inherited when they fork) and are recycled after `max_tasks_per_child` tasks or once their
    resident memory passes `max_memory_per_child_kib`."""

    registry: TaskRegistry | None = None
    max_tasks_per_child: int | None = None
    max_memory_per_child_kib: int | None = None
    child_init: Callable[[], None] | None = None  # run in each prefork child before its first task


def pool_for(settings: Settings, registry: TaskRegistry) -> Pool:
    """The pool `settings` ask for (threads when they name none), serving `registry`. A prefork
    pool forks its zygote here: build it before the process starts threads or opens connections."""
    from jobq import tracing

    options = PoolOptions(
        registry=registry,
        max_tasks_per_child=settings.max_tasks_per_child,
        max_memory_per_child_kib=settings.max_memory_per_child_kib,
        # The zygote forks before tracing starts its exporter thread: each child sets it up itself.
        child_init=functools.partial(tracing.configure, settings.tracing, "jobq-worker"),
    )
    return make_pool(settings.pool or "threads", options)


def make_pool(name: str, options: PoolOptions | None = None) -> Pool:
    """The pool called `name` (one of `POOLS`). Raises `ConfigError` for another name and
    `MissingExtra` for gevent without its extra."""
    options = options or PoolOptions()
    if name == "threads":
        from jobq.daemons.worker.pools.threads import ThreadPool

        return ThreadPool()
    if name == "solo":
        from jobq.daemons.worker.pools.solo import SoloPool

        return SoloPool()
    if name == "prefork":
        from jobq.daemons.worker.pools.prefork import PreforkPool

        return PreforkPool(options)
    if name == "gevent":
        from jobq.daemons.worker.pools.gevent import GeventPool

        return GeventPool()
    if name == "asyncio":
        from jobq.daemons.worker.pools.asyncio import AsyncioPool

        return AsyncioPool()
    raise ConfigError("pool", name, f"unknown pool; use {', '.join(POOLS)}")


def raise_in_thread(thread_id: int, exc_type: type[BaseException] = SoftTimeLimitExceeded) -> bool:
    """Schedule `exc_type` to be raised in the thread `thread_id` at its next bytecode (CPython's
    asynchronous exception). It does not wake a thread blocked in a system call (a long
    `time.sleep`, a socket read): the exception arrives when that call returns."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))
    if done > 1:  # more than one thread state touched: undo, as the C API asks
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
        return False
    return bool(done == 1)
