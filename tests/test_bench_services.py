"""The services benchmark at a tiny size: it runs, and what it reports is what happened
(every replica placed within the spread's bound, each failed replica replaced)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_services as bench


def test_the_services_benchmark_measures_a_small_fleet() -> None:
    args = argparse.Namespace(nodes=40, tasks=5, replicas=4, steps=6)
    row = asyncio.run(bench.measure(3, args))
    assert row["services"] == 3 and row["replicas"] == 12
    assert row["max_per_node"] <= 2  # the spread's bound
    assert row["replaced"] == 6  # one new incarnation per failed replica
    assert 0 < row["one_change_p50_ms"] <= row["one_change_p99_ms"]
    assert row["full_p50_ms"] > 0 and row["placing_s"] > 0
