"""The deployment at a glance: what `jobq status`, `jobq top` and the gauges show, read in one go.

An `Overview` is taken from the ports: one census of the runs (`RunCensus.census`), one read
of the daemon registry, the broker's depth per tier queue, and (when asked) the newest dead
letters. Every figure is as of `at_ms`. Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobq.deployment import Deployment
from jobq.models import PRIORITIES_BY_RANK, Priority, Run
from jobq.ports import RunQuery
from jobq.registry import SCHEDULING_ROLES, Census, DaemonRecord, Role


@dataclass(frozen=True, slots=True)
class Backlog:
    """One tier's queue in the broker: messages waiting, and how long the oldest has waited
    (from the broker when it can tell, else from the store: the oldest run dispatched but not
    started). `waiting` is None when the broker could not be asked."""

    waiting: int | None
    oldest_age_s: float | None


@dataclass(frozen=True, slots=True)
class Overview:
    at_ms: int
    census: Census
    daemons: list[DaemonRecord]
    backlog: dict[Priority, Backlog]
    dead_letters: list[Run] = field(default_factory=list)  # newest first, when asked for
    broker_error: str | None = None

    def alive(self) -> dict[Role, int]:
        """Live daemons per role, every role present (0 when none)."""
        counts = dict.fromkeys(Role, 0)
        for record in self.daemons:
            counts[record.role] += 1
        return counts

    def missing_roles(self) -> list[Role]:
        """The scheduling roles with no live daemon: delayed and cron jobs will not run."""
        alive = self.alive()
        return [r for r in SCHEDULING_ROLES if alive[r] == 0]

    def due_lateness_s(self, priority: Priority) -> float | None:
        """How late the oldest due-but-undispatched run of the tier is, in seconds."""
        oldest = self.census.tiers[priority].oldest_due_ms
        return None if oldest is None else max(0.0, (self.at_ms - oldest) / 1000)

    def last_errors(self, limit: int = 5) -> list[tuple[int, str, str]]:
        """(when, where, error) newest first: daemons' last errors and the newest dead letters."""
        errors: list[tuple[int, str, str | None]] = [
            (r.last_error_ms or r.seen_ms, r.daemon_id, r.last_error) for r in self.daemons
        ]
        errors += [(run.finished_ms or run.updated_ms, run.run_id, run.last_error) for run in self.dead_letters]
        shown = [(at, where, text) for at, where, text in errors if text]
        shown.sort(key=lambda e: e[0], reverse=True)
        return shown[:limit]

    def to_json(self) -> dict[str, Any]:
        """The `jobq status --json` document (keys and units documented in docs/operations.md)."""
        alive = self.alive()
        return {
            "at_ms": self.at_ms,
            "daemons_alive": {r.value: alive[r] for r in Role},
            "missing_roles": [r.value for r in self.missing_roles()],
            "backlog": {
                p.queue: {
                    "waiting": self.backlog[p].waiting,
                    "oldest_age_s": self.backlog[p].oldest_age_s,
                    "due_undispatched": self.census.tiers[p].due,
                    "due_oldest_late_s": self.due_lateness_s(p),
                }
                for p in PRIORITIES_BY_RANK
            },
            "runs": {state.value: n for state, n in sorted(self.census.states.items())},
            "runs_exact": self.census.exact,
            "dead_letters": self.census.dead_letters,
            "last_errors": [{"at_ms": at, "where": where, "error": text} for at, where, text in self.last_errors()],
            "broker_error": self.broker_error,
        }


def take_overview(d: Deployment, now_ms: int, *, dead_letters: int = 0) -> Overview:
    """Read the figures (raises `StoreUnavailable` when the store cannot be read; a broker that
    cannot be asked leaves `waiting` None and sets `broker_error`)."""
    census = d.census.census(now_ms)
    daemons = d.registry.live_daemons(now_ms)
    backlog: dict[Priority, Backlog] = {}
    broker_error = None
    for priority in PRIORITIES_BY_RANK:
        tier = census.tiers[priority]
        store_age = None if tier.oldest_dispatched_ms is None else max(0.0, (now_ms - tier.oldest_dispatched_ms) / 1000)
        try:
            waiting, broker_age = queue_depth(d, priority.queue)
        except Exception as exc:  # the broker's view is one figure among many: show the rest
            broker_error = f"{type(exc).__name__}: {exc}"
            waiting, broker_age = None, None
        backlog[priority] = Backlog(waiting, broker_age if broker_age is not None else store_age)
    dead = []
    if dead_letters > 0:
        dead = d.store.list_runs(RunQuery(dead_letter=True, limit=dead_letters)).items
    return Overview(now_ms, census, daemons, backlog, dead, broker_error)


def queue_depth(d: Deployment, queue: str) -> tuple[int, float | None]:
    """Messages waiting in `queue` (ready for a consumer: not in flight, not delayed) and the oldest
    one's age when the broker can tell (`Transport.queue_depth`)."""
    depth = d.transport.queue_depth(queue)
    return depth.waiting, depth.oldest_age_s
