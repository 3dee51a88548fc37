"""The API's /metrics carries the gauges; a `jobq api` process is in the daemon registry while it serves."""

from __future__ import annotations

import asyncio
import time

from jobq.api.app import create_app
from jobq.deployment import Deployment
from jobq.registry import Role

from .conftest import Api


def test_the_api_metrics_carry_the_gauges(api: Api) -> None:
    text = api.client().get("/metrics").text
    for name in ("jobq_queue_backlog", "jobq_due_undispatched", "jobq_dead_letters", "jobq_daemons_alive"):
        assert f"# TYPE {name} gauge" in text
    assert 'jobq_daemons_alive{role="api"}' in text


def test_an_api_process_registers_while_it_serves_and_leaves_when_it_stops(deployment: Deployment) -> None:
    app = create_app(deployment, register=True)
    seen: list[Role] = []

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            for _ in range(200):
                seen[:] = [r.role for r in deployment.registry.live_daemons(deployment.clock.now_ms())]
                if seen:
                    return
                time.sleep(0.05)

    asyncio.run(serve())
    assert seen == [Role.API]
    assert deployment.registry.live_daemons(deployment.clock.now_ms()) == []
