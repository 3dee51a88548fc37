"""Specs for the domain records: the run transition table, priorities, run ids, retry policies."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jobq.errors import IllegalTransition, InvalidJob
from jobq.models import (
    PRIORITIES_BY_RANK,
    TERMINAL_STATES,
    TRANSITIONS,
    JobKey,
    Priority,
    RetryPolicy,
    Run,
    RunState,
    Transition,
    check_transition,
)

S = RunState
NON_TERMINAL = [S.SCHEDULED, S.CLAIMED, S.DISPATCHED, S.RUNNING]

# The edges drawn in design section 2 (cancellation is checked separately).
DESIGN_EDGES = [
    (S.SCHEDULED, S.CLAIMED),  # claim
    (S.CLAIMED, S.DISPATCHED),  # publish
    (S.DISPATCHED, S.RUNNING),  # start
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),  # non-retryable or attempts exhausted
    (S.RUNNING, S.SCHEDULED),  # retryable failure, or the reaper after the lease expired
    (S.CLAIMED, S.SCHEDULED),  # lease expired
    (S.DISPATCHED, S.SCHEDULED),  # lease expired
    (S.FAILED, S.SCHEDULED),  # redrive from the dead-letter list
]

ILLEGAL_EDGES = [
    (S.SCHEDULED, S.RUNNING),  # nobody starts a run that was never claimed
    (S.SCHEDULED, S.DISPATCHED),
    (S.SCHEDULED, S.SUCCEEDED),
    (S.CLAIMED, S.SUCCEEDED),
    (S.DISPATCHED, S.SUCCEEDED),
    (S.DISPATCHED, S.CLAIMED),
    (S.RUNNING, S.CLAIMED),
    (S.RUNNING, S.DISPATCHED),
    (S.SUCCEEDED, S.SCHEDULED),
    (S.SUCCEEDED, S.FAILED),
    (S.CANCELLED, S.SCHEDULED),
    (S.CANCELLED, S.RUNNING),
    (S.FAILED, S.RUNNING),
    (S.FAILED, S.SUCCEEDED),
    (S.FAILED, S.CANCELLED),
]


def transition(expect: set[RunState], to_state: RunState, **kwargs: Any) -> Transition:
    return Transition(
        run_id="job_1:1790834400000", expect=frozenset(expect), to_state=to_state, expect_fence=3, **kwargs
    )


# --------------------------------------------------------------------------------------------
# The transition table
# --------------------------------------------------------------------------------------------


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(RunState)


def test_terminal_states_are_succeeded_failed_and_cancelled() -> None:
    assert {S.SUCCEEDED, S.FAILED, S.CANCELLED} == TERMINAL_STATES
    assert [state for state in RunState if state.terminal] == [S.SUCCEEDED, S.FAILED, S.CANCELLED]


@pytest.mark.parametrize("state", [S.SUCCEEDED, S.CANCELLED])
def test_succeeded_and_cancelled_runs_have_no_exits(state: RunState) -> None:
    assert TRANSITIONS[state] == frozenset()


def test_a_failed_run_leaves_failed_only_by_redrive() -> None:
    assert TRANSITIONS[S.FAILED] - {S.FAILED} == {S.SCHEDULED}


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_every_non_terminal_state_can_be_cancelled(state: RunState) -> None:
    assert S.CANCELLED in TRANSITIONS[state]
    transition({state}, S.CANCELLED, bump_fence=True)


@pytest.mark.parametrize(("from_state", "to_state"), DESIGN_EDGES)
def test_design_edges_are_allowed(from_state: RunState, to_state: RunState) -> None:
    check_transition(frozenset({from_state}), to_state)
    assert transition({from_state}, to_state).to_state is to_state


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL_EDGES)
def test_transition_not_in_the_table_raises_illegal_transition(from_state: RunState, to_state: RunState) -> None:
    with pytest.raises(IllegalTransition, match=f"{from_state} -> {to_state}"):
        transition({from_state}, to_state)


def test_transition_from_several_states_is_illegal_if_any_edge_is() -> None:
    with pytest.raises(IllegalTransition, match="SCHEDULED -> RUNNING"):
        transition({S.DISPATCHED, S.SCHEDULED}, S.RUNNING)


def test_reaper_transition_from_every_leased_state_back_to_scheduled_is_allowed() -> None:
    transition({S.CLAIMED, S.DISPATCHED, S.RUNNING}, S.SCHEDULED, bump_fence=True)


@pytest.mark.parametrize("name", ["state", "fence", "run_id", "job_id", "nominal_ms", "tenant_id", "version", "bogus"])
def test_transition_changing_a_field_outside_the_whitelist_raises(name: str) -> None:
    with pytest.raises(IllegalTransition, match=name):
        transition({S.RUNNING}, S.SUCCEEDED, changes={name: 1})


def test_transition_may_change_whitelisted_fields() -> None:
    change = transition(
        {S.RUNNING},
        S.SCHEDULED,
        changes={"attempt": 2, "due_ms": 1_790_834_410_000, "last_error": "boom", "lease_owner": None},
    )

    assert change.changes["attempt"] == 2


def test_transition_describes_its_condition() -> None:
    described = transition({S.CLAIMED, S.DISPATCHED}, S.SCHEDULED).describe()

    assert "CLAIMED" in described
    assert "DISPATCHED" in described
    assert "fence=3" in described


# --------------------------------------------------------------------------------------------
# Priorities
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CRITICAL", Priority.CRITICAL),
        ("high", Priority.HIGH),
        ("Default", Priority.DEFAULT),
        ("lOw", Priority.LOW),
        (Priority.HIGH, Priority.HIGH),
    ],
)
def test_priority_parsing_is_case_insensitive(text: str, expected: Priority) -> None:
    assert Priority.parse(text) is expected


@pytest.mark.parametrize("text", ["urgent", "", "HIGHEST", "0"])
def test_unknown_priority_raises_invalid_job_naming_the_choices(text: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        Priority.parse(text)

    message = str(caught.value)
    assert repr(text) in message
    for name in ("CRITICAL", "HIGH", "DEFAULT", "LOW"):
        assert name in message
    assert caught.value.field == "priority"


@pytest.mark.parametrize(
    ("priority", "rank"), [(Priority.CRITICAL, 0), (Priority.HIGH, 1), (Priority.DEFAULT, 2), (Priority.LOW, 3)]
)
def test_priority_rank_puts_critical_first(priority: Priority, rank: int) -> None:
    assert priority.rank == rank


def test_priorities_by_rank_are_in_serving_order() -> None:
    assert PRIORITIES_BY_RANK == [Priority.CRITICAL, Priority.HIGH, Priority.DEFAULT, Priority.LOW]


@pytest.mark.parametrize(
    ("priority", "queue"),
    [(Priority.CRITICAL, "critical"), (Priority.HIGH, "high"), (Priority.DEFAULT, "default"), (Priority.LOW, "low")],
)
def test_each_priority_has_its_own_queue(priority: Priority, queue: str) -> None:
    assert priority.queue == queue
    assert Priority.from_queue(queue) is priority


# --------------------------------------------------------------------------------------------
# Run ids
# --------------------------------------------------------------------------------------------


def test_run_id_of_the_default_tenant_is_job_id_colon_nominal_ms() -> None:
    assert Run.make_id(JobKey("default", "job_9847291048"), 1_790_834_400_000) == "job_9847291048:1790834400000"


def test_run_id_of_another_tenant_leads_with_the_tenant() -> None:
    assert Run.make_id(JobKey("acme", "job_1"), 5) == "acme/job_1:5"


def test_run_id_is_the_same_for_the_same_fire_and_differs_across_tenants() -> None:
    one = JobKey("default", "job_1")
    assert Run.make_id(one, 5) == Run.make_id(one, 5)
    assert Run.make_id(one, 5) != Run.make_id(one, 6)
    assert Run.make_id(one, 5) != Run.make_id(JobKey("default", "job_2"), 5)
    assert Run.make_id(one, 5) != Run.make_id(JobKey("acme", "job_1"), 5)


@pytest.mark.parametrize(
    ("key", "nominal_ms"),
    [(JobKey("default", "job_1"), 0), (JobKey("acme", "job.x-1"), 1_790_834_400_000), (JobKey("t_1", "a"), 7)],
)
def test_a_run_id_parses_back_into_its_job_key_and_fire_time(key: JobKey, nominal_ms: int) -> None:
    assert Run.parse_id(Run.make_id(key, nominal_ms)) == (key, nominal_ms)


@pytest.mark.parametrize("run_id", ["job_1", "job_1:", ":5", "job_1:05", "job_1:x", "/job_1:5", "acme/:5"])
def test_a_string_not_made_by_make_id_does_not_parse(run_id: str) -> None:
    assert Run.parse_id(run_id) is None


def test_a_job_key_prints_and_parses_as_the_cli_writes_it() -> None:
    assert (str(JobKey("default", "job_1")), str(JobKey("acme", "job_1"))) == ("job_1", "acme/job_1")
    assert JobKey.parse("job_1") == JobKey("default", "job_1")
    assert JobKey.parse("job_1", "acme") == JobKey("acme", "job_1")
    assert JobKey.parse("globex/job_1", "acme") == JobKey("globex", "job_1")


# --------------------------------------------------------------------------------------------
# Retry policies
# --------------------------------------------------------------------------------------------


def test_retry_policy_defaults_allow_three_retries() -> None:
    policy = RetryPolicy()

    assert policy.max_retries == 3
    assert policy.max_attempts == 4
    assert policy.max_age_sec is None
    assert policy.non_retryable_errors == ()


def test_retry_policy_accepts_the_design_example() -> None:
    policy = RetryPolicy.model_validate(
        {"max_retries": 3, "initial_interval_sec": 10, "backoff_multiplier": 2.0, "max_interval_sec": 300}
    )

    assert (policy.initial_interval_sec, policy.backoff_multiplier, policy.max_interval_sec) == (10, 2.0, 300)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_retries", 0),
        ("max_retries", 1000),
        ("initial_interval_sec", 0),
        ("initial_interval_sec", 86_400),
        ("backoff_multiplier", 1.0),
        ("backoff_multiplier", 100),
        ("max_interval_sec", 0),
        ("max_interval_sec", 7 * 86_400),
        ("max_age_sec", 0.5),
    ],
)
def test_retry_policy_accepts_values_on_its_bounds(field: str, value: float) -> None:
    assert getattr(RetryPolicy.model_validate({field: value}), field) == value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_retries", -1),
        ("max_retries", 1001),
        ("initial_interval_sec", -0.1),
        ("initial_interval_sec", 86_401),
        ("backoff_multiplier", 0.99),
        ("backoff_multiplier", 100.1),
        ("max_interval_sec", -1),
        ("max_interval_sec", 7 * 86_400 + 1),
        ("max_age_sec", 0),
        ("max_age_sec", -5),
    ],
)
def test_retry_policy_rejects_values_out_of_bounds_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        RetryPolicy.model_validate({field: value})


def test_retry_policy_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="max_attempts"):
        RetryPolicy.model_validate({"max_attempts": 5})


def test_retry_policy_is_immutable() -> None:
    policy = RetryPolicy()

    with pytest.raises(ValidationError):
        policy.max_retries = 10  # type: ignore[misc,unused-ignore]
