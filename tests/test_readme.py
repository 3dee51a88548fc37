"""The README's commands work as written: the run command, the tour, and the test command in CI."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import wait_until
from services import free_port

from jobq.client import Client
from jobq.deployment import Deployment
from jobq.models import RunState
from jobq.ports import JobQuery
from jobq.settings import Settings
from jobq.wiring import connect

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def block(marker: str) -> list[str]:
    """The command lines of the code block after `<!-- readme:marker -->`."""
    match = re.search(rf"<!-- readme:{marker} -->\s*```sh\n(.*?)```", README, re.S)
    assert match, f"README has no readme:{marker} block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command() -> None:
    [command] = block("test")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert command in [line.strip() for line in ci if not line.lstrip().startswith("#")]


@pytest.fixture
def quickstart(tmp_path: Path) -> Iterator[tuple[Deployment, dict[str, str]]]:
    """The README's run command, as written, against a database of this test's own."""
    [command] = block("run")
    env = {**os.environ, "JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}", "PYTHONUNBUFFERED": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["sh", "-c", command], cwd=REPO, env=env, stdout=out, stderr=out, start_new_session=True
        )
    d = connect(Settings.load({"store": env["JOBQ_STORE"], "history_flush_s": 0}, env={}))
    try:
        yield d, env
    finally:
        d.close()
        # Ctrl-C to jobq itself (the shell's child); the shell then exits with jobq's code.
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        for child in children.read_text().split() if children.exists() else []:
            os.kill(int(child), signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert code == 0, log.read_text()[-4000:]
        assert "stopped after" in log.read_text()  # a graceful shutdown, not a kill


def test_the_quickstart_runs_each_kind_of_job_and_the_tour_works(
    quickstart: tuple[Deployment, dict[str, str]],
) -> None:
    d, env = quickstart
    client = Client(d)

    def runs_of(task: str) -> list[RunState]:
        jobs = [j for j in client.list(JobQuery(limit=1000)).items if j.name == task]
        return [r.state for j in jobs for r in client.runs(j.job_id).items]

    wait_until(lambda: runs_of("examples.hello").count(RunState.SUCCEEDED) >= 1, 90, "the instant hello")
    wait_until(lambda: RunState.SUCCEEDED in runs_of("examples.flaky"), 30, "flaky to succeed")
    wait_until(lambda: bool(client.dead_letters().items), 30, "broken to be dead-lettered")
    wait_until(lambda: runs_of("examples.hello").count(RunState.SUCCEEDED) >= 2, 30, "the one-off in 5 s")
    wait_until(lambda: RunState.SUCCEEDED in runs_of("examples.tick"), 30, "the cron tick")
    flaky = [
        r
        for j in client.list(JobQuery(limit=1000)).items
        if j.name == "examples.flaky"
        for r in client.runs(j.job_id).items
    ]
    assert [(r.state, r.attempt) for r in flaky] == [(RunState.SUCCEEDED, 3)]
    [dead] = client.dead_letters().items
    assert dead.last_error is not None and "always fails" in dead.last_error

    tour = block("tour")
    *oneshots, worker_line = tour
    outputs = []
    for line in oneshots:
        result = subprocess.run(shlex.split(line), cwd=REPO, env=env, capture_output=True, text=True, check=False)
        assert result.returncode == 0, (line, result.stdout, result.stderr)
        outputs.append(result.stdout)
    scheduled = re.search(r"scheduled (\S+)", outputs[0])
    assert scheduled, outputs[0]
    job_id = scheduled.group(1)
    status = subprocess.run(["jobq", "status", job_id], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert status.returncode == 0 and job_id in status.stdout
    assert "examples.hello" in outputs[2]  # jobq list
    assert dead.run_id[:12] in outputs[3]  # jobq dlq list

    worker = subprocess.Popen(
        shlex.split(worker_line), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_until(
            lambda: client.run(f"{job_id}:{client.job(job_id).schedule.at_ms}").state is RunState.SUCCEEDED,
            40,
            "the tour's hello in 10 s",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert "serving critical,high with 4 slots (prefork pool, autoscaling 2..8)" in out


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_the_first_command_in_a_fresh_venv_on_a_clean_clone_serves_the_api_and_the_readme_curl_answers_201(
    tmp_path: Path,
) -> None:
    """A newcomer's first minute: a clean clone (what is committed), a fresh virtualenv, the README's
    first command exactly as written; it must print the API address and a token, and the README's
    curl must then create a job. Only the API port differs when 8080 may be taken here."""
    [command] = block("run")
    clone, venv = tmp_path / "clone", tmp_path / "venv"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQ_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        JOBQ_API_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / "first.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["sh", "-c", command], cwd=clone, env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        wait_until(lambda: "Ctrl-C to stop" in log.read_text() or proc.poll() is not None, 300, "jobq dev to start")
        shown = log.read_text()
        assert f"API: http://127.0.0.1:{port}/v1" in shown, shown[-4000:]
        assert "the HTTP API is off" not in shown
        token = re.search(r"export TOKEN=(\S+)", shown)
        assert token, shown[-4000:]
        [curl] = [re.search(r"<!-- readme:curl -->\s*```sh\n(.*?)```", README, re.S).group(1)]  # type: ignore[union-attr]
        (tmp_path / ".curlrc").write_text('write-out = "\\n%{http_code}\\n"\n')  # the status after the body
        result = subprocess.run(
            ["sh", "-c", curl.replace("127.0.0.1:8080", f"127.0.0.1:{port}")],
            env={**env, "TOKEN": token.group(1), "CURL_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert result.stdout.strip().splitlines()[-1] == "201", (result.stdout, result.stderr)
    finally:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        for child in children.read_text().split() if children.exists() else []:
            os.kill(int(child), signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def test_the_readme_fast_command_is_the_marker_expression_pytest_is_configured_with() -> None:
    [command] = block("fast")
    assert command == 'pytest -m "not slow"'
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"slow: ' in pyproject and '"services: ' in pyproject  # registered (--strict-markers)


@pytest.mark.slow  # starts a pytest process to collect
def test_the_readme_fast_command_leaves_out_every_test_that_needs_a_service_or_spawns_processes() -> None:
    args = shlex.split(block("fast")[0])[1:]
    files = ["tests/contract/test_store.py", "tests/contract/test_transport.py", "tests/test_cli_startup.py"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids, out.stdout + out.stderr
    assert any("[sqlite]" in i for i in ids) and any("[memory]" in i for i in ids)
    for backend in ("postgres", "dynamodb", "redis", "sqs", "amqp"):
        assert not [i for i in ids if f"[{backend}" in i], backend
    assert not [i for i in ids if "test_cli_startup.py::test_jobq_" in i]
