"""`jobq result RUN_ID`: a run's return value, or why there is none, told by the exit code.

Exit codes: 0 the run succeeded (its value printed as JSON); 1 it failed (the final error on
stderr); 2 bad input or no such run; 3 it was cancelled; 4 it succeeded but its result is gone
(expired after `result_ttl_s`) or was never kept (not JSON, or over 64 KiB); 5 it has not finished
(after `--wait` seconds, if given).
"""

from __future__ import annotations

import json
from typing import Any

import click

from jobq.cli.common import backend_options, err_console, json_option, load_settings, print_json, reader
from jobq.client import Client
from jobq.errors import ResultTimeout
from jobq.results import ResultState, RunResult
from jobq.views import run_resource

EXIT_CODES = {
    ResultState.SUCCEEDED: 0,
    ResultState.FAILED: 1,
    ResultState.CANCELLED: 3,
    ResultState.EXPIRED: 4,
    ResultState.NOT_KEPT: 4,
    ResultState.PENDING: 5,
}


@click.command()
@click.argument("run_id")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=0,
    metavar="SECONDS",
    help="Wait up to SECONDS for the run to finish [0: answer now].",
)
@json_option
@backend_options
def result(run_id: str, wait_s: float, as_json: bool, **options: Any) -> None:
    """Print a run's result: the task's return value as JSON (exit 0), or why there is none: failed
    (1), cancelled (3), expired or not kept (4), not finished yet (5). RUN_ID is `JOB_ID:FIRE_MS`
    as `jobq runs` and `jobq status` show it (led by `TENANT/` for tenants other than `default`)."""
    with reader(load_settings(options)) as d:
        client = Client(d)
        try:
            found = client.wait_result(run_id, timeout_s=wait_s) if wait_s else client.run_result(run_id)
        except ResultTimeout:
            found = client.run_result(run_id)
        run = client.run(run_id)
    if as_json:
        print_json({**run_resource(run), **found.as_json()})
    else:
        _show(found, run.state.value)
    raise SystemExit(EXIT_CODES[found.state])


def _show(found: RunResult, state: str) -> None:
    if found.state is ResultState.SUCCEEDED:
        click.echo(json.dumps(found.value))
        return
    if found.state is ResultState.FAILED:
        message = f"failed: {found.error_type}: {found.error}"
        if found.dead_letter:
            message += " (on the dead-letter list)"
    elif found.state is ResultState.CANCELLED:
        message = f"cancelled: {found.error or 'by request'}"
    elif found.state is ResultState.EXPIRED:
        message = "expired: the result was kept for result_ttl_s after the run finished, and is gone"
    elif found.state is ResultState.NOT_KEPT:
        message = f"not kept: {found.error}"
    else:
        message = f"not finished: the run is {state}"
    err_console.print(message, soft_wrap=True)
