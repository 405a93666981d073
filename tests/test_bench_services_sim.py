"""The services benchmark on a small campus: it runs every way, the fixed deployment first,
and its table says what the runs measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_services_sim as bench

from edgesched.core.campus import campus_scenario


@pytest.mark.parametrize("with_fleet", [False, True], ids=["services", "fleet"])
def test_the_services_benchmark_measures_a_small_campus(with_fleet: bool) -> None:
    scenario = campus_scenario(seed=0, days=0.5, scale=0.1)  # midnight to noon, 5 nodes
    ways = bench.measure(scenario, "first-fit", with_fleet)
    assert [w.label for w in ways] == ["fixed", "load", "forecast (holt)", "forecast (onnx)"]
    fixed = sum(r.replica_hours for r in ways[0].runs)
    for way in ways:
        assert [r.model.name for r in way.runs] == ["face-recognition", "video-conferencing"]
        assert (way.report is not None) == with_fleet
        if way is not ways[0]:
            assert sum(r.replica_hours for r in way.runs) < fixed
    lines = bench.table(scenario, ways)
    assert len(lines) == 2 + len(ways)
    assert lines[2].startswith("| fixed | ") and "| 1.00 |" in lines[2]
    assert "all day" in lines[2] and "all day" not in lines[3]
    energy = [line.split(" | ")[6] for line in lines[2:]]
    if with_fleet:
        assert energy[0] == "1.000" and all(float(e) > 0 for e in energy)
    else:
        assert set(energy) == {"-"}
