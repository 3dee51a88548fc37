"""Calling HTTP_WEBHOOK targets: the worker's `WebhookCaller` over a real, pooled HTTP client.

Every call carries, besides the target's own headers:

    Idempotency-Key: <run_id>          the same for every attempt of a run
    X-Jobq-Run-Id, X-Jobq-Job-Id, X-Jobq-Attempt, X-Jobq-Fence
    X-Jobq-Timestamp: <unix seconds>
    X-Jobq-Signature: v1=<hex HMAC-SHA256(tenant secret, f"{timestamp}.{body}")>

The body is the job's payload as compact JSON (no body for GET). The signed string is the
timestamp's decimal digits, one ".", then the exact body bytes; `jobq.contrib.webhook_verify`
checks it on the receiving side. The secret is the tenant's (`TenantStore.tenant_secret`).

Outcomes: 2xx succeeds and keeps `{"status", "body"}` (the first `webhook_response_bytes` of the
body) on the run. 408, 429, 5xx, timeouts and connection errors raise a retryable
`WebhookFailed` that carries the server's `Retry-After`; other 4xx, 3xx (redirects are never
followed) and addresses refused by the network policy raise a non-retryable one.

One `httpx.Client` per caller (one per worker process), shared by the worker's threads, keeps
connections alive between calls. Its connections are opened by `GuardedBackend`, which resolves
the host, checks every address with the `NetPolicy` and connects to a checked address, so DNS
rebinding cannot redirect a call; TLS still verifies the certificate against the host name.
Environment proxies are ignored on purpose: through a proxy the policy would check the wrong
address.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import hmac
import json
import re
import secrets
import ssl
import threading
from collections.abc import Iterable
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from jobq import tracing
from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.deployment import Deployment
from jobq.errors import EndpointRefused, InvalidJob, WebhookFailed
from jobq.models import Job, WebhookTarget
from jobq.netpolicy import NetPolicy
from jobq.ports import TenantStore
from jobq.tasks import TaskContext

SIGNATURE_VERSION = "v1"
USER_AGENT = "jobq-webhook/1"
MAX_RETRY_AFTER_S = 86_400.0  # a server asking for more than a day is capped at a day
MAX_HEADER_VALUE_BYTES = 8192
RETRYABLE_STATUSES = frozenset({408, 429})
# Headers a target may not set: jobq owns them (signature, idempotency) or the HTTP client does.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "idempotency-key",
        "traceparent",  # the W3C trace context of the attempt (`jobq.tracing`)
        "tracestate",
    }
)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 field-name


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Jobq-Signature` value: `v1=` + hex HMAC-SHA256 of `f"{timestamp}."` + body."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={mac.hexdigest()}"


def parse_retry_after(value: str | None, now_s: float) -> float | None:
    """Seconds to wait from a `Retry-After` value (delay-seconds or an HTTP date), capped at a day;
    None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - now_s), MAX_RETRY_AFTER_S)


def check_target(target: WebhookTarget, policy: NetPolicy, max_headers: int, *, resolve: bool = False) -> None:
    """Refuse a webhook target before it is stored: too many or reserved or malformed headers
    (`InvalidJob`), or an endpoint the network policy refuses (`EndpointRefused`): its form and
    port, an IP literal, `localhost`; its host name is resolved only when `resolve` (the call
    checks it again, resolved, every time). Opens no connection."""
    if len(target.headers) > max_headers:
        raise InvalidJob(
            f"a webhook target has at most {max_headers} headers ({len(target.headers)} given)", field="target.headers"
        )
    for name, value in target.headers.items():
        lower = name.lower()
        if not _TOKEN.match(name):
            raise InvalidJob(f"header name {name!r} is not a valid HTTP field name", field="target.headers")
        if lower in RESERVED_HEADERS or lower.startswith("x-jobq-"):
            raise InvalidJob(f"header {name!r} is set by jobq and cannot be given", field="target.headers")
        if any(c in value for c in "\r\n\0") or len(value.encode()) > MAX_HEADER_VALUE_BYTES:
            raise InvalidJob(f"header {name!r} has a value with line breaks or over 8 KiB", field="target.headers")
    policy.check_submitted(target.endpoint, resolve=resolve)


class GuardedBackend(httpcore.SyncBackend):
    """Opens TCP connections only to addresses the policy allows: resolves the host once, refuses
    the connection if any address is refused, then connects to the checked addresses in turn."""

    def __init__(self, policy: NetPolicy) -> None:
        self.policy = policy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self.policy.resolve(host, port)  # EndpointRefused propagates to the caller
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in addresses:
            try:
                return super().connect_tcp(str(address), port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # resolve() never returns an empty list
        raise failure


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context of every webhook call: verified against certifi's CA bundle, made once per
    process (loading the bundle costs ~20 ms; a context is shared safely by connections and threads)."""
    return httpx.create_ssl_context(trust_env=False)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's transport with its connection pool opening sockets through `GuardedBackend`."""

    def __init__(self, policy: NetPolicy, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits()
        ssl_context = _tls()
        super().__init__(verify=ssl_context, trust_env=False, limits=limits)
        # httpx builds its pool without a way to pass a network backend; replace it with an
        # identical pool that has one. Checked by tests/api/test_webhooks.py (refusal, reuse).
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(policy),
        )


class HttpWebhookCaller:
    """The worker's `WebhookCaller`: one signed HTTP request per attempt. Thread-safe."""

    def __init__(
        self,
        tenants: TenantStore,
        policy: NetPolicy,
        *,
        response_bytes: int = 4096,
        clock: Clock = SYSTEM_CLOCK,
        transport: httpx.BaseTransport | None = None,
        max_connections: int = 100,
    ) -> None:
        self.tenants = tenants
        self.policy = policy
        self.response_bytes = response_bytes
        self.clock = clock
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.client = httpx.Client(
            transport=transport or GuardedTransport(policy, limits),
            follow_redirects=False,
            trust_env=False,
            headers={"User-Agent": USER_AGENT},
        )
        self._secrets: dict[str, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_deployment(cls, d: Deployment, tenants: TenantStore, **options: Any) -> HttpWebhookCaller:
        return cls(
            tenants,
            NetPolicy.from_settings(d.settings),
            response_bytes=d.settings.webhook_response_bytes,
            clock=d.clock,
            **options,
        )

    def secret(self, tenant_id: str) -> str:
        """The tenant's signing secret, created in the store on first use and cached (it never changes)."""
        with self._lock:
            known = self._secrets.get(tenant_id)
        if known is None:
            known = self.tenants.tenant_secret(tenant_id, "whsec_" + secrets.token_urlsafe(32))
            with self._lock:
                self._secrets[tenant_id] = known
        return known

    def headers(self, job: Job, ctx: TaskContext, body: bytes) -> dict[str, str]:
        """The request headers: the target's own (minus reserved ones), then jobq's."""
        target = job.target
        assert isinstance(target, WebhookTarget)
        out = {k: v for k, v in target.headers.items() if not _reserved(k)}
        if body and not any(k.lower() == "content-type" for k in out):
            out["Content-Type"] = "application/json"
        timestamp = self.clock.now_ms() // 1000
        out.update(
            {
                "Accept-Encoding": "identity",  # the stored excerpt is the body as sent, never a decompression bomb
                "Idempotency-Key": ctx.run_id,
                "X-Jobq-Run-Id": ctx.run_id,
                "X-Jobq-Job-Id": job.job_id,
                "X-Jobq-Attempt": str(ctx.attempt),
                "X-Jobq-Fence": str(ctx.fence),
                "X-Jobq-Timestamp": str(timestamp),
                "X-Jobq-Signature": sign(self.secret(job.tenant_id), timestamp, body),
            }
        )
        return out

    def __call__(self, job: Job, ctx: TaskContext) -> dict[str, Any]:
        """Call the job's target once. Returns `{"status", "body"}` on 2xx; raises `WebhookFailed`."""
        target = job.target
        if not isinstance(target, WebhookTarget):
            raise WebhookFailed(f"job {job.job_id} has no HTTP_WEBHOOK target", retryable=False)
        body = b"" if target.method == "GET" else json.dumps(job.payload, separators=(",", ":")).encode()
        where = _display(target.endpoint)
        attributes = {"http.request.method": target.method, "url.full": where, **_server(target.endpoint)}
        with tracing.span(f"jobq.webhook {target.method}", kind="client", attributes=attributes) as span:
            headers = self.headers(job, ctx, body)
            tracing.inject(headers, fallback=ctx.trace)  # the receiver continues this span's trace
            try:
                return self._send(target, body, headers, where, span)
            except WebhookFailed as exc:
                tracing.record_error(span, exc, str(exc))
                raise

    def _send(
        self, target: WebhookTarget, body: bytes, headers: dict[str, str], where: str, span: Any
    ) -> dict[str, Any]:
        try:
            self.policy.parse(target.endpoint)  # scheme and credentials; addresses are checked on connect
            with self.client.stream(
                target.method,
                target.endpoint,
                content=body or None,
                headers=headers,
                timeout=httpx.Timeout(target.timeout_seconds),
            ) as response:
                result = {"status": response.status_code, "body": self._read_start(response)}
                retry_after = parse_retry_after(response.headers.get("retry-after"), self.clock.now_ms() / 1000)
                location = response.headers.get("location", "")
        except EndpointRefused as exc:
            raise WebhookFailed(f"refused by the network policy: {exc}", retryable=False) from None
        except httpx.TimeoutException as exc:
            raise WebhookFailed(
                f"{where} timed out after {target.timeout_seconds:g} s ({type(exc).__name__})", retryable=True
            ) from None
        except (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL) as exc:
            raise WebhookFailed(f"cannot call {where}: {exc}", retryable=False) from None
        except httpx.TransportError as exc:
            raise WebhookFailed(f"{where}: {type(exc).__name__}: {exc}", retryable=True) from None
        status = response.status_code
        tracing.set_attributes(span, {"http.response.status_code": status})
        if 200 <= status < 300:
            return result
        if status in RETRYABLE_STATUSES or 500 <= status < 600:
            raise WebhookFailed(f"HTTP {status} from {where}", retryable=True, retry_after_s=retry_after, result=result)
        if 300 <= status < 400:
            shown = _display(location) if location else "no Location"
            message = f"HTTP {status} from {where}: redirects are not followed ({shown})"
            raise WebhookFailed(message, retryable=False, result=result)
        raise WebhookFailed(f"HTTP {status} from {where}", retryable=False, result=result)

    def _read_start(self, response: httpx.Response) -> str:
        """The first `response_bytes` of the body as text; the rest is never downloaded."""
        if self.response_bytes <= 0:
            return ""
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= self.response_bytes:
                break
        return b"".join(chunks)[: self.response_bytes].decode("utf-8", errors="replace")

    def close(self) -> None:
        self.client.close()


def _reserved(name: str) -> bool:
    lower = name.lower()
    return lower in RESERVED_HEADERS or lower.startswith("x-jobq-")


def _server(url: str) -> dict[str, str | int]:
    """The `server.address` and `server.port` span attributes of `url` (none when it does not parse)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return {}
    return {"server.address": parts.hostname or "", "server.port": port}


def _display(url: str) -> str:
    """The URL without credentials, query string and fragment (they may carry secrets), for errors and logs."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(invalid URL)"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{parts.path}"
