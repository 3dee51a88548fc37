"""The `jobq` command.

Subcommands are imported when they run (or when their own --help is asked for): `jobq --help`
and a read-only command load only what they use. Each entry names the module, the click
command in it and its one-line summary for the listing (tests/test_cli_startup.py checks that
each summary begins its command's own help)."""

from __future__ import annotations

import importlib

import click

from jobq import __version__
from jobq.cli.common import JobqGroup

#: name -> (module, attribute, summary)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "dev": (
        "jobq.cli.daemons",
        "dev",
        "Run every role in one process (beat, scanner, worker, reaper, and the HTTP API) on the embedded SQLite store.",
    ),
    "worker": ("jobq.cli.daemons", "worker", "Run tasks from the given queues in strict priority order."),
    "scanner": ("jobq.cli.daemons", "scanner", "Claim due runs (CRITICAL first) and dispatch them to the queues."),
    "reaper": (
        "jobq.cli.daemons",
        "reaper",
        "Take back runs whose lease expired (fence+1) and retry or dead-letter them.",
    ),
    "beat": ("jobq.cli.daemons", "beat", "Create the runs of due schedules within the horizon; repair the time index."),
    "schedule": (
        "jobq.cli.jobs",
        "schedule",
        "Schedule TASK once (--at, --in), on a cron (--cron, --tz), or now (--now).",
    ),
    "cron": (
        "jobq.cli.cron",
        "cron",
        "Show EXPRESSION's next fires in local time and UTC, marking those a DST rule moved or skipped.",
    ),
    "status": (
        "jobq.cli.jobs",
        "status",
        "Show a job: its status, schedule, current run (lease, fence, attempt), last run, last success,",
    ),
    "workers": (
        "jobq.cli.observe",
        "workers",
        "Every live daemon (from the daemon registry): what each worker runs now, its slots busy,",
    ),
    "top": (
        "jobq.cli.observe",
        "top",
        "A live full-screen view: throughput and start lateness per tier, backlog, due runs, dead-letter",
    ),
    "tasks": (
        "jobq.cli.jobs",
        "tasks",
        "List the task catalogue: every task a worker has published, with the options a submission by name",
    ),
    "list": (
        "jobq.cli.listing",
        "list_jobs",
        "List jobs, newest first, filtered by status, task, name prefix or priority.",
    ),
    "runs": ("jobq.cli.jobs", "runs", "List a job's runs, newest first."),
    "result": ("jobq.cli.results", "result", "Print a run's result: the task's return value as JSON (exit 0), or why"),
    "history": ("jobq.cli.jobs", "history", "Show every attempt's start and outcome for a job, oldest first."),
    "cancel": ("jobq.cli.jobs", "cancel", "Cancel a job and its unfinished runs (a running task sees lease_lost)."),
    "pause": ("jobq.cli.jobs", "pause", "Stop creating runs; runs not yet started wait until resume."),
    "resume": ("jobq.cli.jobs", "resume", "Create runs again (recurring fires during the pause are skipped)."),
    "trigger": ("jobq.cli.jobs", "trigger", "Run the job once now, outside its schedule."),
    "dlq": ("jobq.cli.jobs", "dlq", "The dead-letter list: runs that failed their last attempt."),
    "init": (
        "jobq.cli.jobs",
        "init",
        "Create or upgrade the store's schema (PostgreSQL migrations; the DynamoDB table and indexes).",
    ),
    "api": (
        "jobq.cli.api",
        "api",
        "Serve the HTTP API (/v1/jobs, /v1/dlq, /healthz, /readyz, /metrics, /openapi.json).",
    ),
    "tokens": ("jobq.cli.api", "tokens", "Create, list and revoke HTTP API tokens (each belongs to one tenant)."),
    "bench": (
        "jobq.cli.bench",
        "bench",
        "Run benchmark workloads against the configured deployment (keep it otherwise idle: the bench",
    ),
}


class LazyGroup(JobqGroup):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return self.commands.get(cmd_name)
        module, attribute, _summary = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing from the summaries, importing nothing."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            summary = COMMANDS[name][2] if name in COMMANDS else self.commands[name].get_short_help_str(limit)
            rows.append((name, _shorten(summary, limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _shorten(text: str, limit: int) -> str:
    """As click shortens a command's help for the listing: whole words, then `...`."""
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 3, 1)]
    return (cut[: cut.rfind(" ")] if " " in cut else cut).rstrip(" ,;:") + "..."


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="jobq")
def cli() -> None:
    """jobq: delayed, cron and instant jobs with leases, fences, retries and a dead-letter queue.

    Backends come from --store/--index/--broker/--history or JOBQ_STORE, JOBQ_INDEX, JOBQ_BROKER,
    JOBQ_HISTORY; the default is one SQLite file, ./jobq.db.
    """
