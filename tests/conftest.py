from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobq.clock import ManualClock

sys.path.insert(0, str(Path(__file__).parent))  # tests import `factories`

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def clock() -> ManualClock:
    from factories import T0

    return ManualClock(T0)


@pytest.fixture
def spans() -> Iterator[Any]:
    """OpenTelemetry's in-memory exporter behind a provider of the test's own, which jobq's tracer
    is pointed at for the test (no global provider is left behind); `.tracer` makes caller spans.
    Skips without the extra."""
    pytest.importorskip("opentelemetry.sdk", reason="tracing needs the extra: pip install 'jobq[otel]'")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from jobq import tracing

    exporter: Any = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    exporter.tracer = provider.get_tracer("jobq")
    tracing.pin(exporter.tracer)
    yield exporter
    tracing.pin(None)
    provider.shutdown()


def pytest_report_header() -> list[str]:
    return [f"CI={os.environ.get('CI', '')!r}"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simulation")
    group.addoption("--seed", type=int, default=None, help="Run only this simulation seed (replays it exactly).")
    group.addoption("--sim-steps", type=int, default=None, help="Actions per simulated seed (default 2000).")
