"""Per-tenant token buckets."""

from __future__ import annotations

import pytest

from jobq.api.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_granted_then_the_rate_refills_it() -> None:
    clock = Clock()
    limiter = RateLimiter(rate_per_s=2, burst=3, now_s=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)  # one token refills in 1/rate seconds
    clock.now += 0.5
    assert limiter.take("a") == 0.0
    assert limiter.take("a") > 0


def test_tenants_have_their_own_buckets() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=1, now_s=Clock())
    assert limiter.take("a") == 0.0 and limiter.take("a") > 0
    assert limiter.take("b") == 0.0


def test_a_refused_request_takes_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(rate_per_s=1, burst=1, now_s=clock)
    limiter.take("a")
    for _ in range(5):
        assert limiter.take("a") > 0
    clock.now += 1.0
    assert limiter.take("a") == 0.0


def test_a_bucket_never_holds_more_than_the_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(rate_per_s=10, burst=2, now_s=clock)
    clock.now += 3600
    assert [limiter.take("a") == 0.0 for _ in range(3)] == [True, True, False]
