"""The registrar: writes the daemons of this process into the daemon registry every few seconds.

Every `jobq` daemon process runs one beside its loops (`jobq.cli.daemons.run_until_stopped`,
and the API's app); it reports each daemon's identity, counters, slots and running attempts
(`Daemon.report`) every `registry_heartbeat_s` (5 s) with a TTL of three heartbeats, so a process
that dies drops out of `jobq status` within 15 s. A clean stop removes the entries at once.
`registry_heartbeat_s = 0` turns the registry off (`enabled`).

The registry is a view, never part of the work: a heartbeat that fails is logged once per outage
and retried at the next beat; it never raises into a loop, never turns `/healthz` red and never
stops a daemon. In a process that runs a worker, the registrar also watches for the roles that
delayed and cron jobs need (`SCHEDULING_ROLES`) and logs one warning naming those missing for
`WARN_AFTER_S`.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence

from jobq.daemons.base import Daemon
from jobq.deployment import Deployment
from jobq.metrics import METRICS
from jobq.registry import SCHEDULING_ROLES, DaemonRecord, Role

HEARTBEAT_S = 5.0  # the default of `Settings.registry_heartbeat_s`
TTL_BEATS = 3  # an entry lives three heartbeats: one lost write does not make a daemon look dead
WARN_AFTER_S = 30.0


def missing_roles_warning(missing: Sequence[Role]) -> str:
    """The one line `jobq status` prints and a lone worker logs."""
    names = ", ".join(r.value for r in missing)
    commands = " ".join(f"`jobq {r.value}`" for r in missing)
    return f"no live {names}: delayed and cron jobs will not run (start {commands}, or `jobq dev`)"


def enabled(deployment: Deployment) -> bool:
    return deployment.settings.registry_heartbeat_s > 0


class Registrar(Daemon):
    """Heartbeats for `daemons` (all in this process). `run_once(now_ms)` is one beat."""

    name = "registrar"

    def __init__(
        self,
        deployment: Deployment,
        daemons: Sequence[Daemon],
        *,
        interval_s: float | None = None,
        warn_after_s: float = WARN_AFTER_S,
    ) -> None:
        super().__init__(deployment)
        self.daemons = [d for d in daemons if d.name in Role.__members__.values()]
        self.interval_s = interval_s or self.settings.registry_heartbeat_s or HEARTBEAT_S
        self.ttl_ms = round(self.interval_s * TTL_BEATS * 1000)
        self.warn_after_ms = round(warn_after_s * 1000)
        self.watch = any(d.name == Role.WORKER for d in self.daemons)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_ms = self.clock.now_ms()
        self.missing: tuple[Role, ...] = ()
        self.missing_since_ms: int | None = self.started_ms  # nothing seen yet: absent since we started
        self.warned = False
        self.failing = False

    def records(self, now_ms: int) -> list[DaemonRecord]:
        from jobq import __version__

        records = []
        lateness = {key[0]: tuple(data) for key, data in METRICS.start_lateness.snapshot().items() if key}
        first_worker = next((d for d in self.daemons if d.name == Role.WORKER), None)
        for daemon in self.daemons:
            fields = {
                "daemon_id": daemon.daemon_id,
                "role": Role(daemon.name),
                "host": self.host,
                "pid": self.pid,
                "version": __version__,
                "started_ms": self.started_ms,
                "seen_ms": now_ms,
                **daemon.report(),
            }
            if daemon is first_worker:  # the histogram is the process's: report it once
                fields["start_lateness"] = lateness
            records.append(DaemonRecord(**fields))  # type: ignore[arg-type]
        return records

    def run_once(self, now_ms: int) -> int:
        """Write this process's records, and (beside a worker) look at who else is alive. Never
        raises: a failure is logged on the first beat of an outage, counted, and tried next beat."""
        try:
            registry = self.d.registry
            registry.heartbeat(self.records(now_ms), self.ttl_ms)
            if self.watch:
                self.observe({r.role for r in registry.live_daemons(now_ms)}, now_ms)
        except Exception as exc:
            METRICS.loop_errors.inc(daemon=self.name)
            self.note_error(exc)
            if not self.failing:
                self.log.warning("daemon registry heartbeat failed (%s: %s); retrying", type(exc).__name__, exc)
            self.failing = True
            return 0
        if self.failing:
            self.log.info("daemon registry heartbeat works again")
        self.failing = False
        return len(self.daemons)

    def observe(self, alive: set[Role], now_ms: int) -> str | None:
        """Track the scheduling roles missing from `alive`; returns the warning when it is due
        (once per absence, after `warn_after_ms`), after logging it."""
        missing = tuple(r for r in SCHEDULING_ROLES if r not in alive)
        if not missing:
            if self.warned:
                self.log.info("scanner, beat and reaper are alive: delayed and cron jobs run again")
            self.missing, self.missing_since_ms, self.warned = (), None, False
            return None
        if self.missing_since_ms is None:
            self.missing_since_ms = now_ms
        self.missing = missing
        if self.warned or now_ms - self.missing_since_ms < self.warn_after_ms:
            return None
        self.warned = True
        warning = missing_roles_warning(missing)
        self.log.warning("%s", warning)
        return warning

    def healthy(self, max_silence_s: float = 60.0) -> bool:
        return True  # the registry is a view: its outage must never restart a daemon

    def on_stop(self) -> None:
        try:
            self.d.registry.deregister([d.daemon_id for d in self.daemons])
        except Exception as exc:  # the entries expire on their own
            self.log.debug("could not deregister: %s", exc)


class Presence(Daemon):
    """A role with no loop of its own to register (the API's uvicorn worker processes)."""

    def __init__(self, deployment: Deployment, role: Role) -> None:
        self.name = role.value
        super().__init__(deployment)

    def run_once(self, now_ms: int) -> int:
        return 0


def start_thread(registrar: Registrar) -> tuple[threading.Thread, threading.Event]:
    """Run the registrar's loop in a daemon thread; set the event to stop it (it deregisters)."""
    stop = threading.Event()
    thread = threading.Thread(target=registrar.run_forever, args=(stop,), name="jobq-registrar", daemon=True)
    thread.start()
    return thread, stop
