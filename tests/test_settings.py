"""Settings come from defaults, a TOML file, JOBQ_* variables and flags, in that order."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from services import free_port

from jobq.errors import ConfigError
from jobq.metrics import METRICS, Gauge, Metrics, serve
from jobq.settings import Settings


def test_defaults_are_the_embedded_deployment() -> None:
    s = Settings.load(env={})
    assert s.store_url == "sqlite:///jobq.db"
    assert (s.index, s.broker, s.history) == ("sqlite:///jobq.db",) * 3
    assert (s.lease_s, s.heartbeat_s, s.scan_interval_s) == (30.0, 10.0, 0.25)


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "jobq.toml"
    config.write_text('[jobq]\nstore = "sqlite:///from-file.db"\nconcurrency = 3\nlease_s = 20\n')
    env = {"JOBQ_CONFIG": str(config), "JOBQ_CONCURRENCY": "5", "JOBQ_QUEUES": "critical, high"}
    s = Settings.load({"lease_s": 15}, env=env)
    assert s.store_url == "sqlite:///from-file.db"
    assert s.concurrency == 5
    assert s.lease_s == 15
    assert s.queues == ("critical", "high")


def test_a_bad_value_names_the_key_and_the_value() -> None:
    with pytest.raises(ConfigError) as err:
        Settings.load(env={"JOBQ_HEARTBEAT_S": "often"})
    assert "heartbeat_s" in str(err.value) and "'often'" in str(err.value)


def test_unknown_keys_in_a_file_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "jobq.toml"
    config.write_text("leese_s = 3\n")
    with pytest.raises(ConfigError) as err:
        Settings.load(config_file=config, env={})
    assert "leese_s" in str(err.value)


def test_a_missing_or_broken_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        Settings.load(config_file=tmp_path / "missing.toml", env={})
    broken = tmp_path / "broken.toml"
    broken.write_text("store = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.load(config_file=broken, env={})


def test_a_server_store_needs_the_roles_it_cannot_play_named() -> None:
    s = Settings.load({"store": "postgresql://db/jobs"}, env={})
    assert (s.index, s.history) == ("postgresql://db/jobs", "postgresql://db/jobs")
    with pytest.raises(ConfigError, match="give --broker"):
        _ = s.broker
    dynamo = Settings.load({"store": "dynamodb://jobs"}, env={})
    with pytest.raises(ConfigError, match="give --index"):
        _ = dynamo.index


def test_settings_are_frozen() -> None:
    s = Settings.load(env={})
    with pytest.raises(ValueError):
        s.lease_s = 1  # type: ignore[misc]


def test_metrics_are_served_in_prometheus_text_format() -> None:
    METRICS.dispatched.inc(priority="HIGH")
    METRICS.dispatch_lateness.observe(0.2, priority="HIGH")
    port = free_port()
    server = serve(port, host="127.0.0.1")
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "# TYPE jobq_runs_dispatched_total counter" in body
    assert 'jobq_runs_dispatched_total{priority="HIGH"}' in body
    assert 'jobq_dispatch_lateness_seconds_bucket{priority="HIGH",le="0.25"}' in body
    assert "jobq_fenced_writes_total" in body


def test_gauges_are_set_or_read_from_their_source_once_per_scrape() -> None:
    calls: list[int] = []

    def depth() -> dict[tuple[str, ...], float]:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("broker away")
        return {("critical",): 3.0, ("low",): 7.0}

    metrics = Metrics()
    pool = metrics.register(Gauge("jobq_test_pool_size", "Slots.", ()))
    pool.set(4)
    metrics.register(Gauge("jobq_test_backlog", "Backlog.", ("queue",), source=depth))
    first = metrics.render()
    assert "# TYPE jobq_test_pool_size gauge" in first and "jobq_test_pool_size 4" in first
    assert 'jobq_test_backlog{queue="critical"} 3' in first and 'jobq_test_backlog{queue="low"} 7' in first
    second = metrics.render()  # the source fails: the last values stay, the scrape still answers
    assert 'jobq_test_backlog{queue="low"} 7' in second
    assert len(calls) == 2
