"""The dashboard benchmark at a tiny size, in Chromium: the page paints, pages through the
tasks central serves (each "next" moving on), filters them server-side (every row shown is
exited) and renders snapshots."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_dashboard as bench


def test_the_dashboard_benchmark_at_a_tiny_size() -> None:
    (row,) = asyncio.run(bench.main_async([6], 20, 2))
    assert row["tasks"] == 6 * 20
    assert row["snapshot_bytes"] > 0 and row["first_paint_ms"] > 0
    assert row["page_ms"] > 0 and row["filtered_page_ms"] > 0 and row["render_ms"] > 0
