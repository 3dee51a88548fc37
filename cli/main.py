"""The `jobq` command."""

from __future__ import annotations

import click

from jobq import __version__
from jobq.cli import api, bench, cron, daemons, jobs, results
from jobq.cli.common import JobqGroup


@click.group(cls=JobqGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="jobq")
def cli() -> None:
    """jobq: delayed, cron and instant jobs with leases, fences, retries and a dead-letter queue.

    Backends come from --store/--index/--broker/--history or JOBQ_STORE, JOBQ_INDEX, JOBQ_BROKER,
    JOBQ_HISTORY; the default is one SQLite file, ./jobq.db.
    """


for command in (
    daemons.dev,
    daemons.worker,
    daemons.scanner,
    daemons.reaper,
    daemons.beat,
    jobs.schedule,
    cron.cron,
    jobs.status,
    jobs.tasks,
    jobs.list_jobs,
    jobs.runs,
    results.result,
    jobs.history,
    jobs.cancel,
    jobs.pause,
    jobs.resume,
    jobs.trigger,
    jobs.dlq,
    jobs.init,
    api.api,
    api.tokens,
    bench.bench,
):
    cli.add_command(command)
