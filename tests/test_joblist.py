"""The light read path of `jobq list` (jobq.joblist, jobq.store.sqlite_listing) agrees with the
models: it vouches only for documents `Job` accepts, shows them as the full path does, and hands
every other case to the full path."""

from __future__ import annotations

import ast
import copy
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from factories import T0, make_job, make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobq import joblist
from jobq.cli.main import cli
from jobq.models import (
    DstGap,
    DstOverlap,
    Job,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    Priority,
    RetryPolicy,
    RunState,
    Schedule,
    ScheduleType,
    TaskTarget,
    WebhookTarget,
)
from jobq.settings import Settings
from jobq.store import sqlite_listing
from jobq.wiring import connect


def test_the_light_decoder_knows_every_enum_value_of_the_models() -> None:
    assert {p.value: p.rank for p in Priority} == joblist.PRIORITY_RANKS
    assert set(joblist.JOB_STATUSES) == {s.value for s in JobStatus}
    assert set(joblist.SCHEDULE_TYPES) == {s.value for s in ScheduleType}
    assert set(joblist.MISFIRE_POLICIES) == {m.value for m in MisfirePolicy}
    assert set(joblist.OVERLAP_POLICIES) == {o.value for o in OverlapPolicy}
    assert set(joblist.DST_GAPS) == {g.value for g in DstGap}
    assert set(joblist.DST_OVERLAPS) == {o.value for o in DstOverlap}
    assert {s.value for s in RunState} == sqlite_listing._RUN_STATES
    assert Job.model_fields["tenant_id"].default == joblist.DEFAULT_TENANT
    assert Settings().store_url == "sqlite:///jobq.db"  # the fast path's default (jobq.cli.listing)


def test_the_light_decoder_checks_every_stored_field_of_a_job() -> None:
    """A field added to a model must be added to the decoder (or it would call new documents unsure)."""
    stored = set(Job.model_fields) - {"corrupt"}
    assert set(joblist._JOB_CHECKS) == stored
    assert set(joblist._JOB_REQUIRED) == {n for n, f in Job.model_fields.items() if f.is_required()}
    sample = json.loads(make_job("j", retry=RetryPolicy(max_age_sec=5.0)).model_dump_json())
    assert set(sample["schedule"]) == set(Schedule.model_fields)
    assert set(sample["retry"]) == set(RetryPolicy.model_fields)
    assert set(sample["target"]) == set(TaskTarget.model_fields)
    webhook = json.loads(WebhookTarget(endpoint="https://example.com/x").model_dump_json())
    assert joblist._target(webhook)["endpoint"] == "https://example.com/x"


def _jobs() -> list[Job]:
    return [
        make_job("one-off"),
        make_job(
            "nightly",
            tenant_id="acme",
            name="report.nightly",
            priority=Priority.HIGH,
            schedule=Schedule(type=ScheduleType.CRON, cron="0 2 * * *", cron_source="@daily", timezone="Europe/Paris"),
            status=JobStatus.PAUSED,
            status_reason="paused by ops",
        ),
        make_job(
            "hook",
            target=WebhookTarget(endpoint="https://example.com/x", headers={"Authorization": "secret"}),
            trace="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
    ]


@pytest.mark.parametrize("job", _jobs(), ids=lambda j: j.job_id)
def test_a_stored_job_decodes_to_the_row_the_full_path_shows(job: Job) -> None:
    row = joblist.row_from_doc(job.model_dump_json())
    assert row == joblist.JobRow.from_job(job)


# Values a stored document may hold by accident: each must either be refused by the light decoder
# or be one the models accept (hypothesis looks for a counterexample).
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "x", "ACTIVE", "CRON", "TASK", "HTTP_WEBHOOK", "skip", "\x00", "0 2 * * *", "1.5", "3"]),
    st.lists(st.sampled_from(["a", 1, None]), max_size=2),
    st.dictionaries(st.sampled_from(["type", "task", "x"]), st.sampled_from(["TASK", "t", 1]), max_size=2),
)
PATHS = [
    *(
        (name,)
        for name in json.loads(_jobs()[0].model_dump_json())
        if name not in ("schedule", "retry", "target", "payload")
    ),
    *(("schedule", k) for k in Schedule.model_fields),
    *(("retry", k) for k in RetryPolicy.model_fields),
    ("target", "type"),
    ("target", "task"),
    ("target", "extra"),
    ("extra",),
    ("payload",),
]


def _mutated(doc: dict[str, Any], path: tuple[str, ...], value: Any, delete: bool) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    parent = out
    for part in path[:-1]:
        parent = parent[part]
    if delete:
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    job=st.sampled_from(_jobs()),
    changes=st.lists(st.tuples(st.sampled_from(PATHS), ODD_VALUES, st.booleans()), min_size=1, max_size=3),
)
def test_the_light_decoder_vouches_only_for_documents_the_models_accept(
    job: Job, changes: list[tuple[tuple[str, ...], Any, bool]]
) -> None:
    doc = json.loads(job.model_dump_json())
    for path, value, delete in changes:
        if len(path) == 2 and not isinstance(doc.get(path[0]), dict):
            continue
        doc = _mutated(doc, path, value, delete)
    text = json.dumps(doc)
    row = joblist.row_from_doc(text)
    if row is None:
        return  # the full path decides
    try:
        decoded = Job.model_validate_json(text)
    except ValidationError as exc:
        pytest.fail(f"the light decoder vouched for a document the models refuse: {text}\n{exc}")
    assert row == joblist.JobRow.from_job(decoded)


def test_nan_and_an_unknown_key_are_left_to_the_full_path() -> None:
    doc = json.loads(make_job("j").model_dump_json())
    assert joblist.row_from_doc(json.dumps({**doc, "surprise": 1})) is None
    assert joblist.row_from_doc(json.dumps({**doc, "timeout_s": float("nan")})) is None
    assert joblist.row_from_doc(json.dumps({**doc, "payload": {"deep": [[[]]] * 2, "text": "\ud800"}})) is None


# -- the command: the fast path and the full path print the same ---------------------------------


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'jobq.db'}"
    d = connect(Settings.load({"store": url}, env={}))
    try:
        for i, job in enumerate(_jobs()):
            d.store.create_job(job.model_copy(update={"created_ms": T0 + i}), [])
        for i in range(7):  # more than a page of --limit 3
            d.store.create_job(make_job(f"bulk-{i}", created_ms=T0 + 10 + i, status=JobStatus.COMPLETED), [])
    finally:
        d.close()
    return url


def _list(url: str, *args: str, full: bool = False) -> str:
    # Any setting besides the backend URLs sends `jobq list` down the full path (it must be validated).
    env = {"JOBQ_STORE": url, **({"JOBQ_LOG_LEVEL": "INFO"} if full else {})}
    result = CliRunner().invoke(cli, ["list", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--json",),
        ("--limit", "3", "--json"),
        ("--cursor", "bulk-2|default", "--limit", "2", "--json"),
        ("--status", "paused"),
        ("--status", "completed", "--json"),
        ("--tenant", "acme", "--json"),
        ("--priority", "high"),
        ("--name", "report.", "--json"),
        ("--task", "tests.noop", "--json"),
    ],
    ids=" ".join,
)
def test_the_fast_and_the_full_path_list_the_same(store: str, args: tuple[str, ...]) -> None:
    assert _list(store, *args) == _list(store, *args, full=True)


def test_a_row_the_light_decoder_cannot_vouch_for_is_listed_by_the_full_path_as_corrupt(
    store: str, tmp_path: Path
) -> None:
    db = sqlite3.connect(tmp_path / "jobq.db")
    with db:
        db.execute("UPDATE jobq_jobs SET doc = json_set(doc, '$.retry.max_retries', -1) WHERE job_id = 'one-off'")
    db.close()
    listed = _list(store, "--json")
    assert listed == _list(store, "--json", full=True)
    shown = {j["job_id"]: j for j in json.loads(listed)["jobs"]}
    assert "retry.max_retries" in shown["one-off"]["corrupt"]
    assert shown["nightly"]["corrupt"] is None


@pytest.mark.slow  # starts a `jobq list` process to see which path it took
def test_a_failed_one_off_is_listed_as_failed_by_the_fast_path(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobq.db'}"
    d = connect(Settings.load({"store": url}, env={}))
    try:
        done = make_job("done", status=JobStatus.COMPLETED)
        d.store.create_job(done, [make_run("done", T0, state=RunState.SUCCEEDED)])
        dead = make_job("dead", status=JobStatus.COMPLETED, created_ms=T0 + 1)
        d.store.create_job(dead, [make_run("dead", T0, state=RunState.FAILED)])
    finally:
        d.close()
    assert "jobq.models" not in _fast_path_modules(tmp_path)
    listed = json.loads(_list(url, "--status", "failed", "--json"))["jobs"]
    assert [(j["job_id"], j["status"]) for j in listed] == [("dead", "FAILED")]
    assert _list(url) == _list(url, full=True)
    assert "FAILED" in _list(url)


def _fast_path_modules(tmp_path: Path) -> set[str]:
    """The modules a `jobq list` process loads on the store in tmp_path (the fast path: no models)."""
    probe = (
        "import sys; from jobq.cli.main import cli\ntry: cli(['list'])\nexcept SystemExit: pass\n"
        "print(sorted(sys.modules))"
    )
    env = {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=60)
    return set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))
