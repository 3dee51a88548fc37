"""`jobq tokens create|list|revoke` and the `api` command's options."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from jobq.api.tokens import authenticate, tenant_store
from jobq.cli.main import cli
from jobq.settings import Settings
from jobq.wiring import connect


def _run(tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}"}
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def test_a_token_is_shown_once_stored_hashed_listed_and_revoked(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "tokens", "create", "--tenant", "acme", "--name", "billing", "--json")
    assert code == 0, out
    created = json.loads(out)
    assert created["token"].startswith("jobq_") and created["tenant_id"] == "acme"
    d = connect(Settings.load({"store": f"sqlite:///{tmp_path / 'jobq.db'}"}, env={}))
    try:
        tenants = tenant_store(d)
        [stored] = tenants.list_tokens("acme")
        assert created["token"] not in stored.model_dump_json()  # only the hash is kept
        assert authenticate(tenants, created["token"]) == stored
        code, out = _run(tmp_path, "tokens", "list", "--json")
        assert code == 0 and [t["token_id"] for t in json.loads(out)] == [created["token_id"]]
        assert "jobq_" not in out
        code, out = _run(tmp_path, "tokens", "revoke", created["token_id"])
        assert code == 0 and created["token_id"] in out
        assert authenticate(tenants, created["token"]) is None
    finally:
        d.close()
    code, out = _run(tmp_path, "tokens", "revoke", created["token_id"])
    assert code == 2 and "no active token" in out


def test_quiet_prints_only_the_token(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "tokens", "create", "--tenant", "acme", "-q")
    assert code == 0 and out.strip().startswith("jobq_") and len(out.strip().splitlines()) == 1


def test_a_bad_tenant_id_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "tokens", "create", "--tenant", "no spaces please")
    assert code == 2 and "tenant id" in out


def test_the_api_and_dev_commands_take_their_options() -> None:
    api_help = CliRunner().invoke(cli, ["api", "--help"]).output
    assert all(option in api_help for option in ("--host", "--port", "--workers"))
    dev_help = CliRunner().invoke(cli, ["dev", "--help"]).output
    assert "--no-api" in dev_help and "--api-port" in dev_help


def test_an_operator_token_is_created_with_operator_and_listed_as_one(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "tokens", "create", "--operator", "--name", "ops", "--json")
    assert code == 0, out
    created = json.loads(out)
    assert created["operator"] is True and created["tenant_id"] is None
    _run(tmp_path, "tokens", "create", "--tenant", "acme")
    code, out = _run(tmp_path, "tokens", "list", "--operator", "--json")
    assert code == 0 and [(t["token_id"], t["operator"]) for t in json.loads(out)] == [(created["token_id"], True)]
    code, out = _run(tmp_path, "tokens", "list")
    assert code == 0 and "* (operator)" in out


def test_a_token_needs_exactly_one_of_tenant_or_operator(tmp_path: Path) -> None:
    for args in ((), ("--tenant", "acme", "--operator")):
        code, out = _run(tmp_path, "tokens", "create", *args)
        assert code == 2 and "--operator" in out and len(out.strip().splitlines()) == 1
