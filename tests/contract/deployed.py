"""A deployment over each store backend of the contract suite: the store under test, with the
in-memory index, transport and history, on a manual clock (for client and daemon contracts)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from factories import T0

from jobq.clock import ManualClock
from jobq.deployment import Deployment
from jobq.history.memory import MemoryHistory
from jobq.ports import JobStore
from jobq.settings import Settings
from jobq.timeindex.memory import MemoryTimeIndex
from jobq.transport.memory import MemoryTransport


@pytest.fixture
def deployed(store: JobStore) -> Iterator[Deployment]:
    clock = ManualClock(T0)
    # A short horizon keeps the runs a cron job materialises per pass few (moto is slow).
    settings = Settings.load({"store": "memory://", "history_flush_s": 0, "horizon_s": 2}, env={})
    d = Deployment(settings, store, MemoryTimeIndex(), MemoryTransport(clock=clock), MemoryHistory(), clock)
    yield d
    for part in (d.history, d.transport, d.index):  # the store fixture closes the store
        part.close()
