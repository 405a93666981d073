"""What a newcomer walking the operator docs (issue 18) found wrong, kept fixed."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from edgesched.config import CentralConfig
from edgesched.unit import UnitParams, render_unit

ROOT = Path(__file__).resolve().parent.parent


def test_the_central_units_comment_names_centrals_real_default_api_port() -> None:
    unit = render_unit(
        UnitParams(
            role="central",
            executable=PurePosixPath("/opt/edgesched/current/bin/edgesched"),
            config=PurePosixPath("/etc/edgesched/central.toml"),
            state_directory="edgesched-central",
            config_dir=PurePosixPath("/etc/edgesched"),
            user="edgesched",
            version="9.9",
        )
    )
    said = re.search(r"the API port is not privileged: (\d+) by default", unit)
    assert said is not None, unit
    assert int(said.group(1)) == CentralConfig().api_port


def test_systemd_md_shows_centrals_status_line_with_its_default_port() -> None:
    text = (ROOT / "docs" / "systemd.md").read_text()
    ports = re.findall(r"API on port (\d+)", text)
    assert ports and all(int(p) == CentralConfig().api_port for p in ports), ports
