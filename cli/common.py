"""What every command shares: backend options, settings, errors as one line with exit code 2, output."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from jobq.cli.plaintable import PIPED_WIDTH, draw, layout
from jobq.errors import JobqError

if TYPE_CHECKING:  # imported where used, so `jobq --help` and light commands start fast
    from pydantic import ValidationError
    from rich.console import Console
    from rich.table import Table

    from jobq.app import App
    from jobq.deployment import Deployment
    from jobq.models import JobKey
    from jobq.settings import Settings
    from jobq.tasks import TaskRegistry

F = TypeVar("F", bound=Callable[..., Any])
EXIT_USAGE = 2
SYNC_ATTEMPTS = 8  # about a minute and a half of backoff

if TYPE_CHECKING:  # made on first use by __getattr__ below
    console: Console
    err_console: Console


def __getattr__(name: str) -> Console:
    """`console` and `err_console`, the rich consoles, made on first use: importing rich costs about
    30 ms, and `jobq --help` and `jobq list` print without it (`print_table`)."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _rich_console(name)


def _rich_console(name: str) -> Console:
    """The console `name` (this module's own code reaches it here: `__getattr__` serves only
    other modules). Piped output (scripts, logs) gets whole values: rich would otherwise assume
    80 columns. Output is data (task names, error texts, hints such as `pip install 'jobq[api]'`):
    neither console reads rich markup, so brackets print as they are; styles are given as `Text`
    styles instead."""
    made: Console | None = globals().get(name)
    if made is None:
        from rich.console import Console

        stderr = name == "err_console"
        terminal = (sys.stderr if stderr else sys.stdout).isatty()
        made = Console(stderr=stderr, highlight=False, markup=False, width=None if terminal else PIPED_WIDTH)
        globals()[name] = made
    return made


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, whole: int = 0) -> None:
    """Print a table as `table()` would, column `whole` never wrapped (ids are copied with a double
    click). Drawn without rich when its text is plain ASCII (`jobq.cli.plaintable`)."""
    shape = layout(sys.stdout)
    drawn = draw(headers, rows, width=shape[0], bold=shape[1], whole=whole) if shape else None
    if drawn is not None:
        click.echo(drawn, nl=False)
        return
    t = table(*headers)
    for row in rows:
        t.add_row(*row)
    keep_whole(t, whole, [row[whole] for row in rows])
    _rich_console("console").print(t)


def table(*columns: str) -> Table:
    """A table whose cells wrap rather than end in an ellipsis: ids must stay copyable."""
    from rich.table import Table

    t = Table(*columns)
    for column in t.columns:
        column.overflow = "fold"
    return t


def keep_whole(t: Table, column: int, values: list[str]) -> None:
    """Never wrap this column (ids are copied with a double click): it is as wide as its longest
    value, and the other columns fold to make room."""
    c = t.columns[column]
    c.no_wrap = True
    c.min_width = max([len(v) for v in values] + [len(str(c.header))])


def clip(text: str | None, limit: int) -> str:
    """`text` on one line, cut at a word boundary before `limit` characters (with `…`)."""
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit 2: the CLI's only error path for bad input."""
    from rich.text import Text

    _rich_console("err_console").print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    raise SystemExit(EXIT_USAGE)


def describe_validation(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"] if p not in ("function-after",))
    return f"{where}: {error['msg']}" if where else str(error["msg"])


class JobqGroup(click.Group):
    """Turns every jobq error into one clear line and exit code 2 (never a traceback)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobqError as exc:
            fail(str(exc))
        except ValueError as exc:
            from pydantic import ValidationError  # loaded already if it raised this

            if not isinstance(exc, ValidationError):
                raise
            fail(describe_validation(exc))


def backend_options(fn: F) -> F:
    """--store/--index/--broker/--history/--config, also read from JOBQ_* variables."""
    options = [
        click.option("--store", "store", metavar="URL", help="Job store URL [env JOBQ_STORE; sqlite:///jobq.db]"),
        click.option("--index", "index", metavar="URL", help="Time index URL [env JOBQ_INDEX; the store's]"),
        click.option("--broker", "broker", metavar="URL", help="Transport URL [env JOBQ_BROKER; the store's]"),
        click.option("--history", "history", metavar="URL", help="History sink URL [env JOBQ_HISTORY]"),
        click.option("--config", "config_file", metavar="FILE", help="TOML settings file [env JOBQ_CONFIG]"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def load_settings(overrides: dict[str, Any]) -> Settings:
    from jobq.settings import Settings

    config_file = overrides.pop("config_file", None)
    return Settings.load(overrides, config_file=config_file)


@contextmanager
def deployment(settings: Settings) -> Iterator[Deployment]:
    from jobq.wiring import connect

    d = connect(settings)
    try:
        yield d
    finally:
        d.close()


@contextmanager
def reader(settings: Settings, *, history: bool = False) -> Iterator[Deployment]:
    """For read-only commands: only the store (and the history when asked), never created here."""
    from jobq.wiring import connect_reader

    d = connect_reader(settings, history=history)
    try:
        yield d
    finally:
        d.close()


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def tenant_option(fn: F) -> F:
    """--tenant for commands that take a JOB_ID: job ids are scoped by tenant."""
    return click.option(
        "--tenant",
        "tenant_id",
        default=None,
        metavar="TENANT",
        help="The job's tenant [default]. JOB_ID may also be given as TENANT/JOB_ID.",
    )(fn)


def job_key(ref: str, tenant_id: str | None) -> JobKey:
    """The job that JOB_ID names: `JOB_ID` in `--tenant` (default `default`), or `TENANT/JOB_ID`.
    Naming two different tenants (`a/job --tenant b`) is an error."""
    from jobq.models import DEFAULT_TENANT, JobKey

    key = JobKey.parse(ref, tenant_id or DEFAULT_TENANT)
    if not key.tenant_id or not key.job_id:
        fail(f"{ref!r} is not a job id: use JOB_ID, or TENANT/JOB_ID")
    if tenant_id is not None and key.tenant_id != tenant_id:
        fail(f"{ref!r} names tenant {key.tenant_id!r}, but --tenant is {tenant_id!r}")
    return key


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def load_apps(specs: tuple[str, ...]) -> tuple[App, TaskRegistry]:
    """Import each `module` or `module:attribute` given with -A and collect their tasks.

    The current directory is importable (as with `python -m`). Tasks registered with
    `@jobq.task` land on the default app. Returns the first app found and every task."""
    from jobq.app import default_app
    from jobq.tasks import TaskRegistry

    apps = find_apps(specs)
    registry = TaskRegistry()
    for app in apps:
        for definition in app.registry:
            registry.add(definition)
    return (apps[0] if apps else default_app), registry


def sync_schedules(specs: tuple[str, ...], d: Deployment) -> None:
    """Sync the declared periodic schedules of every app given with -A (`App.sync_schedules`),
    trying again for a while when the store is unavailable (a daemon starting before its store)."""
    for app in find_apps(specs):
        app.use(d)
        for attempt in range(SYNC_ATTEMPTS):
            try:
                report = app.sync_schedules()
                break
            except JobqError as exc:
                if not exc.retryable or attempt == SYNC_ATTEMPTS - 1:
                    raise
                _rich_console("err_console").print(
                    f"warning: syncing periodic schedules: {exc}; trying again", soft_wrap=True
                )
                time.sleep(min(30.0, 0.5 * 2**attempt))
        if app.schedules or report.paused:
            _rich_console("err_console").print(
                f"periodic schedules of app {app.name}: {report.summary()}", soft_wrap=True
            )


def find_apps(specs: tuple[str, ...]) -> list[App]:
    """The apps of the modules given with -A (imported once; later calls find them again)."""
    from jobq.app import App, default_app

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    apps: list[App] = []
    for spec in specs:
        module_name, _, attribute = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            fail(f"cannot import {module_name!r} given with -A: {exc}")
        if attribute:
            found = getattr(module, attribute, None)
            if not isinstance(found, App):
                fail(f"{spec!r} is not a jobq App")
            apps.append(found)
        else:
            apps.extend(v for v in vars(module).values() if isinstance(v, App) and v not in apps)
    if (default_app.registry or default_app.schedules) and default_app not in apps:
        apps.append(default_app)
    return apps


def ms_to_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    from jobq.instants import to_iso

    return to_iso(ms)
