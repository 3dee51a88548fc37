"""The RQ job function for the peer benchmark (RQ imports it by dotted path)."""

from record import record


def noop(task_id: int) -> None:
    record(task_id)
