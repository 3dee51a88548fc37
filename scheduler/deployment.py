"""The bundle of ports a daemon, a client or the API works with. Built by `jobq.wiring.connect`
(the composition root); everything else receives one and never imports the root."""

from __future__ import annotations

from dataclasses import dataclass

from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.ports import HistorySink, JobStore, TimeIndex, Transport
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

    def close(self) -> None:
        for part in (self.history, self.transport, self.index, self.store):
            part.close()
