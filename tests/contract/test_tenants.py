"""The TenantStore contract (API tokens, webhook secrets), on every store backend."""

from __future__ import annotations

import pytest
from factories import T0

from jobq.errors import Conflict
from jobq.models import ApiToken
from jobq.ports import TenantStore

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
