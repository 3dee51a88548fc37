"""Dramatiq actors for the peer benchmark: RedisBroker with its default middleware."""

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from record import record, redis_url

broker = RedisBroker(url=redis_url())
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="noop", queue_name="default")
def noop(task_id: int) -> None:
    record(task_id)


# Priority workload only: Dramatiq priorities are per actor (lower runs first) and order the
# messages a worker has prefetched; both actors share the queue and the same body.
@dramatiq.actor(actor_name="noop_critical", queue_name="default", priority=0)
def noop_critical(task_id: int) -> None:
    record(task_id)


@dramatiq.actor(actor_name="noop_low", queue_name="default", priority=100)
def noop_low(task_id: int) -> None:
    record(task_id)
