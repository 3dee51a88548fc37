"""The PostgreSQL time index: a view of the store's SCHEDULED runs, read through a partial index.

Like the SQLite index, nothing is copied, so nothing can be lost: `add` and `discard` are no-ops
and beat has nothing to repair. `claim_due` reads ids without removing them (the store's
conditional claim decides between scanners that read the same ids); `claim_runs` finds and claims
in one statement with ``FOR UPDATE SKIP LOCKED``, so concurrent scanners neither wait for each
other nor claim the same run. Both take due runs CRITICAL first, then by due time.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobq.models import Run
from jobq.ports import IndexEntry
from jobq.store.postgres import PostgresStore


class PostgresTimeIndex:
    """`TimeIndex` and `ClaimingIndex` over a `PostgresStore` (which it does not close)."""

    derived_from_store = True

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def add(self, entries: Sequence[IndexEntry]) -> None:
        pass  # the store's runs are the index

    def claim_due(self, now_ms: int, limit: int) -> list[str]:
        return [r.run_id for r in self.store.overdue_runs(now_ms, limit)]

    def claim_runs(
        self, now_ms: int, limit: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        return self.store.claim_due(now_ms, limit, owner, lease_ms, due_by_ms=due_by_ms)

    def discard(self, run_ids: Sequence[str]) -> None:
        pass  # a run leaves the index by leaving SCHEDULED

    def next_due_ms(self) -> int | None:
        return self.store.next_due_ms()

    def close(self) -> None:
        pass  # the store owns the connections
