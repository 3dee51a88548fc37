"""`jobq bench` runs its workloads against a deployment and verifies every run executed once.

Timings are reported, never asserted: performance is measured by the benchmarks, not by tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_jobq_bench_runs_each_workload_and_checks_exactly_once(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'bench.db'}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobq.cli",
            "bench",
            "--store",
            store,
            "-w",
            "instant",
            "-w",
            "spike",
            "-w",
            "spread",
            "-n",
            "60",
            "--lead",
            "3",
            "-c",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    docs = {d["workload"].split(" ")[1]: d for d in json.loads(result.stdout)}
    assert set(docs) == {"instant", "spike", "spread"}
    assert all(d["executed_once"] and d["runs"] == 60 for d in docs.values())
    assert docs["instant"]["runs_per_s"] > 0 and docs["instant"]["enqueue_per_s"] > 0
    for name in ("spike", "spread"):
        late = docs[name]["start_lateness_ms"]
        assert 0 <= late["p50"] <= late["p95"] <= late["p99"] <= late["max"]
