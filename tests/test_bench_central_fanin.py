"""The fan-in benchmark at a tiny size: node-authored frames through central's routing and
replica channels all land in central's index, none refused."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_central_fanin as bench


@pytest.mark.parametrize("cold", [False, True], ids=["live", "cold"])
def test_every_node_update_reaches_the_index(cold: bool) -> None:
    args = argparse.Namespace(tasks=20, updates=3, batch=7, cold=cold)
    row = asyncio.run(bench.measure(12, args))
    assert row["frames"] == 12 * 3  # one frame per change at this size
    assert row["exited"] == row["frames"] and row["rejected"] == 0
    assert row["steps"] == row["frames"] // 7 and row["rate"] > 0
    # a frozen replica thaws at its node's first frame, and only then
    assert row["thaws"] == (12 if cold else 0)
