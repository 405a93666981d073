"""The command line: help everywhere, version, clear one-line errors, and a real sim run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgesched.cli import app
from edgesched.version import __version__

runner = CliRunner()


def entry_point() -> str:
    exe = Path(sys.executable).with_name("edgesched")
    found = str(exe) if exe.exists() else shutil.which("edgesched")
    assert found, "the edgesched console script is not installed"
    return found


def test_version_from_the_installed_entry_point(tmp_path: Path) -> None:
    out = subprocess.run(
        [entry_point(), "--version"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"edgesched {__version__}"


def test_shell_completion_completes_the_operators_commands(tmp_path: Path) -> None:
    """typer's completion is on: the script for bash, and the words it completes."""
    script = subprocess.run(
        [entry_point(), "--show-completion", "bash"], capture_output=True, text=True, check=True
    )
    assert "_edgesched_completion" in script.stdout
    env = {"_EDGESCHED_COMPLETE": "complete_bash", "COMP_WORDS": "edgesched ta", "COMP_CWORD": "1"}
    words = subprocess.run(
        [entry_point()], capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path
    )
    assert set(words.stdout.split()) == {"task", "tasks"}, words.stdout


@pytest.mark.parametrize(
    "args",
    [[], ["sim"], ["config"], ["config", "check"], ["config", "example"], ["context", "set"]],
)
def test_every_command_has_help(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_config_example_round_trips_through_check(tmp_path: Path) -> None:
    example = runner.invoke(app, ["config", "example"])
    assert example.exit_code == 0
    path = tmp_path / "edgesched.toml"
    path.write_text(example.output)
    checked = runner.invoke(app, ["config", "check", str(path)])
    assert checked.exit_code == 0, checked.output
    assert "mode energy" in checked.output and "gates" in checked.output


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[policy]\nmdoe = 'energy'\n", "policy.mdoe"),
        ("[policy]\nmode = 'fastest'\n", "policy.mode"),
        ("[sim]\nseed = true\n", "sim.seed"),
        ("[policy\n", "not valid TOML"),
        (
            "[[policy.tidal.windows]]\nname='w'\nstart='25:00'\nend='09:00'\nshares={a=0.5}\n",
            "policy.tidal.windows[0].start",
        ),
    ],
)
def test_bad_config_is_one_clear_line_and_exit_2(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = subprocess.run(
        [entry_point(), "config", "check", str(path)], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error:") and key in lines[0]
    assert "Traceback" not in out.stderr


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [entry_point(), "sim", "--config", str(tmp_path / "nope.toml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "nope.toml" in out.stderr and "Traceback" not in out.stderr


def test_unknown_strategy_and_scenario_are_rejected() -> None:
    bad = runner.invoke(app, ["sim", "--strategy", "magic"])
    assert bad.exit_code == 2
    assert "--strategy" in bad.output and "magic" in bad.output
    bad = runner.invoke(app, ["sim", "--scenario", "mars"])
    assert bad.exit_code == 2
    assert "mars" in bad.output


def test_sim_json_runs_the_campus_with_selected_strategies(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            entry_point(),
            "sim",
            "--json",
            "--days",
            "0.25",
            "--scale",
            "0.5",
            "-s",
            "first-fit",
            "-s",
            "tidal+energy",
            "--plot",
            str(tmp_path / "day.png"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [s["strategy"] for s in doc["strategies"]] == ["first-fit", "tidal+energy"]
    for s in doc["strategies"]:
        assert 0 < s["utilization_awake"] <= 1
        assert s["energy_kwh"] > 0
        assert s["completed"] > 0
    assert doc["affinity_arm48"]["planned_std"] < doc["affinity_arm48"]["naive_std"]
    assert (tmp_path / "day.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_certs_commands_make_a_ca_and_refuse_to_overwrite(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    assert runner.invoke(app, ["certs", "init", "--dir", str(d)]).exit_code == 0
    ok = runner.invoke(app, ["certs", "issue", "gw-01", "--dir", str(d)])
    assert ok.exit_code == 0 and (d / "gw-01.key").stat().st_mode & 0o777 == 0o600
    again = runner.invoke(app, ["certs", "issue", "gw-01", "--dir", str(d)])
    assert again.exit_code == 2 and "--force" in again.output
    bad = runner.invoke(app, ["certs", "issue", "a/b", "--dir", str(d)])
    assert bad.exit_code == 2 and "invalid identity" in bad.output


def test_edge_run_with_an_unreadable_mqtt_key_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text(
        f"[edge]\nnode_id = 'gw1'\nstate_dir = '{tmp_path / 'state'}'\n"
        f"[edge.mqtt]\npassword_file = '{tmp_path / 'missing.pw'}'\n"
    )
    out = subprocess.run(
        [entry_point(), "edge", "run", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "edge.mqtt" in lines[0] and "missing.pw" in lines[0], out.stderr
    assert not (tmp_path / "state").exists()  # refused before touching anything
