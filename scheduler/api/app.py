"""The app factory: `create_app(deployment)` -> a FastAPI app serving `/v1`, health and metrics,
the OpenAPI document with `/docs` and `/redoc` (offline), and the dashboard at `/ui`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from jobq.api import docs, errors
from jobq.api.middleware import GuardMiddleware
from jobq.api.ratelimit import RateLimiter
from jobq.api.routes import dead_letters, operations, router
from jobq.api.schedules import router as schedules
from jobq.api.state import ApiState
from jobq.api.tokens import tenant_store
from jobq.daemons.registrar import Presence, Registrar, enabled, start_thread
from jobq.deployment import Deployment
from jobq.gauges import register_gauges
from jobq.netpolicy import NetPolicy
from jobq.ports import TenantStore
from jobq.registry import Role

ROUTERS = (router, dead_letters, schedules, operations)  # every route of the API, in this order

DESCRIPTION = """\
Submit, inspect and control jobs; read and redrive dead letters.

Authenticate with `Authorization: Bearer <token>` (`jobq tokens create --tenant T`). A token
sees only its tenant's jobs. Every error is `{"error": {"code", "message", "field", "request_id"}}`.
See docs/api.md for the status codes, idempotency, limits and webhook signatures.
"""


def create_app(
    deployment: Deployment,
    *,
    tenants: TenantStore | None = None,
    policy: NetPolicy | None = None,
    limiter: RateLimiter | None = None,
    close_deployment: bool = False,
    register: bool = False,
) -> FastAPI:
    """A FastAPI app over `deployment`. The token store defaults to the deployment's store, the
    network policy and rate limiter to its settings. With `close_deployment`, the app closes the
    deployment when it shuts down (the `jobq api` process owns it; `jobq dev` does not). With
    `register`, the process enters the daemon registry as an `api` daemon while it serves (`jobq
    api`; in `jobq dev` the process's registrar does it). `/metrics` carries the gauges either way."""
    settings = deployment.settings
    state = ApiState(
        deployment=deployment,
        tenants=tenants or tenant_store(deployment),
        policy=policy or NetPolicy.from_settings(settings),
        limiter=limiter or RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        running = (
            start_thread(Registrar(deployment, [Presence(deployment, Role.API)]))
            if register and enabled(deployment)
            else None
        )
        yield
        if running is not None:
            thread, stop = running
            stop.set()
            thread.join(timeout=5)
        if close_deployment:
            deployment.close()

    app = FastAPI(
        title="jobq",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from package data by `jobq.api.docs`: no CDN
        redoc_url=None,
        openapi_tags=[
            {"name": "jobs", "description": "Jobs, their runs and actions."},
            {"name": "dead letters", "description": "Runs that exhausted their attempts."},
            {"name": "schedules", "description": "Cron expressions: preview fires before submitting."},
            {"name": "operations", "description": "Health, readiness and metrics; no token needed."},
        ],
    )
    app.state.jobq = state
    register_gauges(deployment)
    _publish_required_tags(app)
    errors.install(app)
    for included in ROUTERS:
        app.include_router(included)
    docs.install(app)
    from jobq.ui.pages import install as install_ui  # the dashboard imports the API's modules

    install_ui(app, state)
    app.add_middleware(
        GuardMiddleware, max_body_bytes=settings.api_max_body_bytes, max_header_bytes=settings.api_max_header_bytes
    )
    return app


def _publish_required_tags(app: FastAPI) -> None:
    """Mark each target's `type` as required in the OpenAPI document. The models give it a default
    (so Python callers may omit it), but in a request body it is the union's discriminator: a
    target without it is refused, and the document should say so."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            schemas = document.get("components", {}).get("schemas", {})
            for name in ("TaskTarget", "WebhookTarget"):
                target = schemas.get(name)
                if target is not None and "type" not in target.setdefault("required", []):
                    target["required"].insert(0, "type")
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
