"""OpenTelemetry tracing in process: which spans jobq makes, how they chain, what they carry.

Spans go to the SDK's in-memory exporter (the `spans` fixture of conftest.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness

from jobq import tracing
from jobq.clock import ManualClock
from jobq.errors import ConfigError
from jobq.models import RunState

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the extra: pip install 'jobq[otel]'")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = int("4bf92f3577b34da6a3ce929d0e0e4736", 16)


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness("memory", tmp_path, clock)
    yield harness
    harness.close()


def _named(exporter: Any, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def _one(exporter: Any, prefix: str) -> ReadableSpan:
    found = _named(exporter, prefix)
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def test_a_delayed_job_runs_in_the_trace_of_the_call_that_submitted_it(h: Harness, spans: Any) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    with spans.tracer.start_as_current_span("checkout") as caller:
        handle = noop.schedule(delay_s=10)
    job = h.client.job(handle.job_id)
    submit = _one(spans, "jobq.submit")
    assert submit.parent is not None and submit.parent.span_id == caller.get_span_context().span_id
    assert tracing.trace_id_of(job.trace) == f"{caller.get_span_context().trace_id:032x}"
    assert h.cycle(10) == 1
    dispatch, execute = _one(spans, "jobq.dispatch"), _one(spans, "jobq.execute")
    assert {submit.context.trace_id, dispatch.context.trace_id, execute.context.trace_id} == {
        caller.get_span_context().trace_id
    }
    assert dispatch.parent is not None and dispatch.parent.span_id == submit.context.span_id
    assert execute.parent is not None and execute.parent.span_id == dispatch.context.span_id
    assert execute.kind is trace.SpanKind.CONSUMER and dispatch.kind is trace.SpanKind.PRODUCER
    run = h.client.get(handle.job_id).current_run
    assert run is not None and run.state is RunState.SUCCEEDED
    attributes = execute.attributes or {}
    assert (attributes["jobq.run_id"], attributes["jobq.attempt"], attributes["jobq.fence"]) == (
        run.run_id,
        1,
        run.fence,
    )
    assert (attributes["jobq.tier"], attributes["jobq.task"], attributes["jobq.job_id"]) == (
        "default",
        "t.noop",
        handle.job_id,
    )
    assert isinstance(attributes["jobq.lateness_ms"], int)
    assert (dispatch.attributes or {})["jobq.lateness_ms"] == 0  # scanned at its due time exactly


def test_an_instant_job_is_dispatched_by_the_submitting_client_in_its_trace(h: Harness, spans: Any) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    noop.delay()
    h.work()
    submit, dispatch, execute = (_one(spans, n) for n in ("jobq.submit", "jobq.dispatch", "jobq.execute"))
    assert submit.parent is None  # no caller span: the submission starts the trace
    assert dispatch.parent is not None and dispatch.parent.span_id == submit.context.span_id
    assert execute.parent is not None and execute.parent.span_id == dispatch.context.span_id


def test_every_attempt_of_a_retried_run_stays_in_the_submission_s_trace(h: Harness, spans: Any) -> None:
    @h.app.task(name="t.flaky", bind=True)
    def flaky(ctx: object) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    handle = flaky.schedule(delay_s=1)
    h.cycle(1)
    h.cycle(400)  # past any backoff of the default policy
    executions = _named(spans, "jobq.execute")
    assert [(s.attributes or {})["jobq.attempt"] for s in executions] == [1, 2]
    assert len({s.context.trace_id for s in executions}) == 1
    assert executions[0].context.trace_id == _one(spans, "jobq.submit").context.trace_id
    assert executions[0].status.status_code is trace.StatusCode.ERROR
    assert "first attempt fails" in (executions[0].status.description or "")
    assert executions[0].events and executions[0].events[0].name == "exception"
    assert executions[1].status.status_code is not trace.StatusCode.ERROR
    assert h.client.get(handle.job_id).current_run.state is RunState.SUCCEEDED  # type: ignore[union-attr]


def test_each_fire_of_a_recurring_job_starts_its_own_trace_linked_to_the_submission(h: Harness, spans: Any) -> None:
    @h.app.task(name="t.tick")
    def tick() -> None:
        pass

    tick.schedule(cron="*/10 * * * * *")
    submit = _one(spans, "jobq.submit")
    for _ in range(3):
        h.cycle(10)
    fires = _named(spans, "jobq.fire")
    executions = _named(spans, "jobq.execute")
    assert len(executions) >= 2
    assert len({s.context.trace_id for s in fires}) == len(fires), "one trace per fire"
    assert all(s.context.trace_id != submit.context.trace_id for s in fires)
    assert all([link.context.span_id for link in s.links] == [submit.context.span_id] for s in fires)
    assert {s.context.trace_id for s in executions} <= {s.context.trace_id for s in fires}


def test_a_task_s_own_log_lines_carry_the_trace_id_of_its_execution_span(
    h: Harness, spans: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from jobq import logs

    @h.app.task(name="t.talk")
    def talk() -> None:
        logging.getLogger("app.talk").info("charging the card")

    caplog.handler.addFilter(logs.RunFields())
    with caplog.at_level(logging.INFO, logger="app.talk"):
        talk.delay()
        h.work()
    [record] = [r for r in caplog.records if r.name == "app.talk"]
    execute = _one(spans, "jobq.execute")
    assert record.trace_id == f"{execute.context.trace_id:032x}"  # type: ignore[attr-defined]
    assert record.run_id == (execute.attributes or {})["jobq.run_id"]  # type: ignore[attr-defined]


def test_tracing_mode_names_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="tracing"):
        tracing.configure("zipkin", "jobq-test")


def test_a_malformed_traceparent_is_ignored() -> None:
    assert tracing.valid_traceparent(TRACEPARENT) == TRACEPARENT
    for bad in ("", "00-abc-def-01", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", TRACEPARENT.upper(), "zz"):
        assert tracing.valid_traceparent(bad) is None


def test_without_opentelemetry_nothing_is_traced_and_asking_for_an_exporter_names_the_extra(tmp_path: Path) -> None:
    """With the `opentelemetry` packages absent (imports refused), jobq runs untraced; a daemon
    asked for `--tracing console` exits 2 with one line naming the extra."""
    script = textwrap.dedent(
        """
        import sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("refused: " + name)
        sys.meta_path.insert(0, Refuse())

        from jobq import tracing
        from jobq.app import App
        from jobq.clock import ManualClock
        from jobq.daemons.scanner import Scanner
        from jobq.daemons.worker import Worker
        from jobq.settings import Settings
        from jobq.wiring import connect

        clock = ManualClock(1_790_000_000_000)
        d = connect(Settings.load({"store": "memory://", "history_flush_s": 0}, env={}), clock)
        app = App(clock=clock)
        app.use(d)
        done = []
        app.task(name="t.noop")(lambda: done.append(1))
        job = app.client.submit({"target": {"type": "TASK", "task": "t.noop"}, "schedule_type": "IMMEDIATE"}).job
        worker = Worker(d, app.registry)
        worker.run_once(clock.now_ms())
        assert worker.wait_idle(10)
        worker.shutdown()
        assert done == [1], done
        assert job.trace is None and tracing.current_traceparent() is None
        with tracing.span("jobq.test") as span:
            assert span is None
        headers = {}
        tracing.inject(headers, fallback="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        assert headers == {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, headers
        assert not any(m == "opentelemetry" or m.startswith("opentelemetry.") for m in sys.modules)
        print("untraced ok")
        """
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0 and "untraced ok" in ran.stdout, ran.stdout + ran.stderr

    cli = textwrap.dedent(
        """
        import sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("refused: " + name)
        sys.meta_path.insert(0, Refuse())
        from jobq.cli.main import cli
        cli(["scanner", "--tracing", "console", "--store", sys.argv[1]])
        """
    )
    store = f"sqlite:///{tmp_path / 'jobq.db'}"
    ran = subprocess.run([sys.executable, "-c", cli, store], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "pip install 'jobq[otel]'" in ran.stderr and "Traceback" not in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr


def test_tracing_off_makes_no_spans_and_keeps_no_context(h: Harness, spans: Any) -> None:
    @h.app.task(name="t.noop")
    def noop() -> None:
        pass

    tracing.configure("off", "jobq-test")
    try:
        with spans.tracer.start_as_current_span("caller"):
            handle = noop.delay()
        h.work()
        assert tracing.valid_traceparent(TRACEPARENT) is None
        headers: dict[str, str] = {}
        tracing.inject(headers, fallback=TRACEPARENT)
        assert headers == {}
    finally:
        tracing.configure("auto", "jobq-test")
    assert h.client.job(handle.job_id).trace is None
    assert [s.name for s in spans.get_finished_spans()] == ["caller"]


EXPORTING = textwrap.dedent(
    """
    import sys
    from opentelemetry import trace
    from jobq import tracing

    tracing.configure(sys.argv[1], "jobq-test")
    with tracing.span("jobq.dispatch", parent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"):
        pass
    trace.get_tracer_provider().shutdown()  # flush, as the SDK does at exit
    """
)


def test_tracing_console_installs_the_sdk_and_prints_each_span_with_the_daemon_s_service_name() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    ran = subprocess.run(
        [sys.executable, "-c", EXPORTING, "console"], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert ran.returncode == 0, ran.stderr
    printed = json.loads(ran.stdout)
    assert printed["name"] == "jobq.dispatch"
    assert printed["context"]["trace_id"] == "0x4bf92f3577b34da6a3ce929d0e0e4736"
    assert printed["resource"]["attributes"]["service.name"] == "jobq-test"


def test_tracing_otlp_sends_the_spans_to_the_configured_collector() -> None:
    from api.support import Receiver

    with Receiver() as collector:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_SERVICE_NAME": "billing-worker"}
        ran = subprocess.run(
            [sys.executable, "-c", EXPORTING, "otlp"], capture_output=True, text=True, timeout=60, check=False, env=env
        )
        assert ran.returncode == 0, ran.stderr
        [request] = collector.requests
    assert (request.method, request.path) == ("POST", "/v1/traces")
    assert request.headers["content-type"] == "application/x-protobuf"
    body = request.body
    assert bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736") in body and b"jobq.dispatch" in body
    assert b"billing-worker" in body and b"jobq-test" not in body, "OTEL_SERVICE_NAME wins over the default"
