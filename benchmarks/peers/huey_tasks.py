"""Huey instances for the peer benchmark: RedisHuey with defaults (and PriorityRedisHuey, the
storage Huey needs for task priorities, used only by the priority workload)."""

from huey import PriorityRedisHuey, RedisHuey
from record import mark_ready, record, redis_url

huey = RedisHuey("bench", url=redis_url())
huey_prio = PriorityRedisHuey("bench-prio", url=redis_url())


@huey.task(name="noop")
def noop(task_id: int) -> None:
    record(task_id)


@huey_prio.task(name="noop")
def noop_prio(task_id: int) -> None:
    record(task_id)


@huey.on_startup()
def _ready() -> None:
    mark_ready()


@huey_prio.on_startup()
def _ready_prio() -> None:
    mark_ready()
