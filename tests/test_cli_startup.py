"""`jobq` starts fast: the help and the read-only commands import only what they use (the HTTP API,
the optional backends and the other commands' modules stay unloaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from jobq.cli.main import COMMANDS, cli

# What a command that does not serve HTTP or talk to another backend must never load.
API_AND_BACKENDS = {"fastapi", "starlette", "uvicorn", "httpx", "kombu", "redis", "boto3", "botocore", "psycopg"}
PROBE = """
import json, sys
from jobq.cli.main import cli
try:
    cli(sys.argv[1:], prog_name="jobq")
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if "." not in m or m.startswith("jobq."))), file=sys.stderr)
"""


def _loaded(tmp_path: Path, *args: str) -> set[str]:
    env = {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    return set(json.loads(result.stderr.strip().splitlines()[-1]))


def test_jobq_help_loads_no_pydantic_no_client_and_no_subcommand_module(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, "--help")
    heavy = {"pydantic", "croniter", "jobq.client", "jobq.models", "jobq.wiring", "jobq.cli.jobs", "jobq.cli.daemons"}
    assert loaded & (heavy | API_AND_BACKENDS) == set()


def test_jobq_list_on_sqlite_loads_neither_the_api_nor_another_backend_nor_the_scheduling_code(tmp_path: Path) -> None:
    from jobq.settings import Settings
    from jobq.wiring import init_store

    init_store(Settings.load({"store": f"sqlite:///{tmp_path / 'jobq.db'}"}, env={}))
    loaded = _loaded(tmp_path, "list")
    assert "jobq.cli.listing" in loaded  # it did run
    unused = {"jobq.cli.daemons", "jobq.cli.api", "jobq.cronpreview", "jobq.api", "jobq.submission", "croniter"}
    assert loaded & (API_AND_BACKENDS | unused) == set()


def test_jobq_list_on_sqlite_reads_the_file_without_pydantic_settings_models_or_the_store_backend(
    tmp_path: Path,
) -> None:
    """The read path of the embedded default decodes rows to light objects (jobq.joblist): the
    pydantic models, the settings model, the client and the store backend stay unloaded, also
    with jobs to show and a filter."""
    from factories import make_job

    from jobq.settings import Settings
    from jobq.wiring import connect

    d = connect(Settings.load({"store": f"sqlite:///{tmp_path / 'jobq.db'}"}, env={}))
    try:
        d.store.create_job(make_job("nightly"), [])
    finally:
        d.close()
    heavy = {
        "pydantic",
        "pydantic_core",
        "jobq.models",
        "jobq.settings",
        "jobq.ports",
        "jobq.records",
        "jobq.client",
        "jobq.wiring",
        "jobq.deployment",
        "jobq.store.sqlite",
        "jobq.cli.jobs",
    }
    for args in (["list"], ["list", "--json", "--status", "failed", "--task", "t.echo"]):
        loaded = _loaded(tmp_path, *args)
        assert "jobq.store.sqlite_listing" in loaded  # it read the file itself
        assert loaded & heavy == set(), args


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_listed_summary_begins_its_commands_own_help(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    assert command.get_short_help_str(limit=10**6).startswith(COMMANDS[name][2])


def test_the_preview_limit_of_jobq_schedule_is_the_previews_own() -> None:
    from jobq.cli.jobs import PREVIEW_MAX_FIRES
    from jobq.cronpreview import MAX_FIRES

    assert PREVIEW_MAX_FIRES == MAX_FIRES
