"""What the CLI prints is printed as written: rich never reads `[...]` in it as markup."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobq.cli import api as cli_api
from jobq.cli.main import cli
from jobq.deployment import Deployment

REPO = Path(__file__).resolve().parent.parent


def test_the_missing_api_hint_prints_the_extra_with_its_brackets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "jobq.api.server", None)  # as if the API's packages were absent
    assert cli_api.dev_api(_unused_deployment()) is None
    assert "pip install 'jobq[api]' to serve it" in capsys.readouterr().err


def test_an_error_message_with_brackets_prints_them(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'jobq.db'}"
    result = CliRunner().invoke(cli, ["schedule", "t.x", "--now", "--args", "[1,"], env={"JOBQ_STORE": store})
    assert result.exit_code == 2
    assert "error: --args is not valid JSON" in result.output
    bracketed = CliRunner().invoke(cli, ["schedule", "t.x", "--job-id", "no spaces"], env={"JOBQ_STORE": store})
    assert bracketed.exit_code == 2 and "^[A-Za-z0-9][A-Za-z0-9_.\\-]{0,127}$" in bracketed.output


def test_every_rich_console_and_text_column_of_the_cli_reads_no_markup() -> None:
    """A console or progress column that reads markup would drop `[api]` from `jobq[api]` (and any
    bracketed task name or error text): each must be built with `markup=False`."""
    offenders = []
    for path in sorted((REPO / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"Console", "TextColumn"}:
                markup = [k.value for k in node.keywords if k.arg == "markup"]
                if not (markup and isinstance(markup[0], ast.Constant) and markup[0].value is False):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_no_cli_module_escapes_markup_for_consoles_that_read_none() -> None:
    """`rich.markup.escape` on text printed without markup would show its backslashes."""
    users = [p.name for p in sorted((REPO / "cli").glob("*.py")) if "rich.markup" in p.read_text()]
    assert users == []


def _unused_deployment() -> Deployment:
    """dev_api gives up before it touches the deployment when the API cannot be imported."""
    return object()  # type: ignore[return-value]
