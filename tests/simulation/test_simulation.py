"""The simulation's fixed budget in CI: many seeds, each thousands of interleaved steps, no violation.

`pytest tests/simulation --seed N` replays one seed (and prints its shrunk trace if it fails);
`python -m tests.simulation --seeds 100000` searches on."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from simulation.runner import describe, run_seed, shrink

SEEDS = 200  # the CI budget: SEEDS x STEPS interleaved actions
STEPS = 2000
SQLITE_EVERY = 5  # one seed in five runs on the SQLite backends, the others in memory


def _seeds(config: pytest.Config) -> list[int]:
    chosen = config.getoption("--seed")
    return [chosen] if chosen is not None else list(range(SEEDS))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", _seeds(metafunc.config))


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)  # thousands of daemon passes: their logs only slow the search
    yield
    logging.disable(logging.NOTSET)


def test_no_seed_breaks_a_guarantee(seed: int, request: pytest.FixtureRequest) -> None:
    steps = request.config.getoption("--sim-steps") or STEPS
    backend = "sqlite" if seed % SQLITE_EVERY == SQLITE_EVERY - 1 else "memory"
    result = run_seed(seed, steps, backend)
    if not result.ok:
        pytest.fail(describe(shrink(result, budget_s=30)), pytrace=False)
