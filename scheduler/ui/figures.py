"""What the dashboard's overview shows, read from the store within fixed bounds.

Every figure is bounded so that the page costs the same on a deployment of any size: runs per
state and start lateness come from the newest `SAMPLE` runs (the page says so), the due but
undispatched runs and the dead letters are counted up to `COUNT_CAP` ("1000+" beyond). A tenant's
figures come from the same reads confined to its tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobq.client import Client
from jobq.models import Run, TaskTarget
from jobq.ports import JobQuery, RunQuery

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
class Overview:
    sampled_runs: int
    runs_by_state: dict[str, int]
    due_undispatched: int
    due_capped: bool
    oldest_due_late_ms: int | None
    dead_letters: int
    dead_letters_capped: bool
    lateness_bars: list[Bar]
    lateness_p50_ms: int | None
    lateness_p99_ms: int | None
    tasks: list[str] = field(default_factory=list)


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
    runs: list[Run] = []
    cursor = None
    while len(runs) < SAMPLE:
        page = client.store.list_runs(RunQuery(tenant_id=client.tenant_id, cursor=cursor, limit=500))
        runs.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    runs = runs[:SAMPLE]
    by_state: dict[str, int] = {}
    for r in runs:
        by_state[r.state.value] = by_state.get(r.state.value, 0) + 1
    late = sorted(v for r in runs if (v := lateness_ms(r.due_ms, r.started_ms)) is not None)

    overdue = [
        r
        for r in client.store.overdue_runs(now_ms, COUNT_CAP + 1)
        if client.tenant_id is None or r.tenant_id == client.tenant_id
    ]
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
        sampled_runs=len(runs),
        runs_by_state=dict(sorted(by_state.items())),
        due_undispatched=min(len(live_overdue), COUNT_CAP),
        due_capped=len(overdue) > COUNT_CAP,
        oldest_due_late_ms=max((now_ms - r.due_ms for r in live_overdue), default=None),
        dead_letters=min(dead, COUNT_CAP),
        dead_letters_capped=dead > COUNT_CAP,
        lateness_bars=lateness_chart(late),
        lateness_p50_ms=_percentile(late, 0.5),
        lateness_p99_ms=_percentile(late, 0.99),
    )


def seen_tasks(client: Client) -> list[tuple[str, int]]:
    """Task names workers registered, each with how many of the newest jobs in scope use it."""
    counts = dict.fromkeys(client.store.known_tasks(), 0)
    for job in client.list(JobQuery(limit=500)).items:
        if isinstance(job.target, TaskTarget):
            counts[job.target.task] = counts.get(job.target.task, 0) + 1
    return sorted(counts.items())
