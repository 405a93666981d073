"""The reference Yjs (npm ``yjs@13``, run with node) for tests that referee our decoding.

Installed from the npm registry into a cache directory on first use (``EDGESCHED_NPM_CACHE``,
by default ``~/.cache/edgesched-yjs13``); ``make setup`` installs node and npm with apt. A test
that needs it is skipped, saying why, when node or npm is missing or the registry unreachable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


def yjs_modules() -> Path:
    """The ``node_modules`` directory holding yjs@13 (installed now if it is not yet)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm not installed: the Yjs referee needs them (apt-get install npm)")
    cache = Path(os.environ.get("EDGESCHED_NPM_CACHE", Path.home() / ".cache" / "edgesched-yjs13"))
    if not (cache / "node_modules" / "yjs" / "package.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(
                ["npm", "install", "--prefix", str(cache), "--no-audit", "--no-fund", "yjs@13"],
                check=True,
                capture_output=True,
                timeout=180,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"npm could not install yjs@13 (registry unreachable?): {exc}")
    return cache / "node_modules"


def run_node(script: Path, data: object, timeout: float = 120) -> Any:
    """Run ``script`` under node with yjs on its path, ``data`` as JSON on its stdin; its
    stdout read as JSON."""
    done = subprocess.run(
        ["node", str(script)],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
        env={**os.environ, "NODE_PATH": str(yjs_modules())},
    )
    return json.loads(done.stdout)
