"""Which store and broker clients cooperate with gevent once `jobq worker -P gevent` has
monkey-patched the process: a client that yields to the hub while it waits lets other greenlets run
their calls at the same time; one that blocks the hub runs them one after another.

Checked in a fresh interpreter (patching must come first, and must not touch pytest's process):
ten greenlets each make one call that waits on the server; the script reports how many were
inside their call at once. Cooperative clients reach all ten; a blocking one stays at one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from services import require_postgres, require_redis

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    from gevent import monkey; monkey.patch_all()
    import sys, gevent

    inside = 0
    most = 0

    def call(fn):
        global inside, most
        inside += 1
        most = max(most, inside)
        try:
            fn()
        finally:
            inside -= 1

    kind, url = sys.argv[1], sys.argv[2]
    if kind == "postgres":
        import psycopg

        def fn():
            with psycopg.connect(url) as conn:
                conn.execute("SELECT pg_sleep(0.3)")
    else:
        import redis

        def fn():
            client = redis.Redis.from_url(url)
            client.blpop("jobq-test-gevent-nothing", timeout=1)
            client.close()

    gevent.joinall([gevent.spawn(call, fn) for _ in range(10)], raise_error=True)
    print(most)
    """
)


def most_at_once(kind: str, url: str) -> int:
    pytest.importorskip("gevent", reason="needs jobq[gevent]")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind, url], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_psycopg_yields_to_the_gevent_hub_while_postgres_works() -> None:
    assert most_at_once("postgres", require_postgres()) == 10


def test_redis_py_yields_to_the_gevent_hub_while_redis_blocks() -> None:
    assert most_at_once("redis", require_redis()) == 10
