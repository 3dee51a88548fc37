"""Where tasks execute. A pool runs attempts and reports each outcome; it never talks to the store
or the broker (the worker does), so a new pool is one module implementing `Pool`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome

Done = Callable[[AttemptKey, Outcome], None]


class Pool(Protocol):
    """Runs attempts, at most `size` at once (the worker never submits more than its free slots)."""

    name: str

    def start(self, size: int) -> None:
        """Get ready to run `size` attempts at once (idempotent)."""
        ...

    def submit(self, attempt: Attempt, done: Done) -> None:
        """Run `attempt.task` with `attempt.payload` and `attempt.ctx`; call `done(attempt.key, outcome)`
        exactly once when it returns or raises (from any thread). Never raises."""
        ...

    def stop(self, attempt: Attempt) -> bool:
        """Stop an execution the worker gave up on (its hard time limit passed). True when the
        execution is gone and its slot is free again; False when the pool cannot stop it (a
        thread): it runs on, its slot is lost until it returns, and `done` is still called then."""
        ...

    def close(self, wait_s: float) -> None:
        """Stop taking work; wait up to `wait_s` for running attempts to return."""
        ...


def make_pool(name: str) -> Pool:
    """The pool called `name` (`threads` or `solo`)."""
    if name == "threads":
        from jobq.daemons.worker.pools.threads import ThreadPool

        return ThreadPool()
    if name == "solo":
        from jobq.daemons.worker.pools.solo import SoloPool

        return SoloPool()
    raise ValueError(f"unknown pool {name!r}; use threads or solo")
