from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from jobq.clock import ManualClock

sys.path.insert(0, str(Path(__file__).parent))  # tests import `factories`

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def clock() -> ManualClock:
    from factories import T0

    return ManualClock(T0)


def pytest_report_header() -> list[str]:
    return [f"CI={os.environ.get('CI', '')!r}"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simulation")
    group.addoption("--seed", type=int, default=None, help="Run only this simulation seed (replays it exactly).")
    group.addoption("--sim-steps", type=int, default=None, help="Actions per simulated seed (default 2000).")
