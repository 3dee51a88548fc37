"""Job commands: schedule, status, list, runs, history, cancel, pause, resume, trigger, dlq, init."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import click
from rich.table import Table

from jobq.cli.common import (
    backend_options,
    clip,
    console,
    deployment,
    err_console,
    fail,
    job_key,
    json_option,
    keep_whole,
    load_apps,
    load_settings,
    print_json,
    reader,
    tenant_option,
)
from jobq.cli.common import table as new_table
from jobq.client import Client
from jobq.deployment import Deployment
from jobq.models import JobStatus, Priority, Run, RunState, ScheduleType, TaskTarget
from jobq.views import event_resource, iso, job_resource, run_resource, task_resource

PREVIEW_MAX_FIRES = 500  # jobq.cronpreview.MAX_FIRES, not imported here: it is slow to load

# The option that sets each JobSpec field, for error messages.
_FLAGS = {
    "tenant_id": "--tenant",
    "job_id": "--job-id",
    "job_name": "--name",
    "cron_expression": "--cron",
    "timezone": "--tz",
    "run_at": "--at",
    "delay_seconds": "--in",
    "target": "TASK",
    "target.task": "TASK",
    "payload": "--args/--kwargs",
    "retry_policy.max_retries": "--max-retries",
    "catchup_window_seconds": "--catchup",
    "jitter_seconds": "--jitter",
    "timeout_seconds": "--timeout",
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in `45m`, `1h30m`, `90s`, `500ms`, `2d` or a bare number of seconds."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value)
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        fail(f"--in {text!r} is not a duration; use e.g. 45m, 1h30m, 90s, 500ms, 2d")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _json_arg(name: str, text: str | None, kind: type) -> Any:
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{name} is not valid JSON: {exc}")
    if not isinstance(value, kind):
        fail(f"{name} must be a JSON {'array' if kind is list else 'object'}")
    return value


@click.command()
@click.argument("task")
@click.option("--cron", help='Cron expression: 5 fields, 6 (seconds first) or @hourly…; e.g. "0 2 1 * *".')
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA timezone for --cron and --at.")
@click.option("--at", "at", help="When: ISO 8601 (naive times are read in --tz) or epoch milliseconds.")
@click.option("--in", "in_", metavar="DURATION", help="After a delay: 45m, 1h30m, 90s.")
@click.option("--now", is_flag=True, help="As soon as possible (the default when no time is given).")
@click.option("--args", "args_json", metavar="JSON", help="Positional arguments as a JSON array.")
@click.option("--kwargs", "kwargs_json", metavar="JSON", help="Keyword arguments as a JSON object.")
@click.option("--priority", type=click.Choice([p.value for p in Priority], case_sensitive=False), default=None)
@click.option("--name", help="A name for the job [the task name].")
@click.option("--job-id", help="Choose the job id (refused if it exists).")
@click.option("--tenant", "tenant_id", default="default", show_default=True)
@click.option("--max-retries", type=int, default=None, help="Attempts after the first [3].")
@click.option(
    "--misfire", type=click.Choice(["fire_once_now", "skip", "fire_all"]), default="fire_once_now", show_default=True
)
@click.option("--catchup", "catchup_s", type=int, default=86_400, show_default=True, help="Catch-up window, s.")
@click.option(
    "--overlap",
    type=click.Choice(["SKIP", "BUFFER_ONE", "BUFFER_ALL", "CANCEL_OTHER", "ALLOW_ALL"]),
    default="SKIP",
    show_default=True,
)
@click.option("--jitter", "jitter_s", type=int, default=0, help="Spread each fire over up to this many seconds.")
@click.option("--dst-gap", type=click.Choice(["skip", "shift"]), default="skip", show_default=True)
@click.option("--dst-overlap", type=click.Choice(["once", "twice"]), default="once", show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=None, help="Fail an attempt after this many seconds.")
@click.option("--idempotency-key", default=None, help="Submitting again with this key returns the same job.")
@click.option("-A", "--app", "apps", multiple=True, metavar="MODULE", help="Also accept the tasks of MODULE.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate and print the job and its next fires (DST marked, see `jobq cron`) without storing anything.",
)
@click.option(
    "--next",
    "preview_count",
    type=click.IntRange(1, PREVIEW_MAX_FIRES),
    default=10,
    show_default=True,
    help="With --dry-run: how many fires to show.",
)
@json_option
@backend_options
def schedule(
    task: str,
    cron: str | None,
    timezone: str,
    at: str | None,
    in_: str | None,
    now: bool,
    args_json: str | None,
    kwargs_json: str | None,
    priority: str | None,
    name: str | None,
    job_id: str | None,
    tenant_id: str,
    max_retries: int | None,
    misfire: str,
    catchup_s: int,
    overlap: str,
    jitter_s: int,
    dst_gap: str,
    dst_overlap: str,
    timeout_s: float | None,
    idempotency_key: str | None,
    apps: tuple[str, ...],
    dry_run: bool,
    preview_count: int,
    as_json: bool,
    **options: Any,
) -> None:
    """Schedule TASK once (--at, --in), on a cron (--cron, --tz), or now (--now)."""
    if sum(bool(x) for x in (cron, at, in_, now)) > 1:
        fail("give only one of --cron, --at, --in and --now")
    kind = ScheduleType.CRON if cron else ScheduleType.ONE_OFF if (at or in_) else ScheduleType.IMMEDIATE
    _app, registry = load_apps(apps) if apps else (None, None)
    local = registry.get(task) if registry is not None else None
    from jobq.submission import JobSpec

    # Raw values only: JobSpec.parse validates every one of them, the task's own retry policy
    # included (a copy of it made with updates would skip that check). What neither a flag nor a
    # task loaded with -A sets is left out, so the task's published declaration applies.
    retry: dict[str, Any] | None = local.retry.model_dump() if local is not None and local.retry is not None else None
    if max_retries is not None:
        retry = {**(retry or {}), "max_retries": max_retries}
    declared = {
        "priority": priority or (local.priority if local else None),
        "retry_policy": retry,
        "timeout_seconds": timeout_s if timeout_s is not None else (local.timeout_s if local else None),
    }
    spec = JobSpec.parse(
        {
            **{name: value for name, value in declared.items() if value is not None},
            "tenant_id": tenant_id,
            "job_id": job_id,
            "job_name": name,
            "schedule_type": kind,
            "cron_expression": cron,
            "timezone": timezone,
            "run_at": at,
            "delay_seconds": parse_duration(in_) if in_ else None,
            "target": {"type": "TASK", "task": task},
            "payload": {
                "args": _json_arg("--args", args_json, list),
                "kwargs": _json_arg("--kwargs", kwargs_json, dict),
            },
            "misfire_policy": misfire,
            "catchup_window_seconds": catchup_s,
            "overlap_policy": overlap,
            "jitter_seconds": jitter_s,
            "dst_gap": dst_gap,
            "dst_overlap": dst_overlap,
        },
        names=_FLAGS,
    )
    if dry_run:
        from jobq.cli.cron import dry_run_schedule

        dry_run_schedule(spec, load_settings(options), preview_count, as_json)
        return
    with deployment(load_settings(options)) as d:
        client = Client(d)
        known = None
        if registry is not None and task in registry.names():
            known = registry.names()  # loaded with -A: known here, whether or not a worker ran it yet
        submitted = client.submit(spec, idempotency_key=idempotency_key, known_tasks=known)
        view = client.get(submitted.job.key)
        now_ms = d.clock.now_ms()
    for warning in submitted.warnings:
        err_console.print(f"warning: {warning}")
    at_ms = view.job.schedule.at_ms
    if at and submitted.created and at_ms is not None and now_ms - at_ms >= 1000:
        late = _duration_text((now_ms - at_ms) / 1000)
        err_console.print(f"warning: --at is {late} in the past (within the catch-up window): it fires now")
    if as_json:
        print_json(job_resource(view))
        return
    verb = "scheduled" if submitted.created else "already scheduled (same Idempotency-Key)"
    console.print(f"{verb} {view.job.key}  {task}  {kind.value}  {view.job.priority.value}")
    for ms in view.next_fire_times[:5]:
        console.print(f"  next: {_iso(ms)}")


@click.command("tasks")
@json_option
@backend_options
def tasks(as_json: bool, **options: Any) -> None:
    """List the task catalogue: every task a worker has published, with the options a submission
    by name gets unless it sets them (priority and queue, retries, timeout) and its parameters."""
    with reader(load_settings(options)) as d:
        catalogue = Client(d).declared()
    rows = [task_resource(info) for _, info in sorted(catalogue.items())]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no tasks published yet: a worker publishes the tasks it serves when it starts")
        return
    out = new_table("task", "priority", "queue", "retries", "timeout", "parameters", "published by")
    for row in rows:
        retry = row["retry_policy"]
        out.add_row(
            row["name"],
            row["priority"],
            row["queue"],
            "-" if retry is None else str(retry["max_retries"]),
            "-" if row["timeout_seconds"] is None else f"{row['timeout_seconds']:g} s",
            ", ".join(row["parameters"]) or "-",
            f"{row['published_by']} at {row['published_at']}",
        )
    console.print(out)


@click.command()
@click.argument("job_id", required=False)
@tenant_option
@json_option
@backend_options
def status(job_id: str | None, tenant_id: str | None, as_json: bool, **options: Any) -> None:
    """Show a job: its status, schedule, current run (lease, fence, attempt), last run, last
    success, last error, and counts of runs by state. Without JOB_ID: the deployment at a glance
    (daemons alive, backlog, due runs, runs per state, dead letters, last errors), with a warning
    when delayed and cron jobs cannot run."""
    if job_id is None:
        from jobq.cli.observe import show_deployment

        show_deployment(as_json, options)
        return
    key = job_key(job_id, tenant_id)
    with reader(load_settings(options)) as d:
        client = Client(d)
        view = client.get(key)
        recent = client.runs(key, limit=_STATUS_RUNS).items
        outcome = client.outcomes([view.job]).get(view.job.key)
    resource = job_resource(view)
    last = next((r for r in recent if r.started_ms is not None or r.state.terminal), None)
    success = next((r for r in recent if r.state is RunState.SUCCEEDED), None)
    failed = next((r for r in recent if r.last_error), None)
    if as_json:
        print_json(resource)
        return
    table = Table(show_header=False, box=None)
    rows: list[tuple[str, Any]] = [
        ("job_id", resource["job_id"]),
        ("tenant_id", resource["tenant_id"]),
        ("job_name", resource["job_name"]),
        ("status", outcome or view.job.status.value),
        ("status_reason", resource.get("status_reason")),
        ("corrupt", resource.get("corrupt")),
        ("task", resource.get("task")),
        ("schedule_type", resource["schedule_type"]),
        ("cron_expression", resource.get("cron_expression")),
        (
            "cron_source",
            None if resource.get("cron_source") == resource.get("cron_expression") else resource["cron_source"],
        ),
        ("timezone", resource["timezone"]),
        ("priority", resource["priority"]),
    ]
    run = view.current_run
    if run is not None:
        rows.append(("current run", f"{run.run_id} {run.state.value} attempt {run.attempt} fence {run.fence}"))
    if run is not None and not run.state.terminal:
        rows.append(("lease", f"{run.lease_owner} until {_iso(run.lease_expires_ms)}" if run.lease_owner else None))
        rows.append(("last_heartbeat_at", resource.get("last_heartbeat_at")))
    rows += [
        (
            "last run",
            None if last is None else f"{last.run_id} {last.state.value} {_iso(last.finished_ms or last.nominal_ms)}",
        ),
        ("last success", None if success is None else f"{_iso(success.finished_ms)} ({success.run_id})"),
        ("last error", None if failed is None else f"{failed.last_error} ({failed.run_id})"),
        ("next_run_time", resource.get("next_run_time_iso")),
        ("created_at", resource.get("created_at")),
        ("runs", ", ".join(f"{k}={v}" for k, v in sorted(view.counts.items())) or "none yet"),
    ]
    if len(view.next_fire_times) > 1:
        rows.append(("next fires", ", ".join(_iso(ms) for ms in view.next_fire_times)))
    for name, value in rows:
        if value is not None:
            table.add_row(name, str(value))
    console.print(table)


_STATUS_RUNS = 100  # runs `jobq status` looks through for the last success and the last error


@click.command()
@click.argument("job_id")
@tenant_option
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@json_option
@backend_options
def runs(job_id: str, tenant_id: str | None, limit: int, as_json: bool, **options: Any) -> None:
    """List a job's runs, newest first."""
    key = job_key(job_id, tenant_id)
    with reader(load_settings(options)) as d:
        page = Client(d).runs(key, limit=limit)
    if as_json:
        print_json({"runs": [run_resource(r) for r in page.items], "next_cursor": page.next_cursor})
        return
    table = new_table("run_id", "state", "attempt", "fence", "nominal", "finished", "error")
    for r in page.items:
        table.add_row(
            r.run_id,
            r.state.value,
            str(r.attempt),
            str(r.fence),
            _iso(r.nominal_ms),
            _iso(r.finished_ms),
            clip(r.last_error, 60) if r.corrupt is None else clip(f"corrupt: {r.corrupt}", 60),
        )
    console.print(table)


@click.command()
@click.argument("job_id")
@tenant_option
@json_option
@backend_options
def history(job_id: str, tenant_id: str | None, as_json: bool, **options: Any) -> None:
    """Show every attempt's start and outcome for a job, oldest first."""
    key = job_key(job_id, tenant_id)
    with reader(load_settings(options), history=True) as d:
        events = Client(d).history(key)
    if as_json:
        print_json({"events": [event_resource(e) for e in events]})
        return
    table = new_table("at", "run_id", "attempt", "fence", "event", "worker", "ms", "error")
    for e in events:
        table.add_row(
            _iso(e.at_ms),
            e.run_id,
            str(e.attempt),
            str(e.fence),
            e.kind,
            e.worker or "",
            str(e.duration_ms or ""),
            clip(e.error, 60),
        )
    console.print(table)


def _action(name: str, verb: str, help_text: str) -> click.Command:
    @click.command(name=name, help=help_text)
    @click.argument("job_id")
    @tenant_option
    @json_option
    @backend_options
    def command(job_id: str, tenant_id: str | None, as_json: bool, **options: Any) -> None:
        key = job_key(job_id, tenant_id)
        target = _ENDS.get(name)
        with deployment(load_settings(options)) as d:
            client = Client(d)
            already = target is not None and client.job(key).status is target
            # Asking again for the state a job is in succeeds and says so. A cancel still runs: it
            # finishes what an interrupted cancel left (runs not yet ended).
            result = None if already and name != "cancel" else getattr(client, name)(key)
            view = client.get(key)
        if as_json:
            print_json(job_resource(view))
            return
        if already:
            console.print(f"{key} was already {verb if name != 'resume' else 'active'}: job {view.job.status.value}")
            return
        extra = f" as run {result.run_id}" if name == "trigger" and result is not None else ""
        console.print(f"{verb} {key}{extra}: job {view.job.status.value}")

    return command


_ENDS = {"cancel": JobStatus.CANCELLED, "pause": JobStatus.PAUSED, "resume": JobStatus.ACTIVE}
cancel = _action("cancel", "cancelled", "Cancel a job and its unfinished runs (a running task sees lease_lost).")
pause = _action("pause", "paused", "Stop creating runs; runs not yet started wait until resume.")
resume = _action("resume", "resumed", "Create runs again (recurring fires during the pause are skipped).")
trigger = _action("trigger", "triggered", "Run the job once now, outside its schedule.")


@click.group()
def dlq() -> None:
    """The dead-letter list: runs that failed their last attempt."""


@dlq.command(name="list")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--cursor", default=None)
@json_option
@backend_options
def dlq_list(limit: int, cursor: str | None, as_json: bool, **options: Any) -> None:
    """List dead-lettered runs, newest first."""
    with reader(load_settings(options)) as d:
        page = Client(d).dead_letters(cursor=cursor, limit=limit)
        tasks = _tasks_of(d, page.items)
    if as_json:
        runs = [{**run_resource(r), "task": tasks.get(r.run_id)} for r in page.items]
        print_json({"runs": runs, "next_cursor": page.next_cursor})
        return
    if not page.items:
        console.print("no dead letters")
        return
    table = new_table("run_id", "task", "attempt", "failed", "error")
    keep_whole(table, 0, [r.run_id for r in page.items])
    keep_whole(table, 1, [tasks.get(r.run_id) or "-" for r in page.items])
    for r in page.items:
        table.add_row(r.run_id, tasks.get(r.run_id) or "-", str(r.attempt), _iso(r.finished_ms), clip(r.last_error, 80))
    console.print(table)
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


@dlq.command(name="show")
@click.argument("run_id")
@json_option
@backend_options
def dlq_show(run_id: str, as_json: bool, **options: Any) -> None:
    """Show one dead-lettered run with its history."""
    with reader(load_settings(options), history=True) as d:
        client = Client(d)
        run = client.run(run_id)
        events = [e for e in client.history(run.job_key) if e.run_id == run_id]
    resource = {**run_resource(run), "history": [event_resource(e) for e in events]}
    if as_json:
        print_json(resource)
        return
    table = Table(show_header=False, box=None)
    for key, value in resource.items():
        if key != "history" and value is not None:
            table.add_row(key, str(value))
    console.print(table)
    for e in events:
        console.print(f"  {_iso(e.at_ms)} attempt {e.attempt} {e.kind} {e.error or ''}")


@dlq.command(name="redrive")
@click.argument("run_ids", nargs=-1)
@click.option("--all", "redrive_all", is_flag=True, help="Redrive every dead-lettered run.")
@click.option("--task", default=None, help="Redrive the dead-lettered runs of this task.")
@backend_options
def dlq_redrive(run_ids: tuple[str, ...], redrive_all: bool, task: str | None, **options: Any) -> None:
    """Schedule dead-lettered runs again now, each as its next attempt with a fresh attempt budget
    (its retry policy's max_retries + 1 attempts from there)."""
    if sum((bool(run_ids), redrive_all, task is not None)) != 1:
        fail("give RUN_IDs, --all or --task TASK")
    with deployment(load_settings(options)) as d:
        client = Client(d)
        if run_ids:
            targets = list(run_ids)
        else:
            dead = _all_dead_letters(client)
            tasks = _tasks_of(d, dead) if task is not None else {}
            targets = [r.run_id for r in dead if task is None or tasks.get(r.run_id) == task]
            if not targets:
                console.print("no dead letters" + (f" of task {task}" if task else "") + " to redrive")
                return
        for run_id in targets:
            run = client.redrive(run_id)
            budget = run.attempt_base + (client.job(run.job_key).retry.max_attempts)
            console.print(f"redriven {run.run_id} as attempt {run.attempt} (of up to {budget})")


@dlq.command(name="purge")
@click.argument("run_ids", nargs=-1)
@click.option("--all", "purge_all", is_flag=True, help="Purge every dead-lettered run.")
@backend_options
def dlq_purge(run_ids: tuple[str, ...], purge_all: bool, **options: Any) -> None:
    """Take runs off the dead-letter list (they stay FAILED in history)."""
    if bool(run_ids) == purge_all:
        fail("give RUN_IDs or --all")
    with deployment(load_settings(options)) as d:
        count = Client(d).purge(None if purge_all else list(run_ids))
    console.print(f"purged {count} run(s)")


@click.command()
@click.option(
    "--print",
    "print_format",
    is_flag=False,
    flag_value="cloudformation",
    default=None,
    type=click.Choice(["cloudformation", "terraform"]),
    help="Print the DynamoDB table as CloudFormation (default) or Terraform instead of creating it.",
)
@backend_options
def init(print_format: Literal["cloudformation", "terraform"] | None, **options: Any) -> None:
    """Create or upgrade the store's schema (PostgreSQL migrations; the DynamoDB table and indexes)."""
    from jobq.wiring import init_store, render_store_definition

    settings = load_settings(options)
    if print_format is not None:
        console.print(render_store_definition(settings, print_format), end="")
        return
    console.print(init_store(settings))


def _all_dead_letters(client: Client) -> list[Run]:
    found: list[Run] = []
    cursor = None
    while True:
        page = client.dead_letters(cursor=cursor, limit=500)
        found += page.items
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def _tasks_of(d: Deployment, runs: list[Run]) -> dict[str, str]:
    """The task (or webhook endpoint) of each run's job, by run id: one batch read of the jobs."""
    jobs = d.store.get_jobs(list({r.job_key for r in runs}))
    out = {}
    for r in runs:
        job = jobs.get(r.job_key)
        if job is not None:
            out[r.run_id] = job.target.task if isinstance(job.target, TaskTarget) else job.target.endpoint
    return out


def _duration_text(seconds: float) -> str:
    """`14 h 5 min`, `3 min 20 s`, `42 s`: rounded to what a person reads."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def _iso(ms: int | None) -> str:
    return iso(ms) or "-"
