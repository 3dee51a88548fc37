"""`jobq` starts fast: the help and the read-only commands import only what they use (the HTTP API,
the optional backends and the other commands' modules stay unloaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- `jobq list` prints without rich: the same table, the same rows -------------------------------

LIST_PROBE_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


@pytest.fixture
def listed_store(tmp_path: Path) -> dict[str, str]:
    """Three jobs, created in the order one-off, nightly, paused (newest last), of two tasks."""
    from factories import T0, make_job

    from jobq.models import JobStatus, TaskTarget
    from jobq.settings import Settings
    from jobq.wiring import connect

    d = connect(Settings.load({"store": f"sqlite:///{tmp_path / 'jobq.db'}"}, env={}))
    try:
        d.store.create_job(make_job("one-off", name="report.daily", created_ms=T0), [])
        d.store.create_job(make_job("nightly", name="cleanup", created_ms=T0 + 1), [])
        paused = make_job("paused", name="report.weekly", created_ms=T0 + 2, status=JobStatus.PAUSED)
        d.store.create_job(paused.model_copy(update={"target": TaskTarget(task="t.other")}), [])
    finally:
        d.close()
    return {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}", **LIST_PROBE_ENV}


def _probe(env: dict[str, str], *args: str) -> tuple[str, set[str]]:
    """What `jobq ARGS` prints to a pipe, and the modules it loaded."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    return result.stdout, set(json.loads(result.stderr.strip().splitlines()[-1]))


def _as_rich_draws(job_ids: list[str], names: list[str], statuses: list[str]) -> str:
    """The table as rich drew it for `jobq list` before (the piped console: 240 columns)."""
    import io

    from factories import T0
    from rich.console import Console

    from jobq.cli.common import table
    from jobq.instants import to_iso

    created = {"one-off": T0, "nightly": T0 + 1, "paused": T0 + 2}
    t = table("job_id", "tenant", "name", "status", "type", "schedule", "priority", "created")
    for job_id, name, status in zip(job_ids, names, statuses, strict=True):
        t.add_row(job_id, "default", name, status, "ONE_OFF", to_iso(T0), "DEFAULT", to_iso(created[job_id]))
    out = io.StringIO()
    Console(file=out, width=240, highlight=False, markup=False).print(t)
    return out.getvalue()


def test_jobq_list_and_help_print_without_loading_rich(listed_store: dict[str, str]) -> None:
    """rich (~30 ms of imports) loads only for what needs it: not `jobq --help`, and not `jobq list`,
    whose table jobq.cli.plaintable draws."""
    for args in (["--help"], ["list"], ["list", "--status", "paused", "--task", "t.other"], ["list", "--help"]):
        out, loaded = _probe(listed_store, *args)
        assert out, args
        assert "rich" not in loaded, args


def test_jobq_list_without_rich_prints_the_table_rich_printed_newest_first(listed_store: dict[str, str]) -> None:
    out, _ = _probe(listed_store, "list")
    statuses = ["PAUSED", "ACTIVE", "ACTIVE"]
    assert out == _as_rich_draws(
        ["paused", "nightly", "one-off"], ["report.weekly", "cleanup", "report.daily"], statuses
    )


@pytest.mark.parametrize(
    ("args", "job_ids"),
    [
        (["--task", "tests.noop"], ["nightly", "one-off"]),
        (["--name", "report."], ["paused", "one-off"]),
        (["--status", "paused"], ["paused"]),
        (["--limit", "1"], ["paused"]),
    ],
    ids=" ".join,
)
def test_jobq_list_without_rich_prints_only_the_matching_jobs(
    listed_store: dict[str, str], args: list[str], job_ids: list[str]
) -> None:
    out, _ = _probe(listed_store, "list", *args)
    rows = [line.split("│")[1:-1] for line in out.splitlines() if line.startswith("│")]
    assert [cells[0].strip() for cells in rows] == job_ids
    header = next(line for line in out.splitlines() if line.startswith("┃"))
    assert header.split() == ["┃", *" ┃ ".join(COLUMNS_SHOWN).split(), "┃"]


COLUMNS_SHOWN = ["job_id", "tenant", "name", "status", "type", "schedule", "priority", "created"]


def test_jobq_list_in_a_terminal_too_narrow_for_the_table_keeps_job_ids_whole_without_rich(
    listed_store: dict[str, str],
) -> None:
    """An 80-column terminal: the other columns narrow and wrap, each job id stays on one line
    (ids are copied with a double click), and rich stays unloaded; a terminal wide enough for the
    table gets it unwrapped with a bold header."""
    long_id = "job_01m8s6kt1g1a49g6z2kz37repj"
    from factories import make_job

    from jobq.settings import Settings
    from jobq.wiring import connect

    d = connect(Settings.load({"store": listed_store["JOBQ_STORE"]}, env={}))
    try:
        d.store.create_job(make_job(long_id, name="a.rather.long.task.name.for.the.listing"), [])
    finally:
        d.close()
    narrow, loaded = _in_a_terminal({**listed_store, "COLUMNS": "80", "TERM": "xterm"}, "list")
    assert "rich" not in loaded
    assert {len(_visible(line)) for line in narrow.splitlines()} == {80}
    assert any(f"│ {long_id} │" in line for line in narrow.splitlines()), narrow
    assert "a.rather.long.task.name.for.the.listing" not in narrow  # it wrapped, within its column
    wide, loaded = _in_a_terminal({**listed_store, "COLUMNS": "200", "TERM": "xterm"}, "list")
    assert "rich" not in loaded
    assert "\x1b[1m job_id" in wide and any(long_id in line for line in wide.splitlines())
    assert "a.rather.long.task.name.for.the.listing" in wide


def _in_a_terminal(env: dict[str, str], *args: str) -> tuple[str, set[str]]:
    """What `jobq ARGS` prints to a terminal (a pseudo-terminal: stdout is a TTY), and the modules
    it loaded."""
    import os
    import pty

    leader, follower = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-c", PROBE, *args], env=env, stdout=follower, stderr=subprocess.PIPE, text=True
    ) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return b"".join(chunks).decode().replace("\r\n", "\n"), set(json.loads(err.strip().splitlines()[-1]))


def _visible(line: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", line)


# -- the plain drawing is rich's drawing ------------------------------------------------------------

TABLES = [
    (("a", "bb"), [("x", "y"), ("", "zzzz")]),
    (("job_id", "name"), [("job_1", "two  spaces"), ("job_22", " leading"), ("job_3", "trailing ")]),
    (("h",), [("[api] is not markup",), ("-",)]),
]


@pytest.mark.parametrize(("headers", "rows"), TABLES)
def test_the_plain_table_is_drawn_as_rich_draws_it(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    import io

    from rich.console import Console

    from jobq.cli.common import table
    from jobq.cli.plaintable import draw

    natural = sum(max(len(c) for c in column) for column in zip(headers, *rows, strict=True)) + 3 * len(headers) + 1
    for width in (natural, natural + 1, 240):
        t = table(*headers)
        for row in rows:
            t.add_row(*row)
        out = io.StringIO()
        Console(file=out, width=width, highlight=False, markup=False).print(t)
        assert draw(headers, rows, width=width, bold=False) == out.getvalue()
    narrower = draw(headers, rows, width=natural - 1, bold=False)  # a column wraps, as in rich
    assert narrower is not None and {len(line) for line in narrower.splitlines()} == {natural - 1}


def test_the_plain_table_bolds_only_the_header_and_leaves_other_text_to_rich() -> None:
    from jobq.cli.plaintable import draw

    bold = draw(("a", "b"), [("x", "y")], width=80, bold=True)
    assert bold is not None
    assert _visible(bold) == draw(("a", "b"), [("x", "y")], width=80, bold=False)
    assert bold.splitlines()[1] == "┃\x1b[1m a \x1b[0m┃\x1b[1m b \x1b[0m┃"
    for cell in ("café", "名前", "tab\there", "new\nline", "\x1b[31mred"):
        assert draw(("a",), [(cell,)], width=80, bold=False) is None  # rich measures and escapes these


_PRINTABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    row=st.lists(_PRINTABLE, min_size=1, max_size=6),
    whole=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=30),
    width=st.integers(min_value=20, max_value=160),
)
def test_a_plain_table_narrower_than_its_text_fits_the_console_keeps_the_id_whole_and_loses_no_text(
    row: list[str], whole: str, width: int
) -> None:
    from jobq.cli.plaintable import draw

    headers = ("job_id", *(f"h{i}" for i in range(len(row))))
    drawn = draw(headers, [(whole, *row)], width=width, bold=False, whole=0)
    if drawn is None:  # too narrow for the id and one character of every other column
        assert max(len(whole), len("job_id")) + len(row) + 3 * len(headers) + 1 > width
        return
    lines = drawn.splitlines()
    assert {len(line) for line in lines} == {len(lines[0])} and len(lines[0]) <= width
    body = [line.split("│")[1:-1] for line in lines if line.startswith("│")]
    assert body[0][0].strip() == whole  # the id, whole, on the row's first line
    for column, text in enumerate((whole, *row)):
        assert "".join(cells[column] for cells in body).replace(" ", "") == text.replace(" ", "")
