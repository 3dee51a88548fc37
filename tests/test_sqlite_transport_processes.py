"""The SQLite transport across real processes: redelivery after `kill -9`, no double delivery."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobq.transport.sqlite import SqliteTransport

pytestmark = pytest.mark.slow

# Takes one message, reports it on stdout, then hangs without acking until killed.
TAKE_ONE_AND_HANG = """
import sys, time
from jobq.transport.sqlite import SqliteTransport

url, visibility_s = sys.argv[1], float(sys.argv[2])
transport = SqliteTransport.from_url(url, visibility_timeout_s=visibility_s)
[delivery] = transport.consume(["default"], max_messages=1, wait_s=10)
print(delivery.body.decode(), delivery.delivery_count, flush=True)
time.sleep(60)
"""

# Signals it is ready, waits for the go file, then drains the queue, recording each body before
# acking it, until the queue stays empty for half a second. The pause after each batch stands for
# the task's work: a consumer looping on the lock with none can drain the queue before SQLite's
# busy handler (which is not fair) lets the other process in, and the test would prove nothing.
DRAIN = """
import sys, time
from pathlib import Path
from jobq.transport.sqlite import SqliteTransport

url, record, ready, go = sys.argv[1:5]
transport = SqliteTransport.from_url(url, visibility_timeout_s=60)
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.001)
with open(record, "w") as out:
    while deliveries := transport.consume(["default"], max_messages=5, wait_s=0.5):
        out.writelines(d.body.decode() + "\\n" for d in deliveries)
        out.flush()
        transport.ack(deliveries)
        time.sleep(0.001)
transport.close()
"""


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobq.db'}"


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes appended here are killed at teardown if they are still running."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def python(program: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", program, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def read_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    assert ready, f"no output from the consumer within {timeout_s} s"
    return process.stdout.readline().strip()


def wait_for(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(path.exists() for path in paths):
        assert time.monotonic() < deadline, f"not created within {timeout_s} s: {paths}"
        time.sleep(0.01)


def test_a_message_whose_consumer_is_killed_is_redelivered_after_the_visibility_timeout(
    db_url: str, spawn: list[subprocess.Popen[str]]
) -> None:
    visibility_s = 1.5
    transport = SqliteTransport.from_url(db_url, visibility_timeout_s=visibility_s)
    transport.publish("default", [b"job"])
    victim = python(TAKE_ONE_AND_HANG, db_url, str(visibility_s))
    spawn.append(victim)
    assert read_line(victim, timeout_s=10) == "job 1"

    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    killed_at = time.monotonic()

    assert transport.consume(["default"], max_messages=1, wait_s=0) == []
    [delivery] = transport.consume(["default"], max_messages=1, wait_s=visibility_s * 3)
    assert (delivery.body, delivery.delivery_count) == (b"job", 2)
    assert time.monotonic() - killed_at < visibility_s * 2
    transport.ack([delivery])
    assert transport.depth("default") == 0
    transport.close()


def test_two_consumer_processes_never_receive_the_same_message_twice(
    db_url: str, tmp_path: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    sent = [f"m{i}" for i in range(2_000)]
    transport = SqliteTransport.from_url(db_url)
    for start in range(0, len(sent), 200):
        transport.publish("default", [body.encode() for body in sent[start : start + 200]])
    go = tmp_path / "go"
    records = [tmp_path / f"consumer-{n}.txt" for n in range(2)]
    ready = [tmp_path / f"consumer-{n}.ready" for n in range(2)]
    for record, ready_file in zip(records, ready, strict=True):
        spawn.append(python(DRAIN, db_url, str(record), str(ready_file), str(go)))
    wait_for(ready, timeout_s=10)

    go.touch()
    for consumer in spawn:
        _, stderr = consumer.communicate(timeout=20)
        assert consumer.returncode == 0, stderr

    received = [record.read_text().split() for record in records]
    counts = Counter(body for mine in received for body in mine)
    assert [body for body, n in counts.items() if n > 1] == []
    assert set(counts) == set(sent)
    assert all(received), "both consumers should have taken part"
    assert transport.depth("default") == 0
    transport.close()
