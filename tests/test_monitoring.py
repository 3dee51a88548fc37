"""contrib/monitoring: the Prometheus rules pass promtool's checks and unit tests (each alert fires
on the series that should raise it), and the Grafana dashboard and the rules name only metrics jobq
exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobq.clock import ManualClock
from jobq.gauges import register_gauges
from jobq.metrics import METRICS
from jobq.settings import Settings
from jobq.wiring import connect

MONITORING = Path(__file__).resolve().parent.parent / "contrib" / "monitoring"
RULES = MONITORING / "jobq-alerts.yml"
DASHBOARD = MONITORING / "jobq-dashboard.json"
# Exported by other parts than the gauges and the daemons' counters: the API's request metrics and
# the worker's slot gauge (jobq.daemons.worker).
OTHER_METRICS = {"jobq_api_requests_total", "jobq_api_request_seconds", "jobq_worker_slots"}
SUFFIXES = ("_bucket", "_count", "_sum")


def _exported(tmp_path: Path) -> set[str]:
    d = connect(Settings.load({"store": f"sqlite:///{tmp_path / 'jobq.db'}"}, env={}), ManualClock())
    try:
        register_gauges(d)
        return {m.name for m in METRICS.all()} | OTHER_METRICS
    finally:
        d.close()


def _metrics_in(expr: str) -> set[str]:
    names = set(re.findall(r"\b(jobq_[a-z_]+)", expr))
    return {next((n[: -len(s)] for s in SUFFIXES if n.endswith(s)), n) for n in names}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI (.ci/run installs the Debian package prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def test_the_alert_rules_pass_promtool_check() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_on_the_series_that_should_raise_it() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", "jobq-alerts.test.yml"],
        check=False,
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_alert_has_a_severity_a_summary_and_a_unit_test() -> None:
    alerts = [r for r in _rules() if "alert" in r]
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "jobq-alerts.test.yml").read_text()))
    assert {a["alert"] for a in alerts} == tested
    for alert in alerts:
        assert alert["labels"]["severity"] in {"page", "ticket"}, alert["alert"]
        assert alert["annotations"]["summary"], alert["alert"]


def test_the_rules_name_only_metrics_jobq_exports(tmp_path: Path) -> None:
    exported = _exported(tmp_path)
    named = set().union(*(_metrics_in(r["expr"]) for r in _rules()))
    assert named and named <= exported, named - exported
    assert {"jobq_daemons_alive", "jobq_dead_letters", "jobq_queue_oldest_age_seconds"} <= named


def test_the_dashboard_is_grafana_json_over_exported_metrics(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "jobq-overview" and dashboard["schemaVersion"] >= 36
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    exported = _exported(tmp_path)
    named: set[str] = set()
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        for target in panel["targets"]:
            named |= _metrics_in(target["expr"])
    assert named <= exported, named - exported
    gauges = {"jobq_queue_backlog", "jobq_queue_oldest_age_seconds", "jobq_due_undispatched", "jobq_runs"}
    assert gauges | {"jobq_dead_letters", "jobq_daemons_alive", "jobq_dispatch_lateness_seconds"} <= named
