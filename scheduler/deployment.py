"""The bundle of ports a daemon, a client or the API works with. Built by `jobq.wiring.connect`
(the composition root); everything else receives one and never imports the root."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError
from jobq.ports import DaemonRegistry, HistorySink, JobStore, RunCensus, TimeIndex, Transport
from jobq.settings import Settings


@dataclass
class Deployment:
    """The four ports, built from settings; daemons and clients receive this."""

    settings: Settings
    store: JobStore
    index: TimeIndex
    transport: Transport
    history: HistorySink
    clock: Clock = SYSTEM_CLOCK
    # Set when the store, time index and queue are one SQLite file: a write transaction that all
    # their writes on this thread join, so a submission's job, runs and messages commit together.
    atomic: Callable[[], AbstractContextManager[None]] | None = None

    @property
    def registry(self) -> DaemonRegistry:
        """The daemon registry; every store backend is one."""
        if not isinstance(self.store, DaemonRegistry):
            raise ConfigError("store", type(self.store).__name__, "this store keeps no daemon registry")
        return self.store

    @property
    def census(self) -> RunCensus:
        """The store's run counts; every store backend offers them."""
        if not isinstance(self.store, RunCensus):
            raise ConfigError("store", type(self.store).__name__, "this store cannot count runs")
        return self.store

    def close(self) -> None:
        for part in (self.history, self.transport, self.index, self.store):
            part.close()
