"""The scenario suite (bench/bench_scenarios.py) on one small scenario: it runs, its JSON holds
what the simulations measured, and its verdicts follow from those figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_scenarios as suite


def test_the_suite_measures_a_held_out_member_and_judges_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "suite.json"
    argv = ["--scenario", "batch", "-s", "energy", "-s", "first-fit", "--workers", "1"]
    argv += ["--oracle-spare", "0", "--oracle-spare", "0.2"]
    assert suite.main([*argv, "--no-growth", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    runs = doc["scenarios"]["batch"]["runs"]
    oracles = {"oracle@0", "oracle@0.2"}
    assert sorted(runs) == sorted({"energy", "first-fit", "k8s-spread"} | oracles)
    for run in runs.values():
        assert run["completed"] > 1000 and run["energy_kwh"] > 0
    verdict = doc["scenarios"]["batch"]["verdicts"]
    fewest = min(runs["k8s-spread"]["slo_misses"], runs["first-fit"]["slo_misses"])
    assert verdict["fewest_other_misses"] == fewest
    energy = verdict["energy"]
    assert energy["misses"] == runs["energy"]["slo_misses"]
    assert energy["misses_ok"] == (runs["energy"]["slo_misses"] <= fewest)
    saving = 1 - runs["energy"]["energy_kwh"] / runs["k8s-spread"]["energy_kwh"]
    assert energy["saving_vs_k8s"] == pytest.approx(saving, abs=1e-3)  # kWh rounded in to_dict
    assert 0.1 < verdict["peak_fill"] < 2
    room = runs["k8s-spread"]["utilization_fleet"] <= suite.PARK_ROOM and verdict["peak_fill"] <= 1
    assert verdict["room_to_park"] == room
    # the oracle: the run of least energy among those within the fewest misses of the others
    within = [n for n in oracles if runs[n]["slo_misses"] <= fewest]
    oracle = verdict["oracle"]
    assert oracle["tried"] == 2
    if within:
        pick = min(within, key=lambda n: (runs[n]["energy_kwh"], n))
        assert oracle["energy_kwh"] == pytest.approx(runs[pick]["energy_kwh"], abs=0.01)
        kwh = runs[pick]["energy_kwh"]
        oracle_saving = 1 - kwh / runs["k8s-spread"]["energy_kwh"]
        assert oracle["saving_vs_k8s"] == pytest.approx(oracle_saving, abs=1e-3)  # rounded kWh
    else:
        assert oracle["saving_vs_k8s"] is None
    printed = capsys.readouterr().out
    assert "## batch:" in printed and "energy: misses" in printed and "oracle:" in printed


def test_the_overload_asks_more_than_the_fleet_at_its_peak() -> None:
    from edgesched.core.fleetspec import peak_cpu

    scenario, _ = suite.build(suite.Key("overload", "overload", instances=7_500))
    cores = sum(n.capacity.cpu for n in scenario.nodes)
    asked = [(t.submitted_at, t.duration_s or 0.0, t.demand.cpu) for t in scenario.tasks]
    assert peak_cpu(asked) >= 1.2 * cores
