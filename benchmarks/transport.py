"""Rough throughput of a transport: publish N bodies in batches, then consume and ack them all.

    python benchmarks/transport.py redis://127.0.0.1:6379/0 --messages 5000
    python benchmarks/transport.py amqp://guest:guest@127.0.0.1:5672// --messages 5000
    python benchmarks/transport.py 'sqs://KEY:SECRET@127.0.0.1:PORT?region=us-east-1' --messages 90

One process, one thread: this measures round trips per message, not the broker's ceiling. Uses
a fresh queue prefix; its queues are left empty, and deleted on RabbitMQ (Redis drops empty lists).
"""

from __future__ import annotations

import argparse
import secrets
import time

import kombu

from jobq.transport.kombu import KombuTransport

QUEUES = ["critical", "default"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--publish-batch", type=int, default=100)
    parser.add_argument("--consume-batch", type=int, default=10)
    parser.add_argument("--body-bytes", type=int, default=300)
    args = parser.parse_args()

    prefix = f"bench{secrets.token_hex(3)}"
    transport = KombuTransport(args.url, prefix=prefix)
    body = b"x" * args.body_bytes
    try:
        started = time.perf_counter()
        for start in range(0, args.messages, args.publish_batch):
            transport.publish("default", [body] * min(args.publish_batch, args.messages - start))
        published_s = time.perf_counter() - started

        started = time.perf_counter()
        received = 0
        while received < args.messages:
            deliveries = transport.consume(QUEUES, max_messages=args.consume_batch, wait_s=1.0)
            if not deliveries:
                break
            transport.ack(deliveries)
            received += len(deliveries)
        consumed_s = time.perf_counter() - started
    finally:
        transport.close()
        if args.url.startswith("amqp"):
            with kombu.Connection(args.url) as connection:
                channel = connection.channel()
                for queue in QUEUES:
                    channel.queue_delete(f"{prefix}-{queue}")

    print(f"publish: {args.messages / published_s:,.0f} msg/s ({args.messages} in {published_s:.2f} s)")
    print(f"consume+ack: {received / consumed_s:,.0f} msg/s ({received} in {consumed_s:.2f} s)")


if __name__ == "__main__":
    main()
