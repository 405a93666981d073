"""The site-coordinator benchmark (bench/bench_site_coordinator.py) in its quick mode: its JSON
parses, has every figure of both sizes and their growth against the smallest, and says what the
cycles did (no timing thresholds: only that the figures are there and consistent)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_site_coordinator as bench

FIGURES = {
    "members",
    "tasks_per_member",
    "reports",
    "cycles",
    "failovers",
    "steady_p50_ms",
    "steady_p99_ms",
    "steady_us_per_report",
    "failover_p50_ms",
    "failover_p99_ms",
    "orders_per_failover",
    "replicas_per_failover",
    "actions_p50_ms",
    "actions_p99_ms",
    "replica_rss_kib",
    "replica_views_kib",
    "snapshot_kib",
    "build_s",
}


def test_the_quick_json_has_every_figure_of_both_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench.main(["--quick", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["tasks_per_member"] == 100 and doc["baseline"] == 3
    sizes = doc["sizes"]
    assert [s["members"] for s in sizes] == [3, 30]
    for size in sizes:
        assert set(size) == FIGURES
        assert size["reports"] == size["members"] * 100
        assert 0 < size["steady_p50_ms"] <= size["steady_p99_ms"]
        assert 0 < size["failover_p50_ms"] <= size["failover_p99_ms"]
        assert 0 < size["actions_p50_ms"] <= size["actions_p99_ms"]
        assert size["steady_us_per_report"] > 0
        # each failover ordered every service replica of the dead member onto a live one
        assert size["replicas_per_failover"] == 10
        assert size["orders_per_failover"] == size["replicas_per_failover"]
        assert size["replica_rss_kib"] >= 0 and size["replica_views_kib"] > 0
        assert size["snapshot_kib"] > 0 and size["build_s"] > 0
    assert set(doc["growth"]) == {"30"}
    growth = doc["growth"]["30"]
    assert set(growth) == set(bench.GROWTH)
    assert growth["reports"] == pytest.approx(10.0)
    assert growth["steady_p50_ms"] > 0 and growth["failover_p50_ms"] > 0


def test_the_table_has_a_row_per_figure_and_a_ratio_column() -> None:
    rows = [bench.measure(n, 20, 3, 2) for n in (3, 4)]
    lines = bench.table(rows)
    assert lines[0] == "| figure | N=3 | N=4 | x N=4/3 |"
    assert len(lines) == 2 + len(bench.ROWS)
    assert lines[2].startswith("| task reports in the site | 60 | 80 | x1.33 |")
    assert rows[1]["orders_per_failover"] == rows[1]["replicas_per_failover"] == 2
