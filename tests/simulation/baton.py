"""Actors that take turns: each runs its operations in a thread of its own, but only while it
holds the baton, and hands the baton back at every port call.

So the daemons' real code (`Beat.run_once`, `Worker.complete_once`, `Client.cancel`, ...)
interleaves at the granularity of store, index and broker calls, under the control of one
seeded scheduler, and a run is exactly repeatable: at any moment only one thread moves.

A crashed actor's thread wakes at its next call and unwinds with `Crashed`, a BaseException,
so `except Exception` handlers in the code under test do not run, as after a `kill -9`; every
call it tries while unwinding raises `Crashed` too, so nothing it does afterwards reaches a port.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()


class Crashed(BaseException):
    """The actor was killed; its thread unwinds without touching any port."""


def current() -> Actor | None:
    """The actor whose thread is running, or None on the scheduler's thread."""
    return getattr(_local, "actor", None)


def acting() -> str:
    """Who the scheduler's own thread is running an operation for (`as_actor`), else "setup"."""
    return getattr(_local, "acting", "setup")


def as_actor(name: str, op: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """Run `op` to its end on the scheduler's thread, its port calls attributed to `name`: no
    turns and no faults (for when nothing else is to interleave, as when the world settles)."""
    _local.acting = name
    try:
        return op(), None
    except Exception as exc:
        return None, exc
    finally:
        _local.acting = "setup"


class Actor:
    def __init__(self, name: str) -> None:
        self.name = name
        self.busy = False  # in the middle of an operation
        self.crashed = False
        self.label = ""  # what the current operation is, for traces
        self.result: Any = None
        self.error: BaseException | None = None
        self.calls = 0  # port calls made by the current operation
        self.subject: str | None = None  # what the current operation is about (a client's job)
        self.next_call = ""  # the port call it waits to make ("store.transition"), while it waits
        self._op: Callable[[], Any] | None = None
        self._go = threading.Semaphore(0)
        self._back = threading.Semaphore(0)
        self._thread: threading.Thread | None = None

    def begin(self, label: str, op: Callable[[], Any]) -> None:
        """Start `op` in the actor's thread; it runs when `step` hands it the baton."""
        assert not self.busy, f"{self.name} is busy with {self.label}"
        assert not self.crashed, f"{self.name} crashed"
        self.busy = True
        self.label = label
        self.result = None
        self.error = None
        self.calls = 0
        self._op = op
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=f"sim-{self.name}", daemon=True)
            self._thread.start()

    def step(self) -> bool:
        """Let the actor run until its next port call or the end of its operation; True when the
        operation ended (see `result` and `error`)."""
        assert self.busy
        self._go.release()
        self._back.acquire()
        return not self.busy

    def finish(self, max_steps: int = 100_000) -> None:
        """Run the current operation to its end."""
        for _ in range(max_steps):
            if not self.busy or self.step():
                return
        raise RuntimeError(f"{self.name}: {self.label} did not end")

    def step_until(self, call: str, max_steps: int = 1000) -> None:
        """Run until the actor waits to make `call` (e.g. "store.transition"); fails if it ends first."""
        for _ in range(max_steps):
            if self.step():
                raise AssertionError(f"{self.name}: {self.label} ended before calling {call}")
            if self.next_call == call:
                return
        raise AssertionError(f"{self.name} never called {call}")

    def crash(self) -> None:
        """Kill the actor: its current operation unwinds with `Crashed` at its next call, and its
        thread ends."""
        self.crashed = True
        if self.busy:
            self.finish()
        elif self._thread is not None:
            self._go.release()  # wake the idle thread so that it ends
        self._thread = None

    def checkpoint(self, call: str = "") -> None:
        """Called by the ports in the actor's thread before every call: hand the baton back."""
        if self.crashed:
            raise Crashed(self.name)
        self.calls += 1
        self.next_call = call
        self._back.release()
        self._go.acquire()
        if self.crashed:
            raise Crashed(self.name)

    def _main(self) -> None:
        _local.actor = self
        while True:
            self._go.acquire()
            if self.crashed and not self.busy:
                return
            op = self._op
            try:
                if self.crashed:
                    raise Crashed(self.name)
                assert op is not None
                self.result = op()
            except BaseException as exc:  # the scheduler reads it: a crash, or a failure of the operation
                self.error = exc
            finally:
                self.busy = False
                self._back.release()
            if self.crashed:
                return
