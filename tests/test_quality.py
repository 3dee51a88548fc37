"""Lint and strict typing are part of the test command, so CI enforces them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, check=False, env=env)


def test_ruff_check_passes() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_is_ruff_formatted() -> None:
    result = _run("ruff", "format", "--check", "scheduler", "cli", "contrib")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_passes_on_the_installed_layout(tmp_path: Path) -> None:
    """Type-check `jobq` as it is installed (scheduler/ as jobq, cli/ as jobq.cli, contrib/ as
    jobq.contrib) through a tree of links, since mypy cannot follow setuptools' editable finder."""
    package = tmp_path / "tree" / "jobq"
    package.mkdir(parents=True)
    for entry in (REPO / "scheduler").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "cli").symlink_to(REPO / "cli")
    (package / "contrib").symlink_to(REPO / "contrib")
    env = {**os.environ, "MYPYPATH": str(package.parent)}
    cache = tmp_path / "mypy-cache"
    result = _run(
        "mypy",
        "--strict",
        "--config-file",
        str(REPO / "setup.cfg"),
        "--cache-dir",
        str(cache),
        "-p",
        "jobq",
        cwd=tmp_path,
        env=env,
    )
    shutil.rmtree(cache, ignore_errors=True)
    assert result.returncode == 0, result.stdout + result.stderr
