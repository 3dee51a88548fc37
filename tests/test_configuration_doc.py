"""docs/configuration.md lists every setting of the model, with its variable and its default;
contradictory settings are refused with one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobq.cli.main import cli
from jobq.errors import ConfigError
from jobq.settings import Settings

DOC = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
ROWS = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", DOC, re.M)}


def _default(value: object) -> str:
    if value is None or value == ():
        return ""
    if isinstance(value, tuple):
        return f"`{','.join(map(str, value))}`"
    return f"`{value}`"


def test_every_setting_is_documented_with_its_variable_and_default() -> None:
    assert set(ROWS) == set(Settings.model_fields), "docs/configuration.md and jobq.settings.Settings differ"
    for name, field in Settings.model_fields.items():
        row = ROWS[name]
        assert f"`JOBQ_{name.upper()}`" in row, row
        assert _default(field.default) in row, (name, field.default, row)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lease_s": 5, "heartbeat_s": 10}, "heartbeat_s=10.0: must be shorter than lease_s=5"),
        ({"lease_s": 8, "heartbeat_s": 2}, "claim_lease_s=10.0: must not be longer than lease_s=8"),
    ],
)
def test_contradictory_settings_are_refused_naming_both(values: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.load(values, env={})


def test_the_cli_refuses_contradictory_settings_in_one_line(tmp_path: Path) -> None:
    env = {"JOBQ_STORE": f"sqlite:///{tmp_path / 'jobq.db'}", "JOBQ_LEASE_S": "5"}
    result = CliRunner().invoke(cli, ["list"], env=env)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: heartbeat_s=10.0: must be shorter than lease_s=5 (a run's lease would expire between heartbeats)"
    ]
