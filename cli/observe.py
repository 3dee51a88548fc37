"""The operator views: `jobq status` (no job: the deployment at a glance), `jobq workers`, `jobq top`."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from jobq.cli.common import backend_options, console, deployment, json_option, load_settings, print_json, reader
from jobq.daemons.registrar import missing_roles_warning
from jobq.instants import to_iso
from jobq.models import PRIORITIES_BY_RANK, RunState
from jobq.overview import Overview, take_overview
from jobq.redaction import redact_url
from jobq.registry import DaemonRecord, Role
from jobq.trends import Trends

RECENT_FAILURES = 5


def age(seconds: float | None) -> str:
    """`-`, `850ms`, `12.5s`, `4m05s`, `3h02m` or `2d04h`."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


def _daemons_line(overview: Overview) -> Text:
    line = Text("daemons  ")
    for role, n in overview.alive().items():
        line.append(f"{role.value} ", style="bold")
        line.append(f"{n}  ", style="green" if n else "red")
    return line


def warning_text(overview: Overview) -> Text | None:
    missing = overview.missing_roles()
    if not missing:
        return None
    return Text(f"WARNING: {missing_roles_warning(missing)}", style="bold white on red")


def tiers_table(overview: Overview, trends: Trends | None = None) -> Table:
    """Per tier: broker backlog and its oldest age, runs due but undispatched and the oldest's
    lateness; with `trends`, runs started per second and start lateness p50/p99."""
    table = Table(box=None, pad_edge=False)
    for column in ("tier", "waiting", "oldest", "due now", "most late"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    if trends is not None:
        for column in ("started/s", "late p50", "late p99"):
            table.add_column(column, justify="right")
    for priority in PRIORITIES_BY_RANK:
        backlog, tier = overview.backlog[priority], overview.census.tiers[priority]
        late = overview.due_lateness_s(priority)
        row: list[RenderableType] = [
            priority.queue,
            _count(backlog.waiting),
            age(backlog.oldest_age_s),
            str(tier.due),
            Text(age(late), style="red" if late is not None and late >= 1 else ""),
        ]
        if trends is not None:
            rate = trends.throughput(priority)
            row += [
                "-" if rate is None else f"{rate:.1f}",
                age(trends.lateness_s(priority, 0.5)),
                age(trends.lateness_s(priority, 0.99)),
            ]
        table.add_row(*row)
    return table


def _runs_line(overview: Overview) -> Text:
    states = overview.census.states
    parts = [f"{s.value}={states[s]}" for s in RunState if s in states]
    sampled = "" if overview.census.exact else "  (sampled; terminal states not counted)"
    return Text(f"runs     {' '.join(parts) or 'none'}{sampled}")


def _errors(overview: Overview) -> list[Text]:
    lines = []
    for at, where, error in overview.last_errors(RECENT_FAILURES):
        first = error.splitlines()[0] if error else ""
        lines.append(Text(f"  {to_iso(at)}  {where}  {first[:160]}"))
    return lines or [Text("  none")]


def status_renderables(overview: Overview, store: str) -> list[RenderableType]:
    parts: list[RenderableType] = [Text(f"jobq deployment at {to_iso(overview.at_ms)}  store={store}")]
    warning = warning_text(overview)
    if warning is not None:
        parts.append(warning)
    parts += [_daemons_line(overview), tiers_table(overview), _runs_line(overview)]
    parts.append(Text(f"dead letters  {overview.census.dead_letters}"))
    if overview.broker_error:
        parts.append(Text(f"broker not reachable: {overview.broker_error}", style="red"))
    parts.append(Text("last errors"))
    parts += _errors(overview)
    return parts


def show_deployment(as_json: bool, options: dict[str, Any]) -> None:
    """`jobq status` without a job."""
    settings = load_settings(options)
    with reader(settings):
        pass  # a store that does not exist is refused here, and nothing is created
    with deployment(settings) as d:
        overview = take_overview(d, d.clock.now_ms(), dead_letters=RECENT_FAILURES)
    if as_json:
        print_json(overview.to_json())
        return
    for part in status_renderables(overview, redact_url(settings.store_url)):
        console.print(part)


# -- jobq workers --------------------------------------------------------------------------------


def workers_table(daemons: list[DaemonRecord], now_ms: int) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in (
        "daemon",
        "role",
        "host:pid",
        "queues",
        "slots busy/free/lost",
        "done",
        "failed",
        "seen",
        "running now",
    ):
        table.add_column(column, overflow="fold")
    for r in daemons:
        slots = f"{r.busy}/{r.free}/{r.lost}" if r.role is Role.WORKER else "-"
        running = "\n".join(
            f"{x.run_id} {x.task} #{x.attempt} for {age((now_ms - x.started_ms) / 1000)}" for x in r.running
        )
        if r.busy > len(r.running) and r.running:
            running += f"\n(+{r.busy - len(r.running)} more)"
        pool = f" ({r.pool})" if r.pool else ""
        table.add_row(
            Text(r.daemon_id),
            r.role.value,
            Text(f"{r.host}:{r.pid}"),
            Text(",".join(r.queues) + pool if r.queues else "-"),
            Text(slots, style="red" if r.lost else ""),
            str(r.done),
            str(r.failures),
            f"{age((now_ms - r.seen_ms) / 1000)} ago",
            Text(running or "-"),
        )
    return table


def _record_json(r: DaemonRecord, now_ms: int) -> dict[str, Any]:
    return {
        "daemon_id": r.daemon_id,
        "role": r.role.value,
        "host": r.host,
        "pid": r.pid,
        "version": r.version,
        "started_ms": r.started_ms,
        "seen_ms": r.seen_ms,
        "queues": list(r.queues),
        "pool": r.pool,
        "concurrency": r.concurrency,
        "slots": {"busy": r.busy, "free": r.free, "lost": r.lost},
        "done": r.done,
        "failures": r.failures,
        "last_error": r.last_error,
        "running": [
            {
                "run_id": x.run_id,
                "task": x.task,
                "attempt": x.attempt,
                "started_ms": x.started_ms,
                "running_s": max(0.0, (now_ms - x.started_ms) / 1000),
            }
            for x in r.running
        ],
    }


@click.command()
@json_option
@backend_options
def workers(as_json: bool, **options: Any) -> None:
    """Every live daemon (from the daemon registry): what each worker runs now, its slots busy,
    free and lost, runs done and failed."""
    with reader(load_settings(options)) as d:
        now = d.clock.now_ms()
        daemons = d.registry.live_daemons(now)
    if as_json:
        print_json([_record_json(r, now) for r in daemons])
        return
    if not daemons:
        console.print("no live daemons (none has sent a heartbeat in the last 15 s)")
        return
    console.print(workers_table(daemons, now))


# -- jobq top ------------------------------------------------------------------------------------


def top_view(overview: Overview, trends: Trends, store: str) -> Group:
    """One frame of `jobq top` (a pure function of what was read, for tests)."""
    growth = trends.dead_letter_growth_per_min()
    dlq = f"dead letters  {overview.census.dead_letters}"
    dlq += "" if growth is None else f"  ({growth:+.1f}/min)"
    parts: list[RenderableType] = [
        Text(f"jobq top  {to_iso(overview.at_ms)}  store={store}  (q or Ctrl-C quits)", style="bold"),
    ]
    warning = warning_text(overview)
    if warning is not None:
        parts.append(warning)
    parts += [
        _daemons_line(overview),
        tiers_table(overview, trends),
        _runs_line(overview),
        Text(dlq, style="red" if growth else ""),
        workers_table(overview.daemons, overview.at_ms),
        Text("recent failures"),
        *_errors(overview),
    ]
    return Group(*parts)


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Single key presses from a terminal on stdin (cbreak mode, restored on exit); None otherwise."""
    if not sys.stdin.isatty():
        yield None
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd: int | None, timeout_s: float) -> bool:
    if fd is None:
        time.sleep(timeout_s)
        return False
    ready, _, _ = select.select([fd], [], [], timeout_s)
    return bool(ready) and os.read(fd, 32).lower().startswith(b"q")


@click.command()
@click.option(
    "--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True, help="Seconds between frames."
)
@backend_options
def top(interval: float, **options: Any) -> None:
    """A live full-screen view: throughput and start lateness per tier, backlog, due runs, dead-letter
    growth, daemons and recent failures, refreshed every second. q or Ctrl-C quits."""
    settings = load_settings(options)
    store = redact_url(settings.store_url)
    trends = Trends()
    screen = Console(highlight=False, markup=False)
    with reader(settings):
        pass  # a store that does not exist is refused here, and nothing is created
    with deployment(settings) as d, _keys() as fd:

        def frame() -> RenderableType:
            try:
                overview = take_overview(d, d.clock.now_ms(), dead_letters=RECENT_FAILURES)
            except Exception as exc:  # a store outage is shown, and the view keeps trying
                return Text(f"jobq top: cannot read the store ({type(exc).__name__}: {exc}); retrying", style="red")
            trends.add(overview)
            return top_view(overview, trends, store)

        try:
            with Live(frame(), console=screen, screen=True, auto_refresh=False) as live:
                while not _quit_pressed(fd, interval):
                    live.update(frame(), refresh=True)
        except KeyboardInterrupt:
            pass
