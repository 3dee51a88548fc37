"""The curl example of docs/api.md (also in the README), run as written against `jobq dev`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from procs import wait_until
from services import free_port, port_open

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "api.md").read_text()
README = (REPO / "README.md").read_text()

pytestmark = pytest.mark.slow


def curl_example() -> str:
    """The curl block of the README, which docs/api.md repeats word for word."""
    match = re.search(r"<!-- api:curl -->\s*```sh\n(.*?)```", DOCS, re.S)
    assert match, "docs/api.md has no api:curl block"
    readme = re.search(r"<!-- readme:curl -->\s*```sh\n(.*?)```", README, re.S)
    assert readme, "README has no readme:curl block"
    assert readme.group(1) == match.group(1)
    return readme.group(1)


def test_the_documented_curl_command_creates_a_job_on_jobq_dev(tmp_path: Path) -> None:
    command = curl_example()
    assert command.lstrip().startswith("curl -s -X POST http://127.0.0.1:8080/v1/jobs")
    port = 8080
    if port_open("127.0.0.1", port):  # something else has the documented port here: use another
        port = free_port()
        command = command.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    env = {**os.environ, "JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        dev = subprocess.Popen(
            [sys.executable, "-m", "jobq.cli", "dev", "-A", "examples.quickstart", "--api-port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        wait_until(lambda: "export TOKEN=" in log.read_text() and port_open("127.0.0.1", port), 60, "jobq dev's API")
        token = re.search(r"export TOKEN=(\S+)", log.read_text())
        assert token, log.read_text()
        # curl reads $CURL_HOME/.curlrc: it makes the command, unchanged, also print the status.
        (tmp_path / ".curlrc").write_text('write-out = "\\n%{http_code}\\n"\n')
        result = subprocess.run(
            ["sh", "-c", command],
            env={**env, "TOKEN": token.group(1), "CURL_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        *body, status = result.stdout.strip().splitlines()
        assert (result.returncode, status) == (0, "201"), (result.stdout, result.stderr, log.read_text()[-3000:])
        created = json.loads("\n".join(body))
        assert created["status"] == "SCHEDULED" and created["tenant_id"] == "default"
        headers = {"Authorization": f"Bearer {token.group(1)}"}
        job = httpx.get(f"http://127.0.0.1:{port}/v1/jobs/{created['job_id']}", headers=headers, timeout=5)
        assert job.status_code == 200 and job.json()["task"] == "examples.hello"
    finally:
        dev.send_signal(signal.SIGINT)
        code = dev.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
