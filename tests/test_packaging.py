"""The distribution installs one name, `jobq`, with every module and data file it needs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
OPTIONAL = ("redis", "psycopg", "psycopg_pool", "kombu", "boto3", "botocore", "fastapi", "uvicorn", "httpx", "httpcore")


def _packages_on_disk() -> set[str]:
    """Every folder with an __init__.py under the folders mapped in package-dir, as import names."""
    found: set[str] = set()
    for name, folder in SETUPTOOLS["package-dir"].items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(root)
            dotted = ".".join((name, *relative.parts)) if relative.parts else name
            found.add(dotted)
    return found


def test_every_sub_package_on_disk_is_listed_in_pyproject() -> None:
    # setuptools silently leaves an unlisted sub-package out of the wheel.
    assert _packages_on_disk() == set(SETUPTOOLS["packages"])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [built] = out.glob("jobq-*.whl")
    return built


def test_the_wheel_installs_nothing_at_the_top_level_but_jobq(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"jobq"}
    assert "jobq/cli/main.py" in names
    assert "jobq/contrib/__init__.py" in names
    assert "jobq/py.typed" in names


def test_the_wheel_carries_its_data_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [p for p in (REPO / "scheduler").rglob("*") if p.suffix in {".lua", ".sql"}]
    data += [
        p for p in (REPO / "scheduler" / "ui").rglob("*") if p.is_file() and p.parent.name in {"templates", "static"}
    ]
    assert any(p.name == "htmx.min.js" for p in data) and any(p.name == "htmx.LICENSE.txt" for p in data)
    for path in data:
        assert "jobq/" + str(path.relative_to(REPO / "scheduler")) in names


def test_every_module_imports_from_the_installed_wheel_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        check=True,
    )
    script = textwrap.dedent(
        f"""
        import importlib, pkgutil, jobq
        from jobq.errors import MissingExtra
        assert jobq.__file__.startswith({str(target)!r}), jobq.__file__
        optional = {OPTIONAL!r}
        for m in pkgutil.walk_packages(jobq.__path__, "jobq."):
            if m.name == "jobq.cli.__main__":
                continue
            try:
                importlib.import_module(m.name)
            except MissingExtra:  # a backend whose extra is not installed here is fine
                pass
            except ImportError as exc:
                if exc.name is None or exc.name.split(".")[0] not in optional:
                    raise
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_jobq_command_runs_from_any_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobq.cli", "--version"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "jobq, version" in result.stdout
