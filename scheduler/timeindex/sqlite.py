"""The embedded time index: a view of the store's SCHEDULED runs, read through a partial index.

Nothing is copied, so nothing can be lost: `add` and `discard` are no-ops and beat has nothing to
repair. `claim_due` reads ids without removing them; the store's conditional claim decides
between scanners that read the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobq.models import Run
from jobq.ports import IndexEntry
from jobq.store.sqlite import SqliteStore


class SqliteTimeIndex:
    derived_from_store = True

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def add(self, entries: Sequence[IndexEntry]) -> None:
        pass

    def claim_due(self, now_ms: int, limit: int) -> list[str]:
        return [r["run_id"] for r in self.store.overdue_rows("run_id", now_ms, limit)]

    def claim_runs(
        self, now_ms: int, limit: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        return self.store.claim_due(now_ms, limit, owner, lease_ms, due_by_ms=due_by_ms)

    def discard(self, run_ids: Sequence[str]) -> None:
        pass

    def next_due_ms(self) -> int | None:
        return self.store.next_due_ms()

    def close(self) -> None:
        pass
