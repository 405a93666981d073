"""The fan-in benchmark at a tiny size: node-authored frames through central's routing and
replica channels all land in central's index, none refused."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_central_fanin as bench


def test_every_node_update_reaches_the_index() -> None:
    args = argparse.Namespace(tasks=20, updates=3, batch=7)
    row = asyncio.run(bench.measure(12, args))
    assert row["frames"] == 12 * 3  # one frame per change at this size
    assert row["exited"] == row["frames"] and row["rejected"] == 0
    assert row["steps"] == row["frames"] // 7 and row["rate"] > 0
