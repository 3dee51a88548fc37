"""`POST /v1/jobs` goes through group commit: concurrent requests share one store transaction,
each answered for its own job (201), its replay (200) or its error."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
from held import HeldStore

from jobq.client import _group
from jobq.deployment import Deployment

from .conftest import Api


def _body(job_id: str) -> dict[str, object]:
    return {"job_id": job_id, "schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "tests.noop"}}


def test_concurrent_posts_share_a_commit_and_keep_idempotency(
    serve_api: Callable[..., Api], deployment: Deployment
) -> None:
    store = HeldStore(deployment.store)
    api = serve_api(dataclasses.replace(deployment, store=store))
    token = api.token("acme")
    posts = [
        (_body("first"), None),
        (_body("keyed"), "key-1"),
        (_body("keyed"), "key-1"),  # the same request again, in the same group
        (_body("plain"), None),
    ]

    def post(body: dict[str, object], key: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **({"Idempotency-Key": key} if key else {})}
        with httpx.Client(base_url=api.url, timeout=30, trust_env=False) as client:
            return client.post("/v1/jobs", json=body, headers=headers)

    try:
        with ThreadPoolExecutor(max_workers=len(posts)) as pool:
            futures = []
            for i, (body, key) in enumerate(posts):
                futures.append(pool.submit(post, body, key))
                deadline = time.monotonic() + 30
                while not (store.entered.is_set() if i == 0 else _group(store).waiting == i):
                    assert time.monotonic() < deadline
                    time.sleep(0.005)
            store.release.set()
            answers = [f.result() for f in futures]
    finally:
        store.release.set()
    assert [a.status_code for a in answers] == [201, 201, 200, 201]
    assert answers[2].headers["Idempotent-Replayed"] == "true"
    assert answers[2].json() == answers[1].json()
    assert store.groups == [["first"], ["keyed", "keyed", "plain"]]
