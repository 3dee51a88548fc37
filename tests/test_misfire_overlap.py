"""The misfire x overlap table of docs/scheduling.md, one test per cell, run twice: with beat
down and with the scanner down. The fires that run are the same whichever daemon was down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.metrics import METRICS
from jobq.models import MisfirePolicy, OverlapPolicy

# A job firing every 10 s runs f0 on time; then a daemon is down for 105 s, so f1..f4 are
# missed (more than 60 s late when it is back) and f5..f10 are late by less than the threshold.
# Which of f1..f10 run, by misfire policy and overlap policy:
TABLE: dict[tuple[str, str], set[int]] = {
    ("fire_once_now", "SKIP"): {4},  # f4 stands for f1..f4; f5..f10 overlap it and are skipped
    ("fire_once_now", "BUFFER_ONE"): {4, 5},
    ("fire_once_now", "BUFFER_ALL"): {4, 5, 6, 7, 8, 9, 10},
    ("fire_once_now", "CANCEL_OTHER"): {10},
    ("fire_once_now", "ALLOW_ALL"): {4, 5, 6, 7, 8, 9, 10},
    ("fire_all", "SKIP"): {1, 2, 3, 4},  # the catch-up runs take turns; the fires due meanwhile overlap them
    ("fire_all", "BUFFER_ONE"): {1, 2, 3, 4},
    ("fire_all", "BUFFER_ALL"): {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
    ("fire_all", "CANCEL_OTHER"): {1, 2, 3, 10},  # f5 cancels the waiting f4, f10 replaces f5..f9
    ("fire_all", "ALLOW_ALL"): {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
    ("skip", "SKIP"): {5},
    ("skip", "BUFFER_ONE"): {5, 6},
    ("skip", "BUFFER_ALL"): {5, 6, 7, 8, 9, 10},
    ("skip", "CANCEL_OTHER"): {10},
    ("skip", "ALLOW_ALL"): {5, 6, 7, 8, 9, 10},
}
MISSED = 4  # f1..f4, each counted once in jobq_misfires_total


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    clock.set((clock.now_ms() // 60_000 + 1) * 60_000)
    harness = Harness("memory", tmp_path, clock, horizon_s=1)  # beat materialises only what is due now
    yield harness
    harness.close()


def _fires_run(h: Harness, misfire: str, overlap: str, down: str) -> tuple[set[int], float]:
    ran: list[int] = []

    @h.app.task(name="t.tick", bind=True)
    def tick(ctx: object) -> None:
        ran.append(int(ctx.run_id.rsplit(":", 1)[1]))  # type: ignore[attr-defined]

    from jobq.app import Task

    definition = h.app.registry.get("t.tick")
    assert definition is not None
    t0 = h.clock.now_ms() + 10_000
    Task(h.app, definition).schedule(cron="*/10 * * * * *", misfire=misfire, overlap=overlap)
    h.clock.set(t0)
    h.cycle()  # f0 runs on time
    assert ran == [t0]
    before = METRICS.misfires.value(policy=misfire)
    for _ in range(105):  # one daemon is down, the others go on
        h.advance(1)
        if down != "beat":
            h.beat.run_once(h.clock.now_ms())
        if down != "scanner":
            h.scanner.run_once(h.clock.now_ms())
    for _ in range(40):  # back: every daemon runs, a second at a time
        h.cycle()
        h.advance(1)
    fired = {(n - t0) // 10_000 for n in ran if t0 < n <= t0 + 100_000}
    return fired, METRICS.misfires.value(policy=misfire) - before


@pytest.mark.parametrize("down", ["beat", "scanner"])
@pytest.mark.parametrize("overlap", [p.value for p in OverlapPolicy])
@pytest.mark.parametrize("misfire", [p.value for p in MisfirePolicy])
def test_the_fires_that_run_after_an_outage_follow_the_table(h: Harness, misfire: str, overlap: str, down: str) -> None:
    fired, misfires = _fires_run(h, misfire, overlap, down)
    assert fired == TABLE[(misfire, overlap)]
    assert misfires == MISSED, "each missed fire is counted once, whichever daemon was down"
