"""The task-views benchmark at a tiny size: every task has a view, and the history passes
write exactly the tasks the nodes finished (30% of the seeded ones)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_task_views as bench


def test_the_views_and_the_history_at_a_tiny_size() -> None:
    row = asyncio.run(bench.measure(6, 20))
    assert row["tasks"] == 6 * 20
    assert row["written"] == row["rows"] == 6 * 6  # 6 of each node's 20 finished
    assert row["passes"] == 1 and row["life_us"] > 0 and row["page_ms"] > 0
