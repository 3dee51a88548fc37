"""Celery app for the peer benchmark: default settings, Redis broker, no result backend."""

from celery import Celery
from celery.signals import worker_ready
from record import mark_ready, record, redis_url

app = Celery("celery_tasks", broker=redis_url())


@app.task(name="bench.noop")
def noop(task_id: int) -> None:
    record(task_id)


@worker_ready.connect
def _ready(**_: object) -> None:
    mark_ready()
