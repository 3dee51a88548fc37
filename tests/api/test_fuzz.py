"""Property-based fuzzing of the OpenAPI document against the app (Schemathesis, in-process ASGI).

Several hundred generated requests across every operation: none may answer 5xx, every answer's
status must be documented for its operation, and every body must match the documented schema
(every error body is `{"error": {...}}` with a request id)."""

from __future__ import annotations

import json

import hypothesis
import pytest
import schemathesis
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobq.api.app import create_app
from jobq.api.ratelimit import RateLimiter
from jobq.api.schemas import ErrorResponse
from jobq.api.tokens import issue_token, tenant_store
from jobq.netpolicy import NetPolicy
from jobq.settings import Settings
from jobq.wiring import connect

from .support import public_resolver

pytestmark = pytest.mark.slow

_deployment = connect(Settings.load({"store": "memory://", "history_flush_s": 0}, env={}))
_deployment.store.register_worker("fuzz-worker", ["billing.aggregate"], ["default"], 0)
_TOKEN = issue_token(tenant_store(_deployment), "fuzz", 0)[1]
_app = create_app(
    _deployment,
    policy=NetPolicy(resolver=public_resolver),  # no DNS and no traffic: every host looks public
    limiter=RateLimiter(1e6, 1_000_000),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", _app)


def error_bodies_match_the_error_schema(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    if response.status_code < 400:
        return None
    body = ErrorResponse.model_validate(json.loads(response.content))
    assert body.error.request_id, "every error names its request id"
    assert "Traceback" not in response.text
    return True


@schema.parametrize()
@hypothesis.settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(hypothesis.HealthCheck),
    database=None,
)
def test_the_api_never_fails_and_always_answers_as_documented(case: schemathesis.Case) -> None:
    if isinstance(case.body, dict) and "tenant_id" in case.body:
        case.body["tenant_id"] = "fuzz"  # another tenant is always 403; let the rest of the body be judged
    case.call_and_validate(
        headers={"Authorization": f"Bearer {_TOKEN}"},
        checks=[
            schemathesis.checks.not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            error_bodies_match_the_error_schema,
        ],
    )
