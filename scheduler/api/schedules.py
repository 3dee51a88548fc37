"""`POST /v1/schedules:preview`: a cron expression's next fires, with what DST moved or skipped.

The same document as `jobq cron --json`. Nothing is stored; a token is required, as everywhere
under `/v1`, so the endpoint is not an anonymous compute service.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from jobq.api.auth import Principal
from jobq.api.routes import COMMON_ERRORS, State
from jobq.api.schemas import ErrorResponse, SchedulePreview
from jobq.cronpreview import PreviewSpec, preview_document

router = APIRouter(responses=COMMON_ERRORS, tags=["schedules"])

EXAMPLES: dict[str, Any] = {
    "new_york": {
        "summary": "A nightly job across the spring-forward day in New York",
        "value": {
            "cron_expression": "30 2 * * *",
            "timezone": "America/New_York",
            "count": 5,
            "after": "2026-03-06T00:00:00Z",
        },
    },
    "hashed": {
        "summary": "H resolved for a job id",
        "value": {"cron_expression": "H H * * *", "job_id": "nightly-report", "count": 3},
    },
}


@router.post(
    "/v1/schedules:preview",
    response_model=SchedulePreview,
    responses={400: {"model": ErrorResponse}},
    summary="Preview a cron schedule",
)
def preview_schedule(
    spec: Annotated[PreviewSpec, Body(openapi_examples=EXAMPLES)], _token: Principal, state: State
) -> dict[str, Any]:
    """The next `count` fires (1-500, within 10 years) in local time and UTC, each marked when a
    DST rule moved it, and the wall times a DST rule dropped, with the reason. An expression
    with `H` needs `job_id`."""
    return preview_document(spec, state.deployment.clock.now_ms())
