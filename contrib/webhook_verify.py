"""Verifying jobq webhook calls on the receiving side. Standard library only: copy it freely.

jobq signs every webhook request with the tenant's secret (`whsec_...`, read it with
`TenantStore.tenant_secret`, shown by the operator) and sends:

    X-Jobq-Timestamp: 1790000000                   Unix seconds when the request was signed
    X-Jobq-Signature: v1=5f2b...                   hex HMAC-SHA256(secret, "<timestamp>." + body)
    X-Jobq-Run-Id, Idempotency-Key: <run_id>       the same for every attempt of one run
    X-Jobq-Attempt: 2, X-Jobq-Fence: 17            the attempt, and its fence (only ever grows)

The signed string is the timestamp's decimal digits, one ".", then the raw request body bytes
exactly as received (empty for GET). Verify before parsing the body:

    from jobq.contrib.webhook_verify import verify

    @app.post("/hooks/billing")                    # Flask; any framework works the same way
    def billing():
        body = request.get_data()                  # the raw bytes, not re-serialised JSON
        if not verify(SECRET, request.headers.get("X-Jobq-Timestamp", ""), body,
                      request.headers.get("X-Jobq-Signature", "")):
            return "bad signature", 401
        ...

Then make the effect idempotent: delivery is at-least-once. Deduplicate on `Idempotency-Key`
(one per run), and reject a write whose `X-Jobq-Fence` is lower than one you already accepted
for that run (a stale attempt that lost its lease). Answer 2xx for success, 4xx (not 408/429)
to fail the run for good, 408/429/5xx to have it retried (`Retry-After` is honoured).
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["expected_signature", "verify"]


def expected_signature(secret: str, timestamp: int | str, body: bytes | str) -> str:
    """The `X-Jobq-Signature` value jobq sends for this timestamp and body: `v1=<hex>`."""
    raw = body.encode() if isinstance(body, str) else body
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + raw, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(
    secret: str,
    timestamp: int | str,
    body: bytes | str,
    signature: str,
    tolerance_s: int = 300,
    *,
    now_s: float | None = None,
) -> bool:
    """True when `signature` (the `X-Jobq-Signature` header) signs `timestamp` and `body` with
    `secret`, and the timestamp is within `tolerance_s` of now (which bounds how long a captured
    request can be replayed).

    The header may list several comma-separated `v1=` values (during a secret rotation); one
    match is enough. Comparison is constant-time (`hmac.compare_digest`)."""
    try:
        signed_at = int(str(timestamp).strip())
    except ValueError:
        return False
    current = time.time() if now_s is None else now_s
    if abs(current - signed_at) > tolerance_s:
        return False
    expected = expected_signature(secret, signed_at, body)
    candidates = [part.strip() for part in signature.split(",") if part.strip()]
    matched = False
    for candidate in candidates:
        # Compare every candidate (no early exit), so timing does not say which one matched.
        matched |= hmac.compare_digest(candidate.encode(), expected.encode())
    return matched
