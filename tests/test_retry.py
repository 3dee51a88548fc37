"""Specs for retry decisions: full-jitter exponential backoff and what is retried."""

from __future__ import annotations

import random
import statistics
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobq.errors import Fail, Retry
from jobq.models import RetryPolicy
from jobq.retry import backoff_ceiling_s, backoff_s, decide

DESIGN_POLICY = RetryPolicy(max_retries=3, initial_interval_sec=10, backoff_multiplier=2.0, max_interval_sec=300)

policies = st.builds(
    RetryPolicy,
    max_retries=st.integers(0, 1000),
    initial_interval_sec=st.floats(0, 86_400, allow_nan=False),
    backoff_multiplier=st.floats(1.0, 100, allow_nan=False),
    max_interval_sec=st.floats(0, 7 * 86_400, allow_nan=False),
)


class TransientError(Exception):
    pass


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 10.0), (2, 20.0), (3, 40.0), (4, 80.0), (5, 160.0), (6, 300.0), (7, 300.0), (50, 300.0)],
)
def test_backoff_ceiling_doubles_from_the_initial_interval_up_to_the_maximum(attempt: int, ceiling: float) -> None:
    assert backoff_ceiling_s(DESIGN_POLICY, attempt) == ceiling


@given(policy=policies, attempt=st.integers(1, 1001))
def test_backoff_ceiling_is_the_smaller_of_the_maximum_and_the_grown_interval(
    policy: RetryPolicy, attempt: int
) -> None:
    # Exact arithmetic, so that a huge multiplier^attempt neither overflows nor rounds.
    grown = Fraction(policy.initial_interval_sec) * Fraction(policy.backoff_multiplier) ** (attempt - 1)
    expected = min(Fraction(policy.max_interval_sec), grown)

    assert backoff_ceiling_s(policy, attempt) == pytest.approx(float(expected), rel=1e-9)


def test_backoff_ceiling_is_zero_when_the_initial_interval_is_zero_even_for_huge_exponents() -> None:
    policy = RetryPolicy(max_retries=1000, initial_interval_sec=0, backoff_multiplier=100, max_interval_sec=300)

    assert backoff_ceiling_s(policy, 1000) == 0


@given(policy=policies, attempt=st.integers(1, 1001), seed=st.integers(0, 2**32))
def test_backoff_is_within_zero_and_the_ceiling(policy: RetryPolicy, attempt: int, seed: int) -> None:
    delay = backoff_s(policy, attempt, random.Random(seed))

    assert 0 <= delay <= backoff_ceiling_s(policy, attempt)


def test_backoff_is_spread_over_the_whole_range_not_pinned_to_the_ceiling() -> None:
    rng = random.Random(20261101)
    ceiling = backoff_ceiling_s(DESIGN_POLICY, 4)

    delays = [backoff_s(DESIGN_POLICY, 4, rng) for _ in range(2000)]

    assert min(delays) < 0.05 * ceiling
    assert max(delays) > 0.95 * ceiling
    assert 0.45 * ceiling < statistics.fmean(delays) < 0.55 * ceiling
    assert sum(d < ceiling / 2 for d in delays) > 800  # half the mass below the midpoint


def test_backoff_uses_the_given_random_source() -> None:
    first = [backoff_s(DESIGN_POLICY, 3, random.Random(7)) for _ in range(3)]

    assert first[0] == first[1] == first[2]


def test_fail_is_never_retried() -> None:
    decision = decide(DESIGN_POLICY, 1, Fail("bad input"))

    assert not decision.retry
    assert "bad input" in decision.reason


def test_error_named_in_non_retryable_errors_is_not_retried() -> None:
    policy = RetryPolicy(non_retryable_errors=("ValueError", "LeaseExpired"))

    assert not decide(policy, 1, ValueError("nope")).retry
    assert not decide(policy, 1, "LeaseExpired").retry
    assert decide(policy, 1, TransientError("later")).retry


def test_forced_non_retryable_classification_is_not_retried() -> None:
    assert not decide(DESIGN_POLICY, 1, "HTTP 404", retryable=False).retry


@pytest.mark.parametrize(("attempt", "retried"), [(1, True), (2, True), (3, True), (4, False), (5, False)])
def test_three_retries_mean_four_attempts(attempt: int, retried: bool) -> None:
    assert DESIGN_POLICY.max_attempts == 4
    assert decide(DESIGN_POLICY, attempt, TransientError("x")).retry is retried


def test_zero_retries_means_the_first_failure_is_final() -> None:
    assert not decide(RetryPolicy(max_retries=0), 1, TransientError("x")).retry


def test_retry_with_delay_uses_that_delay() -> None:
    decision = decide(DESIGN_POLICY, 1, Retry(delay_s=42.5))

    assert decision.retry
    assert decision.delay_s == 42.5


def test_retry_with_delay_still_counts_as_an_attempt() -> None:
    assert not decide(DESIGN_POLICY, 4, Retry(delay_s=1)).retry


def test_retry_without_delay_uses_the_backoff() -> None:
    decisions = [decide(DESIGN_POLICY, 2, Retry(), rng=random.Random(seed)) for seed in range(50)]

    assert all(d.retry and 0 <= d.delay_s <= 20.0 for d in decisions)
    assert len({d.delay_s for d in decisions}) > 40


def test_retryable_failure_waits_within_the_backoff_ceiling() -> None:
    decision = decide(DESIGN_POLICY, 3, TransientError("x"), rng=random.Random(1))

    assert decision.retry
    assert 0 <= decision.delay_s <= 40.0


def test_retry_after_raises_the_delay_above_the_backoff() -> None:
    decision = decide(DESIGN_POLICY, 1, "HTTP 429", retry_after_s=120, rng=random.Random(3))

    assert decision.retry
    assert decision.delay_s == 120  # the ceiling for attempt 1 is 10 s


@given(seed=st.integers(0, 2**32), retry_after=st.floats(0, 60))
def test_retry_after_is_a_floor_on_the_delay(seed: int, retry_after: float) -> None:
    decision = decide(DESIGN_POLICY, 2, "HTTP 503", retry_after_s=retry_after, rng=random.Random(seed))

    assert decision.retry
    assert retry_after <= decision.delay_s <= max(retry_after, 20.0)


def test_run_older_than_max_age_is_not_retried() -> None:
    policy = RetryPolicy(max_retries=10, max_age_sec=3600)

    assert decide(policy, 1, TransientError("x"), age_s=3599).retry
    assert not decide(policy, 1, TransientError("x"), age_s=3600).retry
    assert not decide(policy, 1, TransientError("x"), age_s=7200).retry


def test_without_max_age_an_old_run_is_still_retried() -> None:
    assert decide(RetryPolicy(max_retries=10), 2, TransientError("x"), age_s=10**9).retry


def test_reason_names_the_error_kind() -> None:
    decision = decide(DESIGN_POLICY, 4, TransientError("boom"))

    assert "TransientError" in decision.reason
    assert "boom" in decision.reason
