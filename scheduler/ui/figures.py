"""What the dashboard's overview shows, read from the store within fixed bounds.

Every figure costs the same on a deployment of any size. Across every tenant (an operator's
view) the figures are `jobq status`'s (`jobq.overview.take_overview`): the store's run census,
the broker's backlog per tier and the daemon registry. Confined to one tenant, they come from
reads of that tenant's runs: runs per state from the newest `SAMPLE` runs (the page says so), due
but undispatched runs and dead letters counted up to `COUNT_CAP` ("1000+" beyond). Start lateness
always comes from the newest `SAMPLE` runs in scope. Live daemons per role are shown to everyone
(they say nothing about any tenant).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from jobq.client import Client
from jobq.models import PRIORITIES_BY_RANK, Run, TaskInfo, TaskTarget
from jobq.overview import take_overview
from jobq.ports import JobQuery, RunQuery
from jobq.registry import SCHEDULING_ROLES, DaemonRecord, Role

SAMPLE = 1000
COUNT_CAP = 1000
# Upper bounds (ms) of the lateness chart's bars; the last bar holds everything later.
LATENESS_BOUNDS_MS = (100, 250, 500, 1_000, 5_000, 60_000)


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    count: int
    share: float  # of the largest bar, 0..1


@dataclass(frozen=True, slots=True)
class Tier:
    """One priority tier's dispatch path (operators' overview)."""

    name: str
    waiting: int | None  # in the broker; None when it could not be asked
    oldest_age_s: float | None
    due: int  # due in the store, not yet dispatched
    due_late_s: float | None


@dataclass(frozen=True, slots=True)
class Overview:
    sampled_runs: int
    states_note: str  # where runs per state come from
    runs_by_state: dict[str, int]
    due_undispatched: int
    due_capped: bool
    oldest_due_late_ms: int | None
    dead_letters: int
    dead_letters_capped: bool
    lateness_bars: list[Bar]
    lateness_p50_ms: int | None
    lateness_p99_ms: int | None
    daemons_alive: dict[str, int] = field(default_factory=dict)
    missing_roles: list[str] = field(default_factory=list)
    tiers: list[Tier] = field(default_factory=list)
    last_errors: list[tuple[int, str, str]] = field(default_factory=list)
    broker_error: str | None = None


def lateness_ms(due_ms: int, started_ms: int | None) -> int | None:
    """How late a run started against its due time (never negative), or None if it has not started."""
    return None if started_ms is None else max(0, started_ms - due_ms)


def _percentile(sorted_values: list[int], q: float) -> int | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def lateness_chart(values: list[int]) -> list[Bar]:
    counts = [0] * (len(LATENESS_BOUNDS_MS) + 1)
    for v in values:
        counts[next((i for i, b in enumerate(LATENESS_BOUNDS_MS) if v < b), len(LATENESS_BOUNDS_MS))] += 1
    labels = [f"< {_ms_text(b)}" for b in LATENESS_BOUNDS_MS] + [f">= {_ms_text(LATENESS_BOUNDS_MS[-1])}"]
    top = max(counts) or 1
    return [Bar(label, n, n / top) for label, n in zip(labels, counts, strict=True)]


def _ms_text(ms: int) -> str:
    return f"{ms // 1000} s" if ms >= 1000 else f"{ms} ms"


def overview(client: Client, now_ms: int) -> Overview:
    """The overview for `client`'s scope (one tenant, or every tenant for an operator)."""
    runs = _newest_runs(client)
    late = sorted(v for r in runs if (v := lateness_ms(r.due_ms, r.started_ms)) is not None)
    daemons = client.d.registry.live_daemons(now_ms)
    alive = {role.value: sum(1 for d in daemons if d.role is role) for role in Role}
    common = {
        "sampled_runs": len(runs),
        "lateness_bars": lateness_chart(late),
        "lateness_p50_ms": _percentile(late, 0.5),
        "lateness_p99_ms": _percentile(late, 0.99),
        "daemons_alive": alive,
        "missing_roles": [r.value for r in SCHEDULING_ROLES if alive[r.value] == 0],
    }
    if client.tenant_id is None:
        return _deployment_overview(client, now_ms, common)
    return _tenant_overview(client, now_ms, runs, common)


def _newest_runs(client: Client) -> list[Run]:
    runs: list[Run] = []
    cursor = None
    while len(runs) < SAMPLE:
        page = client.store.list_runs(RunQuery(tenant_id=client.tenant_id, cursor=cursor, limit=500))
        runs.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    return runs[:SAMPLE]


def _deployment_overview(client: Client, now_ms: int, common: dict[str, Any]) -> Overview:
    taken = take_overview(client.d, now_ms, dead_letters=5)
    census = taken.census
    oldest_due = min((t.oldest_due_ms for t in census.tiers.values() if t.oldest_due_ms is not None), default=None)
    tiers = [
        Tier(
            p.queue,
            taken.backlog[p].waiting,
            taken.backlog[p].oldest_age_s,
            census.tiers[p].due,
            taken.due_lateness_s(p),
        )
        for p in PRIORITIES_BY_RANK
    ]
    return Overview(
        states_note="Every run, counted by the store." if census.exact else "Estimated from a sample of the store.",
        runs_by_state={state.value: n for state, n in sorted(census.states.items())},
        due_undispatched=sum(t.due for t in census.tiers.values()),
        due_capped=False,
        oldest_due_late_ms=None if oldest_due is None else max(0, now_ms - oldest_due),
        dead_letters=census.dead_letters,
        dead_letters_capped=False,
        tiers=tiers,
        last_errors=taken.last_errors(),
        broker_error=taken.broker_error,
        **common,
    )


def _tenant_overview(client: Client, now_ms: int, runs: list[Run], common: dict[str, Any]) -> Overview:
    by_state: dict[str, int] = {}
    for r in runs:
        by_state[r.state.value] = by_state.get(r.state.value, 0) + 1
    overdue = [r for r in client.store.overdue_runs(now_ms, COUNT_CAP + 1) if r.tenant_id == client.tenant_id]
    live_overdue = [r for r in overdue if not r.held]
    dead = 0
    cursor = None
    while dead <= COUNT_CAP:
        page = client.dead_letters(cursor=cursor, limit=500)
        dead += len(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    return Overview(
        states_note=f"Of the newest {len(runs)} runs.",
        runs_by_state=dict(sorted(by_state.items())),
        due_undispatched=min(len(live_overdue), COUNT_CAP),
        due_capped=len(overdue) > COUNT_CAP,
        oldest_due_late_ms=max((now_ms - r.due_ms for r in live_overdue), default=None),
        dead_letters=min(dead, COUNT_CAP),
        dead_letters_capped=dead > COUNT_CAP,
        **common,
    )


def _tenant_of(run_id: str) -> str | None:
    parsed = Run.parse_id(run_id)
    return None if parsed is None else parsed[0].tenant_id


def visible_daemons(records: list[DaemonRecord], tenant_id: str | None) -> list[DaemonRecord]:
    """The registry as a tenant may see it: the attempts it runs of that tenant's jobs only, and no
    last error (an error text may quote another tenant's data). An operator sees everything."""
    if tenant_id is None:
        return records
    shown = []
    for record in records:
        mine = tuple(r for r in record.running if _tenant_of(r.run_id) == tenant_id)
        shown.append(replace(record, running=mine, last_error=None, last_error_ms=None))
    return shown


@dataclass(frozen=True, slots=True)
class TaskRow:
    name: str
    info: TaskInfo | None  # its catalogue entry; None for a name a worker only registered
    jobs: int  # how many of the newest `TASK_JOBS_READ` jobs in scope use it


TASK_JOBS_READ = 500


def task_rows(client: Client) -> list[TaskRow]:
    """The task catalogue (every declaration workers published), plus names workers registered
    without a declaration (older workers), each with how many of the newest jobs in scope use it."""
    catalogue = client.declared()
    counts = dict.fromkeys([*catalogue, *client.store.known_tasks()], 0)
    for job in client.list(JobQuery(limit=TASK_JOBS_READ, newest_first=True)).items:
        if isinstance(job.target, TaskTarget):
            counts[job.target.task] = counts.get(job.target.task, 0) + 1
    return [TaskRow(name, catalogue.get(name), n) for name, n in sorted(counts.items())]
