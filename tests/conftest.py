from __future__ import annotations

import functools
import inspect
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


# -- the fast subset: `pytest -m "not slow"` (docs/testing.md) ------------------------------------
# Marks set here by file, parameter and pattern, so tests added later to these files or suites are
# marked alike. Marks written on a test or a module (`pytestmark`) still count; this only adds.
#
# `services`: needs PostgreSQL, Redis, RabbitMQ or the moto server (which the fixtures start as a
# process of its own). Every such test is also `slow`: the fast subset runs with no service at all.

SMOKE_SEEDS = 5  # simulation seeds in the fast subset (seed 4 runs on SQLite, 0-3 in memory)
# Backends behind a real server, as the parametrised suites name them in test ids.
SERVICE_PARAMS = frozenset({"postgres", "postgresql", "redis", "amqp", "rabbitmq", "dynamodb", "sqs", "s3", "firehose"})
LOCAL_PARAMS = frozenset({"memory", "sqlite", "fakeredis"})
# Files whose every test talks to a real server.
SERVICE_FILES = frozenset(
    {
        "tests/test_postgres_store.py",
        "tests/test_dynamodb_store.py",
        "tests/test_aws_history.py",
        "tests/test_redis_index.py",
        "tests/test_kombu_transport.py",
    }
)
# What a test or one of its fixtures calls to reach a real server (tests/services.py, tests/moto_server.py).
SERVICE_CALLS = ("require_postgres(", "require_redis(", "require_rabbitmq(", "shared_moto_server(")
# Tests that reach a real server through a helper of another module: substrings of their ids.
SERVICE_TESTS = ("tests/contract/test_registry.py::test_postgres_",)  # test_store's `_postgres`
# Tests that run for seconds on their own (searches, brute-force oracles, a thousand runs, long
# simulated scenarios): substrings of their ids.
LONG_TESTS = (
    "test_next_after_matches_brute_force_oracle",
    "test_thousands_of_h_jobs_spread_over_the_hour",
    "test_a_critical_run_enqueued_after_1000_low_runs_starts_next",
    "tests/simulation/test_scenarios.py::test_fire_once_now_after_a_scanner_outage_runs_the_newest_missed_fire",
)
# Tests that start processes of their own (a `python -c` probe, a prefork pool's children).
SPAWNING_TESTS = (
    "tests/test_cli_startup.py::test_jobq_",
    "test_h_resolves_the_same_in_another_process",
    "tests/test_readme.py::test_the_quickstart",
    "tests/test_packaging.py::",
    "tests/test_tracing.py::test_without_opentelemetry",
    "tests/test_tracing.py::test_tracing_console",
    "tests/test_tracing.py::test_tracing_otlp",
    "tests/contract/test_registry.py::test_dynamodb_",  # the moto server, through a helper
)
# What a test or one of its fixtures calls to start a process in its own body.
SPAWN_CALLS = ("subprocess.", "Popen(", "multiprocessing.")
SPAWNING_PARAMS = frozenset({"prefork"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in _marks(item, config):
            item.add_marker(name)


def _calls(item: pytest.Item, calls: tuple[str, ...]) -> bool:
    """Whether the test function or a fixture it uses calls one of `calls` in its own body."""
    functions = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        definitions = info.name2fixturedefs.get(name, ()) if info is not None else ()
        functions += [d.func for d in definitions]
    return any(call in _source(f) for f in functions if f is not None for call in calls)


@functools.cache
def _source(function: Any) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _marks(item: pytest.Item, config: pytest.Config) -> tuple[str, ...]:
    path = Path(str(item.path)).relative_to(REPO).as_posix()
    callspec = getattr(item, "callspec", None)
    tokens = set(callspec.id.lower().replace("_", "-").split("-")) if callspec is not None else set()
    local = bool(tokens & LOCAL_PARAMS) and not tokens & SERVICE_PARAMS  # a shared fixture's local cell
    by_name = any(pattern in item.nodeid for pattern in SERVICE_TESTS)
    if path in SERVICE_FILES or tokens & SERVICE_PARAMS or by_name or (not local and _calls(item, SERVICE_CALLS)):
        return ("services", "slow")
    spawns = tokens & SPAWNING_PARAMS or _calls(item, SPAWN_CALLS)
    if spawns or any(pattern in item.nodeid for pattern in (*LONG_TESTS, *SPAWNING_TESTS)):
        return ("slow",)
    seeded = path == "tests/simulation/test_simulation.py" and callspec is not None
    if seeded and config.getoption("--seed") is None and int(callspec.params.get("seed", 0)) >= SMOKE_SEEDS:
        return ("slow",)
    return ()
