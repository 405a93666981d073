"""The in-process control-step benchmark at a tiny size: it runs, and what it reports is
what happened (every submission placed, the offline node's services failed over, the
projection wrote every node's desired document, the full walk it compares with ran)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_control_step as bench


@pytest.mark.parametrize(
    ("cold", "packed"), [(True, True), (False, True), (True, False)], ids=["cold", "live", "nested"]
)
def test_the_step_benchmark_measures_a_small_fleet(cold: bool, packed: bool) -> None:
    """(``nested``: the entries as nodes of an older version write them, and read them)."""
    args = argparse.Namespace(
        tasks=20, steps=21, changes=5, walk_up_to=100, cold=cold, sweep_every=2, packed=packed
    )
    row = asyncio.run(bench.measure(30, args))
    assert row["nodes"] == 30 and row["entries"] == 600
    assert row["submitted"] == 21 * 5 and row["left_pending"] == 0
    # two nodes went offline past the grace (steps 0 and 20): their 14 services each moved
    assert row["failed_over"] == 2 * 14
    assert row["desired_docs"] == 30
    assert 0 < row["busy_p50"] <= row["busy_p99"] and 0 < row["idle_p50"] <= row["idle_p99"]
    assert 0 < row["busy_cpu_p50"] <= row["busy_cpu_p99"]
    assert row["walk_s"] > 0 and row["rss_mib"] > 0
    if cold:  # each replica and desired document frozen once read; the steps thawed some
        assert row["frozen"] > 0 and row["thaws"] > 0
        assert row["live"] + row["frozen"] == 60
    else:
        assert (row["live"], row["frozen"], row["thaws"]) == (0, 0, 0)  # no freezer at all
