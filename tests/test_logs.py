"""Logs: a task's own log lines print, attributed to its run; text fits 120 columns, JSON keeps
full ids; colour on a terminal only; an application's own logging configuration is kept."""

from __future__ import annotations

import io
import json
import logging
import sqlite3
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness
from procs import Processes, wait_until

from jobq import logs
from jobq.client import Client
from jobq.clock import ManualClock
from jobq.ids import new_job_id
from jobq.models import JobKey, Run, RunState
from jobq.settings import Settings
from jobq.submission import JobSpec
from jobq.wiring import connect


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root, jobq = logging.getLogger(), logging.getLogger("jobq")
    saved = (root.handlers[:], root.level, jobq.handlers[:], jobq.level, jobq.propagate)
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    jobq.handlers[:], jobq.level, jobq.propagate = saved[2], saved[3], saved[4]


def configure(fmt: str = "text", stream: io.StringIO | None = None) -> io.StringIO:
    """`logs.configure` in a process whose logging nobody configured: pytest's own capture
    handlers (added around each test's call) are taken off the root logger first."""
    logging.getLogger().handlers[:] = []
    out = io.StringIO() if stream is None else stream
    logs.configure("INFO", fmt, stream=out)
    return out


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness("memory", tmp_path, clock, concurrency=2)
    yield harness
    harness.close()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_task_s_own_log_lines_print_with_its_run_s_ids_attempt_and_fence(h: Harness) -> None:
    out = configure("text")

    @h.app.task(name="t.charge")
    def charge(amount: int) -> None:
        logging.getLogger("shop.billing").info("charging %d cents", amount)

    handle = charge.delay(250)
    h.work()
    run = h.client.get(handle.job_id).current_run
    assert run is not None and run.state is RunState.SUCCEEDED
    [line] = [line for line in out.getvalue().splitlines() if "charging" in line]
    assert " INFO  shop.billing charging 250 cents " in line
    assert line.endswith(f"run={handle.job_id[-8:]}:{run.nominal_ms} a=1 f={run.fence}")
    logging.getLogger("shop.billing").info("outside any run")
    assert out.getvalue().splitlines()[-1].endswith("outside any run")


def test_json_lines_carry_the_full_run_and_job_ids(h: Harness) -> None:
    out = configure("json")

    @h.app.task(name="t.charge")
    def charge() -> None:
        logging.getLogger("shop.billing").warning("card declined")

    handle = charge.delay()
    h.work()
    run = h.client.get(handle.job_id).current_run
    assert run is not None
    [doc] = [json.loads(line) for line in out.getvalue().splitlines() if "declined" in line]
    assert (doc["level"], doc["logger"], doc["msg"]) == ("warning", "shop.billing", "card declined")
    assert (doc["run_id"], doc["job_id"], doc["attempt"], doc["fence"]) == (run.run_id, handle.job_id, 1, run.fence)


def test_each_thread_s_lines_name_the_run_that_thread_executes(h: Harness) -> None:
    out = configure("json")
    both = threading.Barrier(2, timeout=10)

    @h.app.task(name="t.step")
    def step(n: int) -> None:
        both.wait()  # the two runs execute at once, in two threads of the pool
        logging.getLogger("shop.steps").info("step %d", n)

    handles = {n: step.delay(n) for n in (1, 2)}
    h.work()
    lines = [json.loads(line) for line in out.getvalue().splitlines() if '"shop.steps"' in line]
    assert {d["msg"]: d["job_id"] for d in lines} == {f"step {n}": h.job_id for n, h in handles.items()}


def test_a_line_about_a_run_fits_120_columns_in_text() -> None:
    job_id = new_job_id(1_790_834_400_000)
    run = Run(
        run_id=Run.make_id(JobKey("default", job_id), 1_790_834_400_000),
        job_id=job_id,
        nominal_ms=1_790_834_400_000,
        due_ms=1_790_834_400_000,
        attempt=3,
        fence=12,
        created_ms=0,
        updated_ms=0,
    )
    record = logging.LogRecord("jobq.worker", logging.WARNING, __file__, 1, "failed: %s; %s", None, None)
    record.args = ("ValueError: card expired", "retry in 4.2 s")
    record.__dict__.update(logs.run_fields(run))
    line = logs.LogfmtFormatter().format(record)
    assert len(line) <= 120, (len(line), line)
    assert len(line) - len(record.getMessage()) <= 70, "time, level, logger and run leave 50 columns"
    assert f"run={job_id[-8:]}:1790834400000 a=3 f=12" in line and job_id not in line
    doc = json.loads(logs.JsonFormatter().format(record))
    assert (doc["run_id"], doc["job_id"]) == (run.run_id, job_id)


def test_levels_are_coloured_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    for stream, coloured in ((Terminal(), True), (io.StringIO(), False)):
        configure("text", stream)
        logging.getLogger("jobq.test").error("boom")
        assert ("\x1b[31mERROR\x1b[0m" in stream.getvalue()) is coloured, repr(stream.getvalue())
    monkeypatch.setenv("NO_COLOR", "1")
    terminal = Terminal()
    configure("text", terminal)
    logging.getLogger("jobq.test").error("boom")
    assert "\x1b[" not in terminal.getvalue()


def test_an_application_s_own_logging_configuration_is_left_alone() -> None:
    logging.getLogger().handlers[:] = []
    theirs = io.StringIO()
    logging.basicConfig(stream=theirs, format="APP %(name)s %(message)s", level=logging.WARNING)
    ours = io.StringIO()
    logs.configure("INFO", "text", stream=ours)
    logging.getLogger("jobq.worker").info("started")
    logging.getLogger("shop").warning("low stock")
    assert ours.getvalue() == ""
    assert theirs.getvalue().splitlines() == ["APP jobq.worker started", "APP shop low stock"]


def test_configuring_twice_keeps_one_handler() -> None:
    configure("text")
    out = io.StringIO()
    logs.configure("INFO", "text", stream=out)
    logging.getLogger("jobq.test").info("once")
    assert out.getvalue().count("once") == 1 and len(logging.getLogger().handlers) == 1


TASKS = textwrap.dedent(
    """
    import logging
    from jobq import App

    app = App("logs")
    log = logging.getLogger("shop.orders")

    @app.task(name="orders.ship")
    def ship(order):
        log.info("shipping order %s", order)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_process_prints_its_tasks_log_lines_with_the_run(tmp_path: Path) -> None:
    (tmp_path / "shop_tasks.py").write_text(TASKS)
    store = f"sqlite:///{tmp_path / 'jobq.db'}"
    procs = Processes(tmp_path, {"JOBQ_STORE": store, "PYTHONPATH": str(tmp_path)})
    d = connect(Settings.load({"store": store}, env={}))
    try:
        procs.start("worker", "worker", "-A", "shop_tasks", "-c", "1")
        target = {"type": "TASK", "task": "orders.ship"}
        spec = JobSpec.model_validate({"target": target, "schedule_type": "IMMEDIATE", "payload": {"args": ["A-17"]}})
        job = Client(d).submit(spec).job
        wait_until(lambda: "shipping order A-17" in procs.log("worker"), 60, "the task's log line")
    finally:
        codes = procs.stop_all()
        d.close()
    assert codes == {"worker": 0}, procs.logs()
    [line] = [line for line in procs.log("worker").splitlines() if "shipping order A-17" in line]
    assert " INFO  shop.orders shipping order A-17 " in line and f"run={job.job_id[-8:]}:" in line, line
    assert line.endswith(" a=1 f=1") and len(line) <= 120, line
    assert "\x1b[" not in procs.log("worker")  # a file, not a terminal
    runs = sqlite3.connect(tmp_path / "jobq.db").execute("SELECT state FROM jobq_runs").fetchall()
    assert runs == [("SUCCEEDED",)]


def test_libraries_that_log_every_request_are_kept_to_warnings_unless_debugging() -> None:
    logging.getLogger("httpx").setLevel(logging.NOTSET)
    out = configure("text")
    logging.getLogger("httpx").info('HTTP Request: POST http://hooks.example/charge "HTTP/1.1 200 OK"')
    logging.getLogger("httpx").warning("retrying")
    assert "HTTP Request" not in out.getvalue() and "retrying" in out.getvalue()
    logging.getLogger("httpx").setLevel(logging.NOTSET)
