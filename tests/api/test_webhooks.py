"""The HTTP webhook caller against real receivers on loopback: headers, signatures, outcomes,
Retry-After, truncation, connection reuse and the network policy at call time."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from jobq.clock import ManualClock
from jobq.contrib.webhook_verify import expected_signature, verify
from jobq.errors import WebhookFailed
from jobq.models import Job, Schedule, ScheduleType, WebhookTarget
from jobq.netpolicy import NetPolicy
from jobq.store.memory import MemoryStore
from jobq.tasks import TaskContext
from jobq.webhooks import HttpWebhookCaller, parse_retry_after, sign

from .support import Receiver, Reply

NOW_MS = 1_790_000_000_000


def _job(endpoint: str, *, method: str = "POST", headers: dict[str, str] | None = None, timeout_s: float = 5) -> Job:
    target = WebhookTarget(endpoint=endpoint, method=method, headers=headers or {}, timeout_seconds=timeout_s)  # type: ignore[arg-type]
    return Job(
        job_id="job_hook",
        tenant_id="acme",
        name="hook",
        target=target,
        payload={"invoice": 42, "lines": ["a", "b"]},
        schedule=Schedule(type=ScheduleType.IMMEDIATE, at_ms=NOW_MS),
        created_ms=NOW_MS,
        updated_ms=NOW_MS,
    )


CTX = TaskContext(
    run_id="job_hook:1790000000000", job_id="job_hook", attempt=2, fence=7, task="jobq.webhook", worker_id="w"
)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def make_caller(store: MemoryStore) -> Iterator[Callable[..., HttpWebhookCaller]]:
    made: list[HttpWebhookCaller] = []

    def make(allow: tuple[str, ...] = ("127.0.0.0/8",), **options: Any) -> HttpWebhookCaller:
        policy = NetPolicy(allow, options.pop("resolver", None))
        caller = HttpWebhookCaller(store, policy, clock=ManualClock(NOW_MS), **options)
        made.append(caller)
        return caller

    yield make
    for c in made:
        c.close()


def _failure(caller: HttpWebhookCaller, job: Job) -> WebhookFailed:
    with pytest.raises(WebhookFailed) as info:
        caller(job, CTX)
    return info.value


def test_a_call_carries_the_run_fence_attempt_and_a_signature_that_verifies(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller], store: MemoryStore
) -> None:
    r = receiver()
    result = make_caller()(_job(f"{r.url}/hooks?x=1", headers={"Authorization": "Bearer downstream"}), CTX)
    assert result == {"status": 200, "body": "ok"}
    [got] = r.requests
    assert (got.method, got.path) == ("POST", "/hooks?x=1")
    assert json.loads(got.body) == {"invoice": 42, "lines": ["a", "b"]}
    h = got.headers
    assert h["idempotency-key"] == h["x-jobq-run-id"] == CTX.run_id
    assert (h["x-jobq-attempt"], h["x-jobq-fence"], h["x-jobq-job-id"]) == ("2", "7", "job_hook")
    assert h["authorization"] == "Bearer downstream" and h["content-type"] == "application/json"
    secret = store.tenant_secret("acme", "unused")
    assert secret.startswith("whsec_")
    assert h["x-jobq-timestamp"] == str(NOW_MS // 1000)
    assert verify(secret, h["x-jobq-timestamp"], got.body, h["x-jobq-signature"], now_s=NOW_MS / 1000)
    assert h["x-jobq-signature"] == sign(secret, NOW_MS // 1000, got.body)


def test_the_signature_fails_for_another_secret_body_or_an_old_timestamp() -> None:
    sig = expected_signature("s1", 1000, b"{}")
    assert verify("s1", "1000", b"{}", sig, now_s=1100)
    assert not verify("s2", "1000", b"{}", sig, now_s=1100)
    assert not verify("s1", "1000", b"{ }", sig, now_s=1100)
    assert not verify("s1", "1000", b"{}", sig, now_s=1000 + 301)
    assert not verify("s1", "not-a-number", b"{}", sig, now_s=1000)
    assert verify("s1", 1000, "{}", f"v1=deadbeef, {sig}", now_s=1000)  # one of several (rotation)


def test_a_get_sends_no_body_and_signs_the_empty_body(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller], store: MemoryStore
) -> None:
    r = receiver()
    make_caller()(_job(r.url, method="GET"), CTX)
    [got] = r.requests
    assert got.body == b"" and "content-type" not in got.headers
    secret = store.tenant_secret("acme", "x")
    h = got.headers
    assert verify(secret, h["x-jobq-timestamp"], b"", h["x-jobq-signature"], now_s=NOW_MS / 1000)


def test_target_headers_cannot_override_jobq_s_own(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    r = receiver()
    make_caller()(_job(r.url, headers={"X-Jobq-Fence": "999", "Idempotency-Key": "mine", "Host": "evil"}), CTX)
    [got] = r.requests
    assert (got.headers["x-jobq-fence"], got.headers["idempotency-key"]) == ("7", CTX.run_id)
    assert got.headers["host"] == f"127.0.0.1:{r.port}"


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
def test_a_4xx_is_not_retryable_and_keeps_status_and_body(
    status: int, receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    r = receiver(Reply(status, b"nope"))
    failure = _failure(make_caller(), _job(r.url))
    assert (failure.retryable, failure.result) == (False, {"status": status, "body": "nope"})
    assert f"HTTP {status}" in str(failure)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_408_429_and_5xx_are_retryable(
    status: int, receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    r = receiver(Reply(status, b"later"))
    failure = _failure(make_caller(), _job(r.url))
    assert (failure.retryable, failure.retry_after_s) == (True, None)
    assert failure.result == {"status": status, "body": "later"}


def test_retry_after_in_seconds_or_as_an_http_date_is_passed_on(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    when = datetime.fromtimestamp(NOW_MS / 1000, UTC) + timedelta(seconds=90)
    r = receiver(
        Reply(429, headers={"Retry-After": "120"}),
        Reply(503, headers={"Retry-After": format_datetime(when, usegmt=True)}),
    )
    caller = make_caller()
    assert _failure(caller, _job(r.url)).retry_after_s == 120
    assert _failure(caller, _job(r.url)).retry_after_s == pytest.approx(90, abs=1)


def test_retry_after_parsing() -> None:
    assert parse_retry_after("7", 0) == 7
    assert parse_retry_after("999999999", 0) == 86_400
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1_445_412_420) == 60
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1_445_412_540) == 0  # in the past
    assert parse_retry_after("soon", 0) is None
    assert parse_retry_after(None, 0) is None


def test_a_redirect_is_not_followed_and_not_retried(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    elsewhere = receiver()
    r = receiver(Reply(302, headers={"Location": f"{elsewhere.url}/x?token=secret"}))
    failure = _failure(make_caller(), _job(r.url))
    assert failure.retryable is False and "redirects are not followed" in str(failure)
    assert "secret" not in str(failure) and elsewhere.requests == []


def test_a_timeout_is_retryable(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    r = receiver(Reply(200, delay_s=1.0))
    failure = _failure(make_caller(), _job(r.url, timeout_s=0.2))
    assert failure.retryable is True and "timed out after 0.2 s" in str(failure)


def test_a_refused_connection_is_retryable(make_caller: Callable[..., HttpWebhookCaller]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        failure = _failure(make_caller(), _job(f"http://127.0.0.1:{port}/"))
    assert failure.retryable is True and failure.result is None


def test_only_the_first_bytes_of_the_body_are_kept(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    r = receiver(Reply(200, b"a" * 10_000))
    assert make_caller(response_bytes=100)(_job(r.url), CTX) == {"status": 200, "body": "a" * 100}
    assert make_caller()(_job(r.url), CTX)["body"] == "a" * 4096


def test_calls_reuse_one_connection(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller]
) -> None:
    r = receiver()
    caller = make_caller()
    for _ in range(5):
        caller(_job(r.url), CTX)
    assert (len(r.requests), r.connections) == (5, 1)


# -- the network policy at call time -----------------------------------------------------------


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every address a socket in this process tries to connect to."""
    seen: list[Any] = []
    original = socket.socket.connect

    def spy(self: socket.socket, address: Any) -> None:
        seen.append(address)
        original(self, address)

    monkeypatch.setattr(socket.socket, "connect", spy)
    return seen


def test_a_loopback_endpoint_is_refused_without_the_allow_list_and_never_connected(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller], connects: list[Any]
) -> None:
    r = receiver()
    failure = _failure(make_caller(allow=()), _job(r.url))
    assert failure.retryable is False and "loopback" in str(failure)
    assert connects == [] and r.connections == 0


def test_a_name_that_rebinds_to_a_private_address_at_call_time_is_refused(
    make_caller: Callable[..., HttpWebhookCaller], connects: list[Any]
) -> None:
    answers = iter([["93.184.215.14"], ["10.0.0.1"]])  # public when checked at submit, private later
    caller = make_caller(allow=(), resolver=lambda host, port: next(answers))
    caller.policy.check("http://rebind.example/hook")  # the submit-time check passes
    failure = _failure(caller, _job("http://rebind.example/hook"))
    assert failure.retryable is False and "10.0.0.1" in str(failure) and "private" in str(failure)
    assert connects == []


def test_a_mixed_answer_is_refused_as_a_whole(
    make_caller: Callable[..., HttpWebhookCaller], connects: list[Any]
) -> None:
    caller = make_caller(allow=(), resolver=lambda host, port: ["93.184.215.14", "169.254.169.254"])
    failure = _failure(caller, _job("http://mixed.example/hook"))
    assert "metadata" in str(failure) and connects == []


def test_the_caller_connects_to_the_address_it_checked(
    receiver: Callable[..., Receiver], make_caller: Callable[..., HttpWebhookCaller], connects: list[Any]
) -> None:
    r = receiver()
    caller = make_caller(resolver=lambda host, port: ["127.0.0.1"])
    assert caller(_job(f"http://hooks.test:{r.port}/x"), CTX)["status"] == 200
    assert connects == [("127.0.0.1", r.port)]
    assert r.requests[0].headers["host"] == f"hooks.test:{r.port}"  # the name is kept for Host (and SNI)
