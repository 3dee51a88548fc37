"""Retry decisions: full-jitter exponential backoff and what counts as retryable."""

from __future__ import annotations

import random
from dataclasses import dataclass

from jobq.errors import Fail, Retry
from jobq.models import RetryPolicy


def backoff_ceiling_s(policy: RetryPolicy, attempt: int) -> float:
    """The upper bound of the wait after failed attempt `attempt` (1-based)."""
    exponent = max(attempt - 1, 0)
    try:
        grown = policy.initial_interval_sec * policy.backoff_multiplier**exponent
    except OverflowError:  # multiplier**exponent is huge, but 0 * huge is still no wait
        grown = float("inf") if policy.initial_interval_sec > 0 else 0.0
    return min(policy.max_interval_sec, grown)


def backoff_s(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """AWS "full jitter": uniform(0, min(max_interval, initial * multiplier^(attempt-1)))."""
    return (rng or random).uniform(0, backoff_ceiling_s(policy, attempt))


@dataclass(frozen=True, slots=True)
class Decision:
    retry: bool
    delay_s: float
    reason: str


def decide(
    policy: RetryPolicy,
    attempt: int,
    error: BaseException | str,
    *,
    age_s: float = 0.0,
    retryable: bool | None = None,
    retry_after_s: float | None = None,
    rng: random.Random | None = None,
    base: int = 0,
) -> Decision:
    """Whether the failed `attempt` is tried again, and after how long.

    `error` is the exception (or the name of an error kind, e.g. "LeaseExpired"). `retryable`
    forces the classification (webhook 4xx); `retry_after_s` is a server's Retry-After. `base` is
    the attempts made before the current budget (a redrive grants a fresh one): the policy counts
    `attempt - base`, and the reason names the run's own numbers ("attempt 7 of 7").
    """
    budget = attempt - base
    name = error if isinstance(error, str) else type(error).__name__
    reason = name if isinstance(error, str) else f"{name}: {error}"
    if isinstance(error, Fail) or retryable is False:
        return Decision(False, 0.0, reason)
    if name in policy.non_retryable_errors:
        return Decision(False, 0.0, f"{reason} (non-retryable)")
    if budget >= policy.max_attempts:
        return Decision(False, 0.0, f"{reason} (attempt {attempt} of {base + policy.max_attempts})")
    if policy.max_age_sec is not None and age_s >= policy.max_age_sec:
        return Decision(False, 0.0, f"{reason} (older than max_age_sec={policy.max_age_sec:g})")
    if isinstance(error, Retry) and error.delay_s is not None:
        return Decision(True, max(0.0, error.delay_s), reason)
    delay = backoff_s(policy, budget, rng)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    return Decision(True, delay, reason)
