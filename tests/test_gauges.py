"""The gauges: one cached overview per scrape, every figure from the store, broker and registry."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.daemons.registrar import Registrar
from jobq.gauges import register_gauges
from jobq.metrics import METRICS


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness("sqlite", tmp_path, clock)
    yield harness
    harness.close()


def _value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{series} not in\n{text}"
    return float(match.group(1))


def test_the_gauges_show_backlog_due_runs_states_dead_letters_and_daemons(h: Harness) -> None:
    @h.app.task(name="t.noop", priority="HIGH")
    def noop() -> None:
        pass

    @h.app.task(name="t.boom", retry={"max_retries": 0})
    def boom() -> None:
        raise ValueError("boom")

    boom.delay()
    h.cycle()  # a dead letter
    for _ in range(3):
        noop.delay()
    h.dispatch()  # three HIGH messages wait in the broker
    noop.schedule(delay_s=1)
    h.advance(61)  # ...and a run is 60 s past due, not dispatched
    Registrar(h.d, [h.scanner, h.beat]).run_once(h.clock.now_ms())
    register_gauges(h.d, max_age_s=0)

    text = METRICS.render()
    assert _value(text, 'jobq_queue_backlog{queue="high"}') == 3
    assert _value(text, 'jobq_queue_backlog{queue="low"}') == 0
    assert _value(text, 'jobq_queue_oldest_age_seconds{queue="high"}') >= 61
    assert _value(text, 'jobq_due_undispatched{tier="high"}') == 1
    assert _value(text, 'jobq_due_undispatched_oldest_age_seconds{tier="high"}') == 60
    assert _value(text, 'jobq_runs{state="DISPATCHED"}') == 3
    assert _value(text, 'jobq_runs{state="FAILED"}') == 1
    assert _value(text, "jobq_dead_letters") == 1
    assert _value(text, 'jobq_daemons_alive{role="scanner"}') == 1
    assert _value(text, 'jobq_daemons_alive{role="worker"}') == 0
    assert _value(text, "jobq_census_sampled") == 0


def test_a_scrape_reads_one_overview_and_scrapes_close_together_share_it(h: Harness) -> None:
    cache = register_gauges(h.d, max_age_s=60)
    METRICS.render()
    METRICS.render()
    assert cache.reads == 1


def test_a_store_outage_keeps_the_last_values_and_is_read_once_per_scrape(h: Harness) -> None:
    now = [0.0]
    cache = register_gauges(h.d, max_age_s=5, monotonic=lambda: now[0])
    assert "jobq_dead_letters 0" in METRICS.render()
    h.d.store.close()
    now[0] = 10.0
    text = METRICS.render()
    assert "jobq_dead_letters 0" in text, "the last value stays"
    assert 'jobq_daemons_alive{role="worker"} 0' in text
    assert cache.reads == 2, "the failed read is shared by every gauge of the scrape"
