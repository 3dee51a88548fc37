"""API tokens: `jobq_<random>` secrets shown once, stored as their SHA-256, mapped to one tenant (or,
for an operator token, to every tenant: `jobq.models.OPERATOR_TENANT`)."""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import cast

from jobq.deployment import Deployment
from jobq.errors import ConfigError, InvalidJob
from jobq.models import OPERATOR_TENANT, ApiToken
from jobq.ports import TenantStore

TOKEN_PREFIX = "jobq_"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")  # as JobSpec.tenant_id
_TOKEN_SHAPE = re.compile(r"^jobq_[A-Za-z0-9_\-]{20,100}$")
_TENANT_METHODS = ("put_token", "find_token", "list_tokens", "revoke_token", "tenant_secret")


def tenant_store(d: Deployment) -> TenantStore:
    """The deployment's store as a `TenantStore`; raises `ConfigError` for a store that keeps no tokens."""
    store = d.store
    if not all(callable(getattr(store, name, None)) for name in _TENANT_METHODS):
        raise ConfigError("store", d.settings.store_url, "this store backend keeps no API tokens or webhook secrets")
    return cast(TenantStore, store)


def hash_token(token: str) -> str:
    """The stored form of a token: hex SHA-256. Tokens are 256-bit random, so no salt or KDF is needed."""
    return hashlib.sha256(token.encode()).hexdigest()


def well_formed(token: str) -> bool:
    """Whether `token` has the shape of a jobq token (checked before any store lookup)."""
    return bool(_TOKEN_SHAPE.match(token))


def issue_token(tenants: TenantStore, tenant_id: str | None, now_ms: int, name: str = "") -> tuple[ApiToken, str]:
    """Create and store a token for `tenant_id`, or an operator token (every tenant) when it is None;
    returns the record and the secret (shown once)."""
    if tenant_id is None:
        tenant_id = OPERATOR_TENANT
    elif not TENANT_PATTERN.match(tenant_id):
        raise InvalidJob(f"tenant id {tenant_id!r} must be 1-128 of A-Z a-z 0-9 _ . -", field="tenant_id")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = ApiToken(
        token_id="tok_" + secrets.token_hex(6),
        tenant_id=tenant_id,
        name=name[:200],
        token_hash=hash_token(secret),
        created_ms=now_ms,
    )
    tenants.put_token(record)
    return record, secret


def authenticate(tenants: TenantStore, token: str) -> ApiToken | None:
    """The active token record for `token`, or None (malformed, unknown or revoked)."""
    if not well_formed(token):
        return None
    record = tenants.find_token(hash_token(token))
    return record if record is not None and record.active else None
