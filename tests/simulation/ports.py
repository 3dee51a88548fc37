"""The ports as actors see them: every call hands the baton back first (so calls interleave), may
fail as a fault armed for the calling actor (before it applies, or after: the unknown outcome),
and reports what it changed to the world's observer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from faults import FAULTABLE

from jobq.errors import StoreUnavailable, TransportUnavailable
from simulation import baton

Mode = Literal["before", "after"]
Observe = Callable[[str, str, tuple[Any, ...], Any], None]  # (actor, method, args, result)


class Faults:
    """One-shot faults armed per actor and method: the actor's next such call fails."""

    def __init__(self, listener: Callable[[str, str, str], None] | None = None) -> None:
        self.armed: dict[tuple[str, str, str], Mode] = {}  # (actor, port, method) -> mode
        self.fired: list[tuple[str, str, str, Mode]] = []
        self.listener = listener  # told of every fault that fires: (actor, port, method)

    def arm(self, actor: str, port: str, method: str, mode: Mode) -> None:
        self.armed[(actor, port, method)] = mode

    def take(self, actor: str, port: str, method: str) -> Mode | None:
        mode = self.armed.pop((actor, port, method), None)
        if mode is not None:
            self.fired.append((actor, port, method, mode))
            if self.listener is not None:
                self.listener(actor, port, method)
        return mode


class SimPort:
    def __init__(self, inner: Any, port: str, faults: Faults, observe: Observe) -> None:
        self._inner = inner
        self._port = port
        self._faults = faults
        self._observe = observe

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in FAULTABLE.get(self._port, frozenset()) or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            actor = baton.current()
            if actor is None:  # the scheduler's own thread (set-up, settling): no faults, no turns
                result = attr(*args, **kwargs)
                self._observe(baton.acting(), name, args, result)
                return result
            actor.checkpoint(f"{self._port}.{name}")
            mode = self._faults.take(actor.name, self._port, name)
            if mode == "before":
                raise _error(self._port, name, mode)
            result = attr(*args, **kwargs)
            self._observe(actor.name, name, args, result)
            if mode == "after":
                raise _error(self._port, name, mode)
            return result

        return call


def _error(port: str, method: str, mode: Mode) -> Exception:
    text = f"simulated fault: {port}.{method} {'failed' if mode == 'before' else 'applied, then failed'}"
    return TransportUnavailable(text) if port == "transport" else StoreUnavailable(text)
