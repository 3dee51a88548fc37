"""What the routes share: the deployment, the token store, the network policy and the rate limiter."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from jobq.api.ratelimit import RateLimiter
from jobq.client import Client
from jobq.deployment import Deployment
from jobq.netpolicy import NetPolicy
from jobq.ports import TenantStore


@dataclass(frozen=True)
class ApiState:
    deployment: Deployment
    tenants: TenantStore
    policy: NetPolicy
    limiter: RateLimiter

    def client(self, tenant_id: str | None) -> Client:
        """A client confined to `tenant_id`: another tenant's jobs and runs do not exist for it.
        None (an operator token's scope) is a client of every tenant."""
        return Client(self.deployment, tenant_id=tenant_id)


def api_state(request: Request) -> ApiState:
    state = request.app.state.jobq
    assert isinstance(state, ApiState)
    return state
