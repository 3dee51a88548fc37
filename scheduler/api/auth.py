"""Bearer authentication: `Authorization: Bearer jobq_...` -> the token's tenant.

A missing, malformed, unknown or revoked token is `401` with `WWW-Authenticate: Bearer`.
Revocation takes effect on the next request (tokens are looked up, not cached).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobq.api.errors import ApiError
from jobq.api.state import ApiState, api_state
from jobq.api.tokens import authenticate
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
