"""The self-hosted deployment: PostgreSQL (store, time index fallback, history), Redis (time
index) and RabbitMQ (queues), on this machine's services. One command:

    python -m examples.selfhosted

Override the servers with JOBQ_EXAMPLE_POSTGRES, JOBQ_EXAMPLE_REDIS and JOBQ_EXAMPLE_AMQP, and the
names it uses (a PostgreSQL schema, a Redis key prefix and a queue prefix) with
JOBQ_EXAMPLE_NAME.
"""

from __future__ import annotations

import os
import sys

from examples.deployment import run


def urls() -> dict[str, str]:
    name = os.environ.get("JOBQ_EXAMPLE_NAME", "jobq_example")
    postgres = os.environ.get("JOBQ_EXAMPLE_POSTGRES", "postgresql://127.0.0.1:5432/test")
    redis = os.environ.get("JOBQ_EXAMPLE_REDIS", "redis://127.0.0.1:6379/0")
    amqp = os.environ.get("JOBQ_EXAMPLE_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
    return {
        "store": f"{postgres}?schema={name}",
        "index": f"{redis}?prefix={name}",
        "broker": f"{amqp}?prefix={name}",
    }


if __name__ == "__main__":
    sys.exit(run(urls(), "PostgreSQL + Redis + RabbitMQ"))
