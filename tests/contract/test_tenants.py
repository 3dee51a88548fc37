"""The TenantStore contract (API tokens, webhook secrets), on every store backend."""

from __future__ import annotations

import pytest
from factories import T0

from jobq.client import Client
from jobq.daemons.base import event
from jobq.deployment import Deployment
from jobq.errors import Conflict, DuplicateJob, IdempotencyConflict, JobNotFound
from jobq.models import OPERATOR_TENANT, ApiToken, JobKey, JobStatus, RunState, TaskTarget
from jobq.ports import JobQuery, TenantStore
from jobq.submission import JobSpec

from .deployed import deployed  # noqa: F401 - a deployment over the store under test
from .test_store import store  # noqa: F401 - the parametrised fixture over every backend


def _token(token_id: str = "tok_1", tenant: str = "t1", digest: str = "h1", at: int = T0) -> ApiToken:
    return ApiToken(token_id=token_id, tenant_id=tenant, name="ci", token_hash=digest, created_ms=at)


def test_a_token_is_found_by_its_hash(store: TenantStore) -> None:  # noqa: F811
    store.put_token(_token())
    found = store.find_token("h1")
    assert found is not None and (found.token_id, found.tenant_id, found.active) == ("tok_1", "t1", True)
    assert store.find_token("other") is None


def test_a_token_id_or_hash_cannot_be_reused(store: TenantStore) -> None:  # noqa: F811
    store.put_token(_token())
    with pytest.raises(Conflict):
        store.put_token(_token(digest="h2"))
    with pytest.raises(Conflict):
        store.put_token(_token(token_id="tok_2"))


def test_tokens_are_listed_per_tenant_oldest_first(store: TenantStore) -> None:  # noqa: F811
    store.put_token(_token("tok_b", "t1", "hb", T0 + 2))
    store.put_token(_token("tok_a", "t1", "ha", T0 + 1))
    store.put_token(_token("tok_c", "t2", "hc", T0))
    assert [t.token_id for t in store.list_tokens("t1")] == ["tok_a", "tok_b"]
    assert [t.token_id for t in store.list_tokens()] == ["tok_c", "tok_a", "tok_b"]


def test_revoking_is_idempotent_and_keeps_the_record(store: TenantStore) -> None:  # noqa: F811
    store.put_token(_token())
    assert store.revoke_token("tok_1", T0 + 5)
    assert not store.revoke_token("tok_1", T0 + 6)
    assert not store.revoke_token("tok_missing", T0)
    found = store.find_token("h1")
    assert found is not None and found.revoked_ms == T0 + 5 and not found.active


def test_a_tenant_secret_is_created_once(store: TenantStore) -> None:  # noqa: F811
    first = store.tenant_secret("t1", "secret-a")
    assert first == "secret-a"
    assert store.tenant_secret("t1", "secret-b") == "secret-a"
    assert store.tenant_secret("t2", "secret-c") == "secret-c"


# -- jobs of two tenants with the same id, through the client, on every store --------------------


def _spec(tenant_id: str, job_id: str = "shared", **fields: object) -> JobSpec:
    body = {"tenant_id": tenant_id, "job_id": job_id, "target": TaskTarget(task="tests.noop"), **fields}
    return JobSpec.model_validate({"schedule_type": "CRON", "cron_expression": "*/1 * * * * *", **body})


def test_two_tenants_hold_the_same_job_id_independently(deployed: Deployment) -> None:  # noqa: F811
    acme, globex = Client(deployed, tenant_id="acme"), Client(deployed, tenant_id="globex")
    assert acme.submit(_spec("acme", job_name="acme's")).created
    assert globex.submit(_spec("globex", job_name="globex's")).created
    with pytest.raises(DuplicateJob):
        acme.submit(_spec("acme"))
    assert (acme.job("shared").name, globex.job("shared").name) == ("acme's", "globex's")
    assert [(j.tenant_id, j.job_id) for j in acme.list(JobQuery()).items] == [("acme", "shared")]
    assert [(j.tenant_id, j.job_id) for j in globex.list(JobQuery()).items] == [("globex", "shared")]
    assert {r.run_id.split(":")[0] for r in acme.runs("shared").items} == {"acme/shared"}
    assert {r.tenant_id for r in globex.runs("shared").items} == {"globex"}
    assert acme.get("shared").counts == globex.get("shared").counts == {"SCHEDULED": 2}


def test_a_tenant_never_finds_another_tenants_job(deployed: Deployment) -> None:  # noqa: F811
    Client(deployed, tenant_id="acme").submit(_spec("acme", "secret"))
    globex = Client(deployed, tenant_id="globex")
    for ref in ("secret", "acme/secret", JobKey("acme", "secret")):
        with pytest.raises(JobNotFound) as raised:
            globex.get(ref)
        assert "acme" not in str(raised.value)
    operator = Client(deployed)  # not confined: names a job as TENANT/JOB_ID
    assert operator.get("acme/secret").job.key == JobKey("acme", "secret")
    with pytest.raises(JobNotFound):
        operator.get("secret")  # the tenant `default` has no such job


def test_cancelling_one_tenants_job_leaves_the_other_tenants_job_and_runs(deployed: Deployment) -> None:  # noqa: F811
    acme, globex = Client(deployed, tenant_id="acme"), Client(deployed, tenant_id="globex")
    acme.submit(_spec("acme"))
    globex.submit(_spec("globex"))
    assert acme.cancel("shared").status is JobStatus.CANCELLED
    assert {r.state for r in acme.runs("shared").items} == {RunState.CANCELLED}
    assert globex.job("shared").status is JobStatus.ACTIVE
    assert {r.state for r in globex.runs("shared").items} == {RunState.SCHEDULED}
    globex.pause("shared")
    globex.resume("shared")
    assert acme.job("shared").status is JobStatus.CANCELLED


def test_history_is_read_per_tenant(deployed: Deployment) -> None:  # noqa: F811
    acme, globex = Client(deployed, tenant_id="acme"), Client(deployed, tenant_id="globex")
    acme.submit(_spec("acme"))
    globex.submit(_spec("globex"))
    runs = [*acme.runs("shared").items[:1], *globex.runs("shared").items]
    deployed.history.record([event(r, "STARTED", T0) for r in runs])
    assert [e.tenant_id for e in acme.history("shared")] == ["acme"]
    assert [e.tenant_id for e in globex.history("shared")] == ["globex", "globex"]


def test_the_same_idempotency_key_and_job_id_in_two_tenants_make_two_jobs(deployed: Deployment) -> None:  # noqa: F811
    acme, globex = Client(deployed, tenant_id="acme"), Client(deployed, tenant_id="globex")
    first = acme.submit(_spec("acme", job_name="a"), idempotency_key="key-1")
    other = globex.submit(_spec("globex", job_name="g"), idempotency_key="key-1")
    assert first.created and other.created
    again = acme.submit(_spec("acme", job_name="a"), idempotency_key="key-1")
    assert (again.created, again.job.tenant_id, again.job.name) == (False, "acme", "a")
    with pytest.raises(IdempotencyConflict):
        globex.submit(_spec("globex", job_name="changed"), idempotency_key="key-1")


def test_an_operator_token_is_stored_as_one_and_listed_apart(store: TenantStore) -> None:  # noqa: F811
    store.put_token(_token("tok_op", OPERATOR_TENANT, "hop"))
    store.put_token(_token("tok_t1", "t1", "ht1", T0 + 1))
    found = store.find_token("hop")
    assert found is not None and found.operator and found.scope is None
    tenant = store.find_token("ht1")
    assert tenant is not None and not tenant.operator and tenant.scope == "t1"
    assert [t.token_id for t in store.list_tokens(OPERATOR_TENANT)] == ["tok_op"]
