"""The daemon commands: dev, worker, scanner, reaper, beat. Each runs until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import click

from jobq import logs, metrics, tracing
from jobq.cli.common import backend_options, console, err_console, fail, load_apps, load_settings, sync_schedules
from jobq.daemons import registrar
from jobq.daemons.base import Daemon
from jobq.daemons.beat import Beat
from jobq.daemons.reaper import Reaper
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.daemons.worker.pools import POOLS
from jobq.deployment import Deployment
from jobq.errors import JobqError
from jobq.gauges import register_gauges
from jobq.redaction import redact_url
from jobq.settings import Settings
from jobq.wiring import connect


def daemon_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--log-level", default=None, help="DEBUG, INFO, WARNING [env JOBQ_LOG_LEVEL; INFO]")(fn)
    fn = click.option("--log-format", type=click.Choice(["text", "json"]), default=None, help="Log format.")(fn)
    fn = click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics on this port.")(fn)
    fn = click.option(
        "--tracing",
        type=click.Choice(["auto", "console", "otlp", "off"]),
        default=None,
        help="OpenTelemetry spans [env JOBQ_TRACING; auto: the application's provider].",
    )(fn)
    return backend_options(fn)


def run_until_stopped(d: Deployment, daemons: Sequence[Daemon], on_start: Callable[[], None] | None = None) -> None:
    """Run each daemon's loop in a thread until SIGTERM/SIGINT, then let each finish its pass,
    hand back what it holds, and exit. A second Ctrl-C exits at once.

    A loop never ends on its own (each retries its errors forever); if one does, that is a bug:
    the others are stopped and the process exits with status 1, so a supervisor restarts it."""
    stop = threading.Event()
    log = logging.getLogger("jobq")
    ended: list[str] = []
    if registrar.enabled(d):
        daemons = [*daemons, registrar.Registrar(d, daemons)]  # every process shows up in the daemon registry

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            os._exit(130)
        log.info("received %s: shutting down (Ctrl-C again to exit at once)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def health() -> bool:
        return all(x.healthy() for x in daemons)

    def loop(daemon: Daemon) -> None:
        try:
            daemon.run_forever(stop)
        except BaseException:
            log.exception("the %s loop raised", daemon.name)
            raise
        finally:
            if not stop.is_set():
                ended.append(daemon.name)

    if d.settings.metrics_port:
        register_gauges(d)
    server = metrics.serve(d.settings.metrics_port, health=health) if d.settings.metrics_port else None
    threads = [threading.Thread(target=loop, args=(x,), name=f"jobq-{x.name}") for x in daemons]
    for t in threads:
        t.start()
    try:
        if on_start is not None:
            on_start()
        while not stop.wait(0.5):
            if ended or not all(t.is_alive() for t in threads):
                log.error("the %s loop ended unexpectedly; stopping the others", ", ".join(ended) or "a daemon")
                stop.set()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=d.settings.shutdown_grace_s + 10)
        if server is not None:
            server.shutdown()
        d.close()
    if ended:
        raise SystemExit(1)


def _settings(options: dict[str, Any], role: str | None = None, **more: Any) -> Settings:
    """The settings; with `role`, logs and tracing are set up for that daemon too (commands that
    import the application's modules first pass none and call `_observe` after the import, so an
    application that configures logging itself keeps its configuration)."""
    options = {**options, **{k: v for k, v in more.items() if v is not None}}
    settings = load_settings(options)
    if role is not None:
        _observe(settings, role)
    return settings


def _observe(settings: Settings, role: str) -> None:
    logs.configure(settings.log_level, settings.log_format)
    _trace(settings, role)


def _trace(settings: Settings, role: str) -> None:
    try:
        tracing.configure(settings.tracing, f"jobq-{role}")
    except JobqError as exc:
        fail(str(exc))


def _queues(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    queues = tuple(q.strip().lower() for q in value.split(",") if q.strip())
    known = {"critical", "high", "default", "low"}
    unknown = [q for q in queues if q not in known]
    if unknown or not queues:
        fail(f"unknown queue(s) {', '.join(unknown) or repr(value)}; use critical, high, default, low")
    return queues


@click.command()
@click.option("-A", "--app", "apps", multiple=True, metavar="MODULE", help="Import tasks from MODULE[:APP].")
@click.option("-Q", "--queues", default=None, help="Queues in priority order [critical,high,default,low].")
@click.option("-c", "--concurrency", type=int, default=None, help="Tasks run at once [4].")
@click.option("--api/--no-api", "serve_api", default=True, show_default=True, help="Serve the HTTP API too.")
@click.option("--api-port", type=int, default=None, help="Port of the HTTP API [env JOBQ_API_PORT; 8080].")
@daemon_options
def dev(
    apps: tuple[str, ...],
    queues: str | None,
    concurrency: int | None,
    serve_api: bool,
    api_port: int | None,
    **options: Any,
) -> None:
    """Run every role in one process (beat, scanner, worker, reaper, and the HTTP API) on the
    embedded SQLite store. Webhooks may call this machine (127.0.0.0/8, ::1) in dev."""
    from jobq.cli.api import dev_api, dev_settings, webhook_caller

    settings = dev_settings(_settings(options, queues=_queues(queues), concurrency=concurrency, api_port=api_port))
    app, registry = load_apps(apps)
    from jobq.daemons.worker.pools import pool_for

    logs.configure(settings.log_level, settings.log_format)
    pool = pool_for(settings, registry)  # before any thread or connection, as for `jobq worker`
    _trace(settings, "dev")
    d = connect(settings)
    app.use(d)
    caller = webhook_caller(d)
    worker = Worker(d, registry, webhook=caller, pool=pool)
    daemons: list[Daemon] = [Beat(d), Scanner(d), worker, Reaper(d)]
    served = dev_api(d) if serve_api else None
    console.print(
        f"jobq dev store={redact_url(settings.store_url)} queues={','.join(worker.queues)} slots={worker.concurrency}"
    )
    console.print(f"tasks: {', '.join(sorted(registry.names())) or '(none: pass -A MODULE)'}")
    if served is not None:
        server, token = served
        daemons.append(server)
        click.echo(f"API: {server.url}/v1 (docs at {server.url}/docs)")
        click.echo(f"dashboard: {server.url}/ui (sign in with the token below)")
        click.echo(f"token for tenant default (shown once): {token}")
        click.echo(f"  export TOKEN={token}")
    console.print("Ctrl-C to stop")

    def seed() -> None:
        worker.start()  # register tasks before the hooks schedule anything
        sync_schedules(apps, d)
        for hook in app.dev_hooks:
            hook(app)

    try:
        run_until_stopped(d, daemons, seed)
    finally:
        if caller is not None:
            caller.close()


# `jobq worker -P gevent` starts over in a fresh interpreter that monkey-patches the standard
# library before it imports anything else (jobq itself imports socket; ssl, redis and boto3 must
# come after the patch), then runs the same command line. The patch removes `select.epoll`, which
# trio needs at import: where trio is installed, httpcore (the webhook client) probes it and would
# die with AttributeError, so trio is marked missing for this process (it cannot run here anyway).
_GEVENT_BOOT = (
    "import sys; from gevent import monkey; monkey.patch_all(); "
    "sys.modules.setdefault('trio', None); "
    "from jobq.cli.main import cli; sys.exit(cli(prog_name='jobq'))"
)
_GEVENT_BOOTED = "JOBQ_GEVENT_PATCHED"


def _patch_for_gevent() -> None:
    from jobq.extras import require

    monkey = require("gevent.monkey", "gevent", "the gevent pool (-P gevent)")
    if monkey.is_module_patched("socket"):
        return
    if os.environ.get(_GEVENT_BOOTED):
        fail("-P gevent: the standard library could not be monkey-patched before start")
    os.environ[_GEVENT_BOOTED] = "1"
    os.execv(sys.executable, [sys.executable, "-c", _GEVENT_BOOT, *sys.argv[1:]])


@click.command()
@click.option("-A", "--app", "apps", multiple=True, metavar="MODULE", help="Import tasks from MODULE[:APP].")
@click.option("-Q", "--queues", default=None, help="Queues to consume, highest priority first.")
@click.option("-c", "--concurrency", type=int, default=None, help="Tasks run at once (the pool size) [4].")
@click.option(
    "-P",
    "--pool",
    type=click.Choice(POOLS),
    default=None,
    help="Where tasks run: prefork (child processes), threads, gevent (greenlets; jobq[gevent]), "
    "asyncio (async def tasks), solo (inline) [env JOBQ_POOL; prefork].",
)
@click.option("--autoscale", default=None, metavar="MAX,MIN", help="Grow and shrink the pool with the backlog.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None, help="Hard limit, seconds.")
@click.option(
    "--soft-time-limit",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds until SoftTimeLimitExceeded is raised in the task.",
)
@click.option("--max-tasks-per-child", type=click.IntRange(min=1), default=None, help="prefork: recycle after N.")
@click.option(
    "--max-memory-per-child",
    type=click.IntRange(min=1),
    default=None,
    metavar="KIB",
    help="prefork: recycle a child whose resident memory passes KIB after a task.",
)
@click.option("--worker-id", default=None, help="Name in leases and logs [worker-<host>-<pid>-<rand>].")
@daemon_options
def worker(
    apps: tuple[str, ...],
    queues: str | None,
    concurrency: int | None,
    pool: str | None,
    autoscale: str | None,
    time_limit: float | None,
    soft_time_limit: float | None,
    max_tasks_per_child: int | None,
    max_memory_per_child: int | None,
    worker_id: str | None,
    **options: Any,
) -> None:
    """Run tasks from the given queues in strict priority order."""
    settings = _settings(
        options,
        queues=_queues(queues),
        concurrency=concurrency,
        pool=pool,
        autoscale=autoscale,
        time_limit_s=time_limit,
        soft_time_limit_s=soft_time_limit,
        max_tasks_per_child=max_tasks_per_child,
        max_memory_per_child_kib=max_memory_per_child,
    )
    if settings.pool is None:
        settings = settings.with_overrides(pool="prefork")
    if settings.pool == "gevent":
        _patch_for_gevent()
    app, registry = load_apps(apps)
    from jobq.daemons.worker.pools import pool_for

    logs.configure(settings.log_level, settings.log_format)  # the prefork zygote's children inherit it
    # Before any thread or connection: a prefork pool forks its zygote here (see pools/prefork.py).
    tasks_pool = pool_for(settings, registry)
    _trace(settings, "worker")
    if not registry.names():
        err_console.print("warning: no tasks registered (pass -A MODULE); every run will be handed on")
    d = connect(settings)
    app.use(d)
    sync_schedules(apps, d)
    from jobq.cli.api import webhook_caller

    caller = webhook_caller(d)
    try:
        run_until_stopped(d, [Worker(d, registry, worker_id=worker_id, webhook=caller, pool=tasks_pool)])
    finally:
        if caller is not None:
            caller.close()


def _simple(name: str, factory: Callable[[Deployment], Daemon], help_text: str) -> click.Command:
    @click.command(name=name, help=help_text)
    @daemon_options
    def command(**options: Any) -> None:
        settings = _settings(options, role=name)
        d = connect(settings)
        run_until_stopped(d, [factory(d)])

    return command


scanner = _simple("scanner", Scanner, "Claim due runs (CRITICAL first) and dispatch them to the queues.")
reaper = _simple("reaper", Reaper, "Take back runs whose lease expired (fence+1) and retry or dead-letter them.")


@click.command()
@click.option("-A", "--app", "apps", multiple=True, metavar="MODULE", help="Sync MODULE[:APP]'s periodic schedules.")
@daemon_options
def beat(apps: tuple[str, ...], **options: Any) -> None:
    """Create the runs of due schedules within the horizon; repair the time index. With -A, first
    sync the apps' declared periodic schedules (as workers do)."""
    settings = _settings(options)
    d = connect(settings)
    sync_schedules(apps, d)  # imports the apps: their own logging configuration comes first
    _observe(settings, "beat")
    run_until_stopped(d, [Beat(d)])
