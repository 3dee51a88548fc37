"""Validation at the edge: every public entry point refuses the same bad values, the same way,
and nothing reaches the store (issue 9, items 1 and 2).

A table of bad inputs by {CLI, `Task.schedule`, `Client.submit`, HTTP} on SQLite and on
PostgreSQL. Each bad input is a valid submission with one field made bad, and a control row
proves the valid one is accepted by every entry point, so a refusal is the bad field's doing.
Refusals are: exit code 2 with one line on stderr; `InvalidJob`; a 4xx with the JSON error
body. The store's jobs and runs are counted before and after every call.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from api.support import public_resolver, wait_for
from click.testing import CliRunner
from services import require_postgres

from jobq.api.app import create_app
from jobq.api.ratelimit import RateLimiter
from jobq.api.server import ApiServer, listen
from jobq.api.tokens import issue_token, tenant_store
from jobq.app import App, Task
from jobq.cli.main import cli
from jobq.client import Client
from jobq.deployment import Deployment
from jobq.errors import InvalidJob, JobNotFound
from jobq.models import RetryPolicy
from jobq.netpolicy import NetPolicy
from jobq.ports import JobQuery, RunQuery
from jobq.settings import Settings
from jobq.submission import JobSpec
from jobq.wiring import connect, init_store

REPO = Path(__file__).resolve().parent.parent

TASK = "t.echo"
VALID_HTTP: dict[str, Any] = {
    "schedule_type": "ONE_OFF",
    "delay_seconds": 30,  # within the horizon: an accepted job also writes its run
    "target": {"type": "TASK", "task": TASK},
    "payload": {"args": [], "kwargs": {}},
}
DEEP: Any = "leaf"
for _ in range(70):
    DEEP = [DEEP]


@dataclass(frozen=True)
class Bad:
    """One bad value as each entry point takes it (None: that entry point cannot express it)."""

    name: str
    http: dict[str, Any] | None  # fields replacing those of VALID_HTTP (None values are removed)
    python: dict[str, Any] | None  # Task.schedule keyword arguments
    cli: list[str] | None  # options after `jobq schedule t.echo` (which adds --in 30s unless timed)


ONE_OFF_AT = {"delay_seconds": None}
BAD = [
    Bad(
        "negative max_retries",
        {"retry_policy": {"max_retries": -1}},
        # an object changed with model_copy(update=...) skipped validation: it must be checked anyway
        {"delay_s": 30, "retry": RetryPolicy().model_copy(update={"max_retries": -1})},
        ["--max-retries", "-1"],
    ),
    Bad("run_at in year 33658", {**ONE_OFF_AT, "run_at": 10**15}, {"at": 10**15}, ["--at", "1000000000000000"]),
    Bad("run_at of 10**20 ms", {**ONE_OFF_AT, "run_at": 10**20}, {"at": 10**20}, ["--at", str(10**20)]),
    Bad("run_at before 1970", {**ONE_OFF_AT, "run_at": -1}, {"at": -1}, ["--at", "-1"]),
    Bad(
        "an ISO run_at past year 9999",
        {**ONE_OFF_AT, "run_at": "9999-12-31T23:00:00-05:00"},
        {"at": "9999-12-31T23:00:00-05:00"},
        ["--at", "9999-12-31T23:00:00-05:00"],
    ),
    Bad("negative delay", {"delay_seconds": -1}, {"delay_s": -1}, ["--in", "-1"]),
    Bad("NaN delay", {"delay_seconds": math.nan}, {"delay_s": math.nan}, ["--in", "nan"]),
    Bad("infinite delay", {"delay_seconds": math.inf}, {"delay_s": math.inf}, ["--in", "9" * 400]),
    Bad(
        "a lone surrogate in a payload value",
        {"payload": {"args": ["\ud800"]}},
        {"delay_s": 30, "args": ["\ud800"]},
        ["--args", '["\\ud800"]'],
    ),
    Bad(
        "a NUL in a payload value",
        {"payload": {"kwargs": {"text": "a\x00b"}}},
        {"delay_s": 30, "kwargs": {"text": "a\x00b"}},
        ["--kwargs", '{"text": "a\\u0000b"}'],
    ),
    Bad(
        "a NUL in a payload key",
        {"payload": {"kwargs": {"te\x00xt": "a"}}},
        {"delay_s": 30, "kwargs": {"te\x00xt": "a"}},
        ["--kwargs", '{"te\\u0000xt": "a"}'],
    ),
    Bad(
        "a NaN in the payload",
        {"payload": {"args": [math.nan]}},
        {"delay_s": 30, "args": [math.nan]},
        ["--args", "[NaN]"],
    ),
    Bad(
        "a payload nested 70 deep",
        {"payload": {"args": [DEEP]}},
        {"delay_s": 30, "args": [DEEP]},
        ["--args", json.dumps([DEEP])],
    ),
    Bad(
        "a NUL in job_name",
        {"job_name": "bill\x00ing"},
        {"delay_s": 30, "name": "bill\x00ing"},
        ["--name", "bill\x00ing"],
    ),
    Bad(
        "a lone surrogate in job_name",
        {"job_name": "bill\udcffing"},
        {"delay_s": 30, "name": "bill\udcffing"},
        ["--name", "bill\udcffing"],
    ),
    Bad("a NUL in the timezone", {"timezone": "UTC\x00"}, {"delay_s": 30, "tz": "UTC\x00"}, ["--tz", "UTC\x00"]),
    Bad(
        "a NUL in the cron expression",
        {**ONE_OFF_AT, "schedule_type": "CRON", "cron_expression": "* * * * *\x00"},
        {"cron": "* * * * *\x00"},
        ["--cron", "* * * * *\x00"],
    ),
    Bad(
        "a negative catch-up window",
        {"catchup_window_seconds": -1},
        {"delay_s": 30, "catchup_window_s": -1},
        ["--catchup", "-1"],
    ),
    Bad("a NaN timeout", {"timeout_seconds": math.nan}, None, ["--timeout", "nan"]),
    Bad("an infinite max_age_sec", {"retry_policy": {"max_age_sec": math.inf}}, None, None),
    Bad(
        "a NUL in the idempotency key",
        None,
        {"delay_s": 30, "idempotency_key": "key\x00"},
        ["--idempotency-key", "key\x00"],
    ),
]


@dataclass
class Edge:
    """One deployment with every entry point pointed at it."""

    d: Deployment
    task: Task[..., Any]
    cli_env: dict[str, str]
    http: httpx.Client

    def footprint(self) -> tuple[int, int]:
        """How many jobs and runs the store holds, across tenants."""
        return len(self.d.store.list_jobs(JobQuery(limit=1000)).items), len(
            self.d.store.list_runs(RunQuery(limit=1000)).items
        )


def _urls(kind: str, tmp_path: Path) -> tuple[dict[str, str], Callable[[], None]]:
    if kind == "sqlite":
        return {"store": f"sqlite:///{tmp_path / 'jobq.db'}"}, lambda: None
    pg = require_postgres()
    schema = f"t{uuid.uuid4().hex[:10]}"

    def drop() -> None:
        import psycopg

        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return {"store": f"{pg}?schema={schema}", "broker": "memory://"}, drop


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def edge(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    urls, drop = _urls(request.param, tmp_path_factory.mktemp("edge"))
    settings = Settings.load({**urls, "history_flush_s": 0}, env={})
    init_store(settings)
    d = connect(settings)
    app = App()
    app.use(d)
    task = app.task(name=TASK)(lambda *args, **kwargs: None)
    d.store.register_worker("w-edge", [TASK], ["default"], d.clock.now_ms())  # as a running worker would
    policy = NetPolicy(resolver=public_resolver)
    server = ApiServer(d, create_app(d, policy=policy, limiter=RateLimiter(1e6, 10**6)), sock=listen("127.0.0.1", 0))
    thread, stop = server.start_thread()
    wait_for(lambda: server.started, 10, "the API to start")
    token = issue_token(tenant_store(d), "acme", d.clock.now_ms())[1]
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10, trust_env=False)
    env = {f"JOBQ_{role.upper()}": url for role, url in urls.items()}
    try:
        yield Edge(d, task, env, http)
    finally:
        http.close()
        stop.set()
        thread.join(15)
        d.close()
        with contextlib.suppress(Exception):
            drop()


def _http_body(bad: Bad) -> dict[str, Any]:
    assert bad.http is not None
    body = {**VALID_HTTP, **bad.http}
    return {k: v for k, v in body.items() if v is not None}


def _cli_args(bad: Bad) -> list[str]:
    assert bad.cli is not None
    timed = any(flag in bad.cli for flag in ("--at", "--in", "--cron"))
    return ["schedule", TASK, *bad.cli, *([] if timed else ["--in", "30s"])]


def refused_by_cli(edge: Edge, bad: Bad) -> None:
    result = CliRunner().invoke(cli, _cli_args(bad), env=edge.cli_env, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


def refused_by_task_schedule(edge: Edge, bad: Bad) -> None:
    assert bad.python is not None
    with pytest.raises(InvalidJob):
        edge.task.schedule(**bad.python)


def refused_by_client_submit(edge: Edge, bad: Bad) -> None:
    with pytest.raises(InvalidJob):
        Client(edge.d).submit(_http_body(bad))


def refused_by_http(edge: Edge, bad: Bad) -> None:
    # json.dumps writes NaN and Infinity, which Python's JSON parser (and so the API) accepts
    r = edge.http.post("/v1/jobs", content=json.dumps(_http_body(bad)), headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert error["code"] and error["message"] and error["request_id"]


ENTRY_POINTS: dict[str, tuple[Callable[[Edge, Bad], None], str]] = {
    "cli": (refused_by_cli, "cli"),
    "Task.schedule": (refused_by_task_schedule, "python"),
    "Client.submit": (refused_by_client_submit, "http"),
    "http": (refused_by_http, "http"),
}


# Every (bad value, entry point) pair the entry point can express.
CASES = [
    pytest.param(bad, entry, id=f"{bad.name}-{entry}")
    for bad in BAD
    for entry, (_, form) in ENTRY_POINTS.items()
    if getattr(bad, form) is not None
]


@pytest.mark.parametrize(("bad", "entry"), CASES)
def test_every_entry_point_refuses_a_bad_value_and_writes_nothing(edge: Edge, bad: Bad, entry: str) -> None:
    refuse, _ = ENTRY_POINTS[entry]
    before = edge.footprint()
    refuse(edge, bad)
    assert edge.footprint() == before


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_the_valid_submission_the_bad_ones_start_from_is_accepted_by_every_entry_point(edge: Edge, entry: str) -> None:
    jobs, runs = edge.footprint()
    if entry == "cli":
        result = CliRunner().invoke(cli, ["schedule", TASK, "--in", "30s"], env=edge.cli_env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    elif entry == "Task.schedule":
        edge.task.schedule(delay_s=30)
    elif entry == "Client.submit":
        Client(edge.d).submit(VALID_HTTP)
    else:
        assert edge.http.post("/v1/jobs", json=VALID_HTTP).status_code == 201
    assert edge.footprint() == (jobs + 1, runs + 1)


def test_a_spec_changed_with_model_copy_after_parsing_is_validated_again_by_submit(edge: Edge) -> None:
    spec = JobSpec.parse(VALID_HTTP)
    changed = spec.model_copy(update={"payload": {"args": ["a\x00b"]}})  # pydantic does not validate this
    before = edge.footprint()
    with pytest.raises(InvalidJob, match="NUL"):
        Client(edge.d).submit(changed)
    with pytest.raises(InvalidJob, match=r"specs\[1\]"):
        Client(edge.d).submit_many([spec, changed])
    assert edge.footprint() == before


@pytest.mark.parametrize("text", ["bill\x00", "bill\ud800"], ids=["NUL", "lone surrogate"])
def test_a_list_filter_no_store_can_compare_is_refused_by_every_entry_point(edge: Edge, text: str) -> None:
    with pytest.raises(InvalidJob):
        Client(edge.d).list(JobQuery(name_prefix=text))
    with pytest.raises(InvalidJob):
        Client(edge.d).dead_letters(cursor=text)
    for option in ("--name", "--cursor"):
        result = CliRunner().invoke(cli, ["list", option, text], env=edge.cli_env, catch_exceptions=False)
        assert result.exit_code == 2 and result.output.startswith(f"error: {option} "), result.output
    if text.isascii():  # an HTTP query string carries bytes: a lone surrogate cannot be sent
        for parameter in ("job_name_prefix", "cursor"):
            r = edge.http.get("/v1/jobs", params={parameter: text})
            assert r.status_code == 422, r.text
            assert r.json()["error"]["field"] == parameter


def test_a_job_id_that_cannot_exist_is_not_found_without_asking_the_store(edge: Edge) -> None:
    for job_id in ("job\x00", "job\udcff"):
        with pytest.raises(JobNotFound):
            Client(edge.d).get(job_id)
        result = CliRunner().invoke(cli, ["status", job_id], env=edge.cli_env, catch_exceptions=False)
        assert result.exit_code == 2 and "no job" in result.output


def test_the_edge_never_copies_a_model_with_unvalidated_updates() -> None:
    """`model_copy(update=...)` skips validation: input is rebuilt through `JobSpec.parse` instead."""
    edge_sources = [
        *(REPO / "cli").glob("*.py"),
        *(REPO / "scheduler" / "api").glob("*.py"),
        REPO / "scheduler" / "app.py",
    ]
    offenders = [p.name for p in edge_sources if "model_copy(update" in p.read_text()]
    assert offenders == []
