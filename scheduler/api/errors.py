"""One error shape for every failure: `{"error": {"code", "message", "field", "request_id"}}`.

jobq's exceptions are translated here, at the edge, into a status and a stable `code`:

    422 validation_error, invalid_json    the request does not match the schema (pydantic)
    400 invalid_job, invalid_cron, ...    a well-formed job that jobq refuses (InvalidJob)
    400 invalid_query                     a list filter or cursor with text no store can hold
    400 endpoint_refused                  a webhook endpoint the network policy refuses
    413 payload_too_large, body_too_large
    404 job_not_found, run_not_found, not_found
    409 conflict, duplicate_job, idempotency_conflict
    503 unavailable                       the store or broker is unreachable (retry)

A traceback never reaches a client: anything else is a 500 with the request id, and the
exception is logged with that id (`jobq.api.middleware`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobq.errors import (
    Conflict,
    DuplicateJob,
    EndpointRefused,
    IdempotencyConflict,
    InvalidCron,
    InvalidJob,
    InvalidQuery,
    JobNotFound,
    JobqError,
    MissedWindow,
    NotFound,
    PayloadTooLarge,
    RunNotFound,
    ScheduleError,
    StoreUnavailable,
    TransportUnavailable,
    UnknownTask,
    UnknownTimezone,
)

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    431: "headers_too_large",
    500: "internal_error",
    503: "unavailable",
}
# Most specific first: the first class an exception is an instance of decides.
_JOBQ_ERRORS: tuple[tuple[type[JobqError], int, str], ...] = (
    (PayloadTooLarge, 413, "payload_too_large"),
    (EndpointRefused, 400, "endpoint_refused"),
    (InvalidCron, 400, "invalid_cron"),
    (UnknownTimezone, 400, "unknown_timezone"),
    (MissedWindow, 400, "missed_window"),
    (ScheduleError, 400, "invalid_schedule"),
    (UnknownTask, 400, "unknown_task"),
    (InvalidQuery, 400, "invalid_query"),
    (InvalidJob, 400, "invalid_job"),
    (JobNotFound, 404, "job_not_found"),
    (RunNotFound, 404, "run_not_found"),
    (NotFound, 404, "not_found"),
    (IdempotencyConflict, 409, "idempotency_conflict"),
    (DuplicateJob, 409, "duplicate_job"),
    (Conflict, 409, "conflict"),
    (StoreUnavailable, 503, "unavailable"),
    (TransportUnavailable, 503, "unavailable"),
)
_LOCATION_KINDS = {"body", "query", "path", "header", "cookie"}
_UNION_TAGS = {"TASK", "HTTP_WEBHOOK"}  # pydantic puts the discriminator's value into error locations


class ApiError(Exception):
    """An error response decided by the API itself (auth, limits, content type, tenant checks)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    details: list[dict[str, Any]] | None = None,
) -> Response:
    error: dict[str, Any] = {"code": code, "message": message, "field": field, "request_id": request_id}
    if details is not None:
        error["details"] = details
    body = json.dumps({"error": error}, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json", headers=dict(headers or {}))


def error_bytes(status: int, code: str, message: str, request_id: str | None) -> bytes:
    """The same body for the ASGI middleware, which answers before FastAPI is involved."""
    error = {"code": code, "message": message, "field": None, "request_id": request_id}
    return json.dumps({"error": error}, separators=(",", ":")).encode()


def request_id(request: Request) -> str | None:
    value = request.scope.get("state", {}).get("request_id")
    return value if isinstance(value, str) else None


def classify(exc: JobqError) -> tuple[int, str] | None:
    """The status and code for a jobq error, or None when it is a server-side fault (500)."""
    for kind, status, code in _JOBQ_ERRORS:
        if isinstance(exc, kind):
            return status, code
    return None


def field_of(location: tuple[Any, ...] | list[Any]) -> str | None:
    """`("body", "target", "HTTP_WEBHOOK", "endpoint")` -> `"target.endpoint"`."""
    parts = [str(p) for p in location]
    if parts and parts[0] in _LOCATION_KINDS:
        parts = parts[1:]
    parts = [p for p in parts if p not in _UNION_TAGS and "[" not in p]
    return ".".join(parts) or None


_UNPARSED_BODY = "There was an error parsing the body"  # FastAPI's detail when json.loads raised


def allowed_methods(request: Request) -> set[str]:
    """Every method some route of the API serves at the request's path (`jobq.api.app.ROUTERS`)."""
    from jobq.api.app import ROUTERS

    path = request.url.path
    methods: set[str] = set()
    for router in ROUTERS:
        for route in router.routes:
            regex = getattr(route, "path_regex", None)
            if regex is not None and regex.match(path):
                methods |= set(getattr(route, "methods", None) or ())
    return methods | ({"HEAD"} if "GET" in methods else set())


def install(app: FastAPI) -> None:
    """Register the handlers that turn exceptions into the error shape."""

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(
            exc.status, exc.code, exc.message, field=exc.field, request_id=request_id(request), headers=exc.headers
        )

    async def on_jobq_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, JobqError)
        found = classify(exc)
        if found is None:
            raise exc  # a server-side fault: the middleware logs it and answers 500
        status, code = found
        field = getattr(exc, "field", None)
        headers = {"Retry-After": "1"} if status == 503 else None
        message = getattr(exc, "message", None) or str(exc)
        return error_response(status, code, message, field=field, request_id=request_id(request), headers=headers)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        details = [{"field": field_of(e.get("loc", ())), "message": str(e.get("msg", "invalid"))} for e in errors]
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            code, message, field = "invalid_json", "the body is not valid JSON", None
        else:
            field = field_of(first.get("loc", ()))
            message = str(first.get("msg", "invalid request"))
            message = f"{field}: {message}" if field else message
            code = "validation_error"
        return error_response(422, code, message, field=field, request_id=request_id(request), details=details)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and str(exc.detail).startswith(_UNPARSED_BODY):
            # A body json.loads gives up on (nested too deep) is invalid JSON like any other.
            message = "the body is not valid JSON (nested too deeply?)"
            return error_response(422, "invalid_json", message, request_id=request_id(request))
        if exc.status_code == 405:
            # Starlette names the methods of the first route whose path matches; a path served by
            # several routes (GET and DELETE /v1/jobs/{id}) allows all of theirs.
            allow = ", ".join(sorted({*allowed_methods(request), "OPTIONS"}))
            if request.method == "OPTIONS":
                return Response(status_code=204, headers={"Allow": allow})
            return error_response(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed here; allowed: {allow}",
                request_id=request_id(request),
                headers={"Allow": allow},
            )
        code = _STATUS_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        if exc.status_code == 404:
            message = f"no resource at {request.url.path}"
        return error_response(exc.status_code, code, message, request_id=request_id(request), headers=exc.headers)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(JobqError, on_jobq_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
