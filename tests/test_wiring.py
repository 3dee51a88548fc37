"""URLs choose backends; a backend whose extra is missing is one clear line naming the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from services import require_postgres, require_rabbitmq, require_redis

from jobq.errors import ConfigError
from jobq.settings import Settings
from jobq.wiring import connect


def _kinds(urls: dict[str, str]) -> tuple[str, str, str, str]:
    d = connect(Settings.load({**urls, "history_flush_s": 0}, env={}))
    try:
        return tuple(type(x).__name__ for x in (d.store, d.index, d.transport, d.history))  # type: ignore[return-value]
    finally:
        d.close()


def test_the_default_is_one_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    assert _kinds({"store": url}) == ("SqliteStore", "SqliteTimeIndex", "SqliteTransport", "SqliteHistory")


def test_memory_urls_build_the_in_memory_backends() -> None:
    assert _kinds({"store": "memory://"}) == ("MemoryStore", "MemoryTimeIndex", "MemoryTransport", "MemoryHistory")


def test_the_self_hosted_stack() -> None:
    schema = f"w{uuid.uuid4().hex[:8]}"
    pg = f"{require_postgres()}?schema={schema}"
    urls = {
        "store": pg,
        "index": f"{require_redis()}?prefix={schema}",
        "broker": f"{require_rabbitmq()}?prefix={schema}",
    }
    try:
        assert _kinds(urls) == ("PostgresStore", "RedisTimeIndex", "KombuTransport", "PostgresHistory")
        assert _kinds({**urls, "index": pg})[1] == "PostgresTimeIndex"
    finally:
        import psycopg

        with psycopg.connect(require_postgres(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize(
    ("role", "url", "message"),
    [
        ("store", "mysql://db/jobs", "unsupported store URL"),
        ("index", "memcached://x", "unsupported index URL"),
        ("broker", "kafka://x", "unsupported broker URL"),
        ("history", "ftp://x", "unsupported history URL"),
    ],
)
def test_an_unknown_scheme_names_the_role_and_the_choices(tmp_path: Path, role: str, url: str, message: str) -> None:
    urls = {"store": f"sqlite:///{tmp_path / 'j.db'}", role: url}
    with pytest.raises(ConfigError, match=message):
        _kinds(urls)


def test_the_sqlite_index_must_view_the_sqlite_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give both the same URL"):
        _kinds({"store": f"sqlite:///{tmp_path / 'a.db'}", "index": f"sqlite:///{tmp_path / 'b.db'}"})


BLOCK = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    class Block(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == {module!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    from jobq.cli.main import cli
    cli(prog_name="jobq")
    """
)


@pytest.mark.parametrize(
    ("module", "flag", "url", "extra"),
    [
        ("redis", "--index", "redis://127.0.0.1:6379/0", "redis"),
        ("psycopg", "--store", "postgresql://127.0.0.1:5432/test", "postgres"),
        ("kombu", "--broker", "amqp://guest:guest@127.0.0.1:5672//", "amqp"),
        ("boto3", "--history", "s3://bucket/prefix", "aws"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path, module: str, flag: str, url: str, extra: str) -> None:
    args = ["init", "--store", f"sqlite:///{tmp_path / 'j.db'}", flag, url]
    result = subprocess.run(
        [sys.executable, "-c", BLOCK.format(module=module), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"pip install 'jobq[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_only_the_composition_root_knows_the_composition_root() -> None:
    """No daemon, backend or client imports jobq.wiring at import time: they receive a Deployment
    (jobq.deployment) and check extras with jobq.extras; the CLI and wiring itself may."""
    import ast
    from pathlib import Path

    scheduler = Path(__file__).resolve().parent.parent / "scheduler"
    offenders = []
    for path in sorted(scheduler.rglob("*.py")):
        if path.name == "wiring.py":
            continue
        for node in ast.parse(path.read_text()).body:  # module level only: a lazy import in a function is fine
            if isinstance(node, ast.ImportFrom) and node.module == "jobq.wiring":
                offenders.append(str(path.relative_to(scheduler)))
            if isinstance(node, ast.Import) and any(a.name == "jobq.wiring" for a in node.names):
                offenders.append(str(path.relative_to(scheduler)))
    assert offenders == []
