"""Whole deployments for end-to-end tests, each isolated on the shared servers by its own names.

- `sqlite`: the embedded default, one file.
- `postgres-redis-rabbitmq`: the self-hosted stack (a PostgreSQL schema, a Redis key prefix and a
  RabbitMQ queue prefix of the test's own).
- `dynamodb-redis-sqs`: the AWS stack on moto's real server (a table and a queue prefix of the
  test's own). moto slows down as queues grow, so its workloads are smaller (`scale`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from services import require_postgres, require_rabbitmq, require_redis

from jobq.deployment import Deployment
from jobq.settings import Settings
from jobq.wiring import connect, init_store

STACKS = ("sqlite", "postgres-redis-rabbitmq", "dynamodb-redis-sqs")


@dataclass
class Stack:
    name: str
    urls: dict[str, str]  # store, index, broker, history
    scale: float = 1.0  # share of the full workload this stack runs
    copies: int = 2  # copies of each claiming daemon (beat, scanner, reaper) the e2e test runs
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {f"JOBQ_{role.upper()}": url for role, url in self.urls.items()}

    def connect(self, **overrides: object) -> Deployment:
        return connect(Settings.load({**self.urls, "history_flush_s": 0, **overrides}, env={}))

    def close(self) -> None:
        for cleanup in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                cleanup()


@contextlib.contextmanager
def stack(name: str, tmp_path: Path) -> Iterator[Stack]:
    tag = f"t{uuid.uuid4().hex[:10]}"
    if name == "sqlite":
        built = Stack(name, {"store": f"sqlite:///{tmp_path / 'jobq.db'}"})
    elif name == "postgres-redis-rabbitmq":
        built = _self_hosted(tag)
    elif name == "dynamodb-redis-sqs":
        built = _aws(tag)
    else:
        raise ValueError(name)
    try:
        init_store(Settings.load(built.urls, env={}))
        yield built
    finally:
        built.close()


def _redis_prefix_cleanup(prefix: str) -> Callable[[], None]:
    def cleanup() -> None:
        import redis

        client = redis.Redis.from_url(require_redis())
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()

    return cleanup


def _self_hosted(tag: str) -> Stack:
    pg = require_postgres()
    redis_url = require_redis()
    amqp = require_rabbitmq()
    built = Stack(
        "postgres-redis-rabbitmq",
        {
            "store": f"{pg}?schema={tag}",
            "index": f"{redis_url}?prefix={tag}",
            "broker": f"{amqp}?prefix={tag}",
        },
    )
    built.cleanups += self_hosted_cleanups(tag)
    return built


def self_hosted_cleanups(tag: str) -> list[Callable[[], None]]:
    """Drop what a self-hosted deployment named `tag` left: its schema, index keys and queues."""
    pg = require_postgres()
    amqp = require_rabbitmq()

    def drop_schema() -> None:
        import psycopg

        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE')

    def delete_queues() -> None:
        from kombu import Connection

        with Connection(amqp) as conn:
            channel = conn.default_channel
            for queue in ("critical", "high", "default", "low"):
                with contextlib.suppress(Exception):
                    channel.queue_delete(f"{tag}-{queue}")

    return [drop_schema, _redis_prefix_cleanup(tag), delete_queues]


def _aws(tag: str) -> Stack:
    from moto_server import ACCESS_KEY, REGION, SECRET_KEY, shared_moto_server

    moto = shared_moto_server()
    redis_url = require_redis()
    endpoint = moto.endpoint_url
    credentials = f"aws_access_key_id={ACCESS_KEY}&aws_secret_access_key={SECRET_KEY}"
    built = Stack(
        "dynamodb-redis-sqs",
        {
            "store": f"dynamodb://{tag}?region={REGION}&endpoint={endpoint}&{credentials}",
            "index": f"{redis_url}?prefix={tag}",
            "broker": f"{moto.sqs_url()}&prefix={tag}",
            "history": "memory://",
        },
        scale=0.1,
        # moto's server checks a conditional write's condition and applies it without a lock, so two
        # processes can both win one compare-and-set (real DynamoDB serialises writes per item).
        # Copies of the claiming daemons are tested on the SQL stacks; here one of each runs.
        copies=1,
    )

    def delete_table() -> None:
        moto.client("dynamodb").delete_table(TableName=tag)

    def delete_queues() -> None:
        sqs = moto.client("sqs")
        for url in sqs.list_queues(QueueNamePrefix=tag).get("QueueUrls", []):
            sqs.delete_queue(QueueUrl=url)

    built.cleanups += [delete_table, _redis_prefix_cleanup(tag), delete_queues]
    return built
