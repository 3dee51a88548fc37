"""Bearer authentication: `Authorization: Bearer jobq_...` -> the token's tenant.

A missing, malformed, unknown or revoked token is `401` with `WWW-Authenticate: Bearer`.
Revocation takes effect on the next request (tokens are looked up, not cached).

A tenant's token sees its tenant only. An operator token sees every tenant: `?tenant_id=T`
confines a request to T (a job id in a path then names T's job; without it, the `default`
tenant's), and lists without it span every tenant. A tenant's token that names another tenant
is `403`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobq.api.errors import ApiError
from jobq.api.state import ApiState, api_state
from jobq.api.tokens import authenticate
from jobq.client import Client
from jobq.models import ApiToken

bearer = HTTPBearer(
    auto_error=False, bearerFormat="jobq_<random>", description="A token from `jobq tokens create --tenant T`."
)


def principal(
    request: Request,
    state: Annotated[ApiState, Depends(api_state)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ApiToken:
    """The caller's token; raises `ApiError(401)` when there is no valid one."""
    if credentials is None:
        raise ApiError(
            401,
            "unauthorized",
            "send Authorization: Bearer <token> (create one with `jobq tokens create --tenant T`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    token = authenticate(state.tenants, credentials.credentials)
    if token is None:
        raise ApiError(
            401,
            "invalid_token",
            "the token is unknown, revoked or malformed",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    request.state.tenant_id = token.tenant_id  # for the access log
    return token


Principal = Annotated[ApiToken, Depends(principal)]


def allowed_scope(token: ApiToken, tenant_id: str | None) -> str | None:
    """The tenant a request by `token` naming `tenant_id` (or none) is confined to; None for an
    operator's request that names no tenant (every tenant). Raises `ApiError(403)` when a tenant's
    token names another tenant."""
    if token.operator:
        return tenant_id
    if tenant_id is not None and tenant_id != token.tenant_id:
        raise ApiError(
            403,
            "tenant_mismatch",
            f"this token belongs to tenant {token.tenant_id!r}: omit tenant_id or send that one",
            field="tenant_id",
        )
    return token.tenant_id


def scoped_client(
    token: Principal,
    state: Annotated[ApiState, Depends(api_state)],
    tenant_id: Annotated[
        str | None,
        Query(
            pattern=r"^[A-Za-z0-9_.\-]{1,128}$",
            description="Operator tokens: confine the request to this tenant. Others may only name their own.",
        ),
    ] = None,
) -> Client:
    """A client confined to the request's tenant (see the module docstring)."""
    return state.client(allowed_scope(token, tenant_id))


ScopedClient = Annotated[Client, Depends(scoped_client)]
