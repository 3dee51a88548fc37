"""Fault injection around real ports: a call that raises before it applies, one that applies and
then raises (the unknown outcome), and a stalled call (the caller waits past a lease).

    plan = FaultPlan()
    store = Faulty(deployment.store, "store", plan)
    plan.script("store", "transition", "after", when=lambda ts: any(t.to_state is SUCCEEDED for t in ts))

Scripted faults fire in order when their method (and `when(*args)`) match; the simulation adds
random ones from its seeded generator through `chance`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from jobq.errors import StoreUnavailable, TransportUnavailable

Mode = Literal["before", "after"]

#: The calls a fault may hit, per port: every one that reaches the backend's server.
FAULTABLE: dict[str, frozenset[str]] = {
    "store": frozenset(
        {
            "create_job",
            "create_job_group",
            "create_jobs",
            "get_jobs",
            "list_jobs",
            "update_job",
            "due_jobs",
            "add_runs",
            "get_runs",
            "list_runs",
            "run_counts",
            "claim",
            "claim_runs",
            "transition",
            "expired_leases",
            "overdue_runs",
            "register_worker",
            "known_tasks",
            "advance_jobs",
            "set_job_status",
        }
    ),
    "index": frozenset({"add", "claim_due", "claim_runs", "discard", "next_due_ms"}),
    "transport": frozenset({"publish", "consume", "ack", "nack", "extend"}),
}


@dataclass
class _Scripted:
    port: str
    method: str
    mode: Mode
    times: int
    when: Callable[..., bool] | None


@dataclass
class FaultPlan:
    """Which calls fail, and how. `chance` is the probability that any faultable call fails (half
    before it applies, half after), drawn from `rng`; scripted faults come first."""

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    chance: float = 0.0
    scripted: list[_Scripted] = field(default_factory=list)
    injected: list[tuple[str, str, Mode]] = field(default_factory=list)
    enabled: bool = True

    def script(
        self, port: str, method: str, mode: Mode = "before", *, times: int = 1, when: Callable[..., bool] | None = None
    ) -> None:
        self.scripted.append(_Scripted(port, method, mode, times, when))

    def decide(self, port: str, method: str, args: tuple[Any, ...]) -> Mode | None:
        if not self.enabled:
            return None
        for rule in self.scripted:
            matches = rule.times > 0 and rule.port == port and rule.method == method
            if matches and (rule.when is None or rule.when(*args)):
                rule.times -= 1
                self.injected.append((port, method, rule.mode))
                return rule.mode
        if self.chance and method in FAULTABLE.get(port, frozenset()) and self.rng.random() < self.chance:
            mode: Mode = "before" if self.rng.random() < 0.5 else "after"
            self.injected.append((port, method, mode))
            return mode
        return None


def _error(port: str, method: str, mode: Mode) -> Exception:
    text = f"injected fault: {port}.{method} {'failed' if mode == 'before' else 'applied, then failed'}"
    return TransportUnavailable(text) if port == "transport" else StoreUnavailable(text)


class Faulty:
    """`inner` with faults from `plan` on its faultable calls; everything else passes through."""

    def __init__(self, inner: Any, port: str, plan: FaultPlan) -> None:
        self._inner = inner
        self._port = port
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in FAULTABLE.get(self._port, frozenset()) or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            mode = self._plan.decide(self._port, name, args)
            if mode == "before":
                raise _error(self._port, name, mode)
            result = attr(*args, **kwargs)
            if mode == "after":
                raise _error(self._port, name, mode)
            return result

        return call
