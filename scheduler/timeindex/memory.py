"""An in-memory time index: a heap per priority tier with lazy deletion. Thread-safe."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

from jobq.models import PRIORITIES_BY_RANK
from jobq.ports import IndexEntry


class MemoryTimeIndex:
    derived_from_store = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[str, int] = {}  # run_id -> due_ms: the truth; heap entries may be stale
        self._heaps: list[list[tuple[int, str]]] = [[] for _ in PRIORITIES_BY_RANK]

    def add(self, entries: Sequence[IndexEntry]) -> None:
        with self._lock:
            for e in entries:
                self._due[e.run_id] = e.due_ms
                heapq.heappush(self._heaps[e.priority.rank], (e.due_ms, e.run_id))

    def claim_due(self, now_ms: int, limit: int) -> list[str]:
        out: list[str] = []
        with self._lock:
            for heap in self._heaps:
                while heap and len(out) < limit and heap[0][0] <= now_ms:
                    due_ms, run_id = heapq.heappop(heap)
                    if self._due.get(run_id) == due_ms:
                        del self._due[run_id]
                        out.append(run_id)
        return out

    def discard(self, run_ids: Sequence[str]) -> None:
        with self._lock:
            for run_id in run_ids:
                self._due.pop(run_id, None)

    def next_due_ms(self) -> int | None:
        with self._lock:
            for heap in self._heaps:
                while heap and self._due.get(heap[0][1]) != heap[0][0]:
                    heapq.heappop(heap)
            heads = [heap[0][0] for heap in self._heaps if heap]
        return min(heads) if heads else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)

    def close(self) -> None:
        pass
