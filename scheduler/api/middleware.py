"""The ASGI layer in front of every route: request ids, limits, content type, access log, crashes.

Per request, in order: a request id (the caller's `X-Request-Id` when it is short and plain,
else a new one) echoed in the response; `431` when the headers exceed `api_max_header_bytes`;
for a request with a body, `415` unless it is JSON (or, under `/ui/`, the dashboard's urlencoded
forms) and `413` when it exceeds `api_max_body_bytes` (read up to the limit and no further,
whether or not Content-Length was sent); then the app. An exception that escapes the app is
logged with the request id and answered `500` with that id, never with a traceback.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from jobq.api.errors import error_bytes
from jobq.metrics import Counter, Histogram

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_JSON_TYPE = re.compile(r"^application/([a-z0-9.+\-]+\+)?json\s*(;.*)?$", re.I)
_FORM_TYPE = re.compile(r"^application/x-www-form-urlencoded\s*(;.*)?$", re.I)
_FORM_PREFIX = "/ui/"  # the dashboard's forms; every other body is JSON

REQUESTS = Counter("jobq_api_requests_total", "HTTP API requests by route and status.", ("method", "route", "status"))
LATENCY = Histogram("jobq_api_request_seconds", "HTTP API request duration.", ("method", "route"))
API_METRICS: tuple[Counter | Histogram, ...] = (REQUESTS, LATENCY)


class _Reject(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class GuardMiddleware:
    """The outermost layer of the app (inside Starlette's own error middleware)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.log = logging.getLogger("jobq.api")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        given = _header(headers, b"x-request-id")
        rid = given if given is not None and _REQUEST_ID.match(given) else "req_" + secrets.token_hex(8)
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        started = time.perf_counter()
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = int(message["status"])
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            receive = await self._admit(scope, headers, receive)
            await self.app(scope, receive, send_with_id)
        except _Reject as rejected:
            await _send_error(send_with_id, rejected.status, rejected.code, rejected.message, rid)
        except Exception:
            self.log.exception("unhandled error in %s %s", scope["method"], scope["path"], extra={"request_id": rid})
            if not response_started:
                await _send_error(send_with_id, 500, "internal_error", "internal error; quote the request id", rid)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            REQUESTS.inc(method=scope["method"], route=route, status=str(status))
            LATENCY.observe(elapsed, method=scope["method"], route=route)
            self.log.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={"request_id": rid, "tenant_id": state.get("tenant_id"), "duration_ms": round(elapsed * 1000)},
            )

    async def _admit(self, scope: Scope, headers: list[tuple[bytes, bytes]], receive: Receive) -> Receive:
        """Apply the header, content-type and body limits; returns the `receive` the app should use."""
        if sum(len(k) + len(v) + 4 for k, v in headers) > self.max_header_bytes:
            raise _Reject(431, "headers_too_large", f"request headers exceed {self.max_header_bytes} bytes")
        if scope["method"] not in _BODY_METHODS:
            return receive
        length_text = _header(headers, b"content-length")
        chunked = _header(headers, b"transfer-encoding") is not None
        try:
            length = int(length_text) if length_text is not None else None
        except ValueError:
            raise _Reject(400, "bad_request", "Content-Length is not a number") from None
        if length is not None and length > self.max_body_bytes:
            raise _Reject(413, "body_too_large", f"the body is {length} bytes; the limit is {self.max_body_bytes}")
        if not chunked and not length:
            return receive
        content_type = (_header(headers, b"content-type") or "").strip()
        is_form = str(scope["path"]).startswith(_FORM_PREFIX) and _FORM_TYPE.match(content_type)
        if not _JSON_TYPE.match(content_type) and not is_form:
            raise _Reject(415, "unsupported_media_type", "send the body as Content-Type: application/json")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return receive  # the client left; the app will see the disconnect too
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                raise _Reject(413, "body_too_large", f"the body exceeds the limit of {self.max_body_bytes} bytes")
            if not message.get("more_body", False):
                break
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return replay


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_error(send: Send, status: int, code: str, message: str, rid: str) -> None:
    body = error_bytes(status, code, message, rid)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 413:
        headers.append((b"connection", b"close"))  # the unread rest of the body is not worth draining
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
