"""A real store whose first group commit is held: makes a submission group happen on cue."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from jobq.ports import CreateRequest


class HeldStore:
    """The real store, but its first `create_job_group` waits for `release`. It lets one group
    commit at a time (PostgreSQL would let several), so the callers that arrive meanwhile all
    queue for the next group. Records each group's job ids and the thread that wrote it."""

    concurrent_groups = 1

    def __init__(self, inner: Any, hold: bool = True) -> None:
        self._inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.groups: list[list[str]] = []
        self.threads: list[threading.Thread] = []

    def create_job_group(self, requests: Sequence[CreateRequest]) -> list[Any]:
        first = not self.entered.is_set()
        self.entered.set()
        if first:
            assert self.release.wait(30), "the test never released the held commit"
        self.groups.append([r.job.job_id for r in requests])
        self.threads.append(threading.current_thread())
        return self._inner.create_job_group(requests)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
