"""The quickstart: run it with `jobq dev -A examples.quickstart` and watch the log.

On start it schedules an instant job, a one-off in 5 seconds, a cron job every 10 seconds, a
task that fails twice before it succeeds, and one that always fails and lands on the
dead-letter list. Then try, in another terminal:

    jobq schedule examples.hello --in 10s --kwargs '{"name": "again"}'
    jobq status <job_id>
    jobq dlq list
"""

from __future__ import annotations

import logging

from jobq import App, RetryPolicy, current_context

app = App("quickstart")
log = logging.getLogger("jobq.examples")


@app.task(name="examples.hello", priority="HIGH")
def hello(name: str = "world") -> str:
    log.info("hello, %s", name)
    return f"hello, {name}"


@app.task(name="examples.tick")
def tick() -> None:
    ctx = current_context()
    log.info("tick %s (fence %d)", ctx.run_id, ctx.fence)


@app.task(name="examples.flaky", retry=RetryPolicy(max_retries=3, initial_interval_sec=1, max_interval_sec=2))
def flaky() -> str:
    ctx = current_context()
    if ctx.attempt < 3:
        raise ConnectionError(f"attempt {ctx.attempt}: the service is warming up")
    return f"succeeded at attempt {ctx.attempt}"


@app.task(name="examples.broken", retry=RetryPolicy(max_retries=1, initial_interval_sec=1, max_interval_sec=1))
def broken() -> None:
    raise RuntimeError("this task always fails: see `jobq dlq list`")


@app.on_dev_start
def seed(app: App) -> None:
    # Idempotency keys: restarting `jobq dev` on the same database (within the keys' 24 hours)
    # finds these jobs already scheduled instead of adding another copy of each.
    hello.schedule(args=("jobq",), idempotency_key="quickstart-hello")
    hello.schedule(delay_s=5, kwargs={"name": "five seconds later"}, idempotency_key="quickstart-hello-5s")
    tick.schedule(cron="*/10 * * * * *", job_id="quickstart-tick", idempotency_key="quickstart-tick")
    flaky.schedule(idempotency_key="quickstart-flaky")
    broken.schedule(idempotency_key="quickstart-broken")
    log.info("quickstart jobs scheduled; try `jobq dlq list` in a few seconds")
