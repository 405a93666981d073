"""central/fleetseries.py (the day of the fleet: a point a minute, today's energy) and the
event rings of central's engine (notable events kept apart from routine placements)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.central.engine import ROUTINE_EVENTS, CentralEngine
from edgesched.central.fleetseries import SECONDS_PER_DAY, FleetSample, FleetSeries
from edgesched.config import parse_config

DAY0 = 20_000 * SECONDS_PER_DAY  # a midnight (UTC)


def sample(
    at: float, power: float = 100.0, util: float | None = 0.5, demand: float = 2.0
) -> FleetSample:
    return FleetSample(at=at, util=util, power_w=power, demand_cpu=demand, capacity_cpu=8.0)


def test_points_are_the_minutes_means_and_energy_integrates_power() -> None:
    series = FleetSeries()
    for k in range(24):  # two minutes of 5-second samples at 120 W, util 0.25 then 0.75
        series.observe(sample(DAY0 + 5 * k, power=120.0, util=0.25 if k < 12 else 0.75))
    series.observe(sample(DAY0 + 120, power=120.0))
    points = series.series()
    assert [p["at"] for p in points] == [DAY0, DAY0 + 60, DAY0 + 120]
    assert points[0]["util"] == 0.25 and points[1]["util"] == 0.75
    assert points[0]["power_w"] == 120.0 and points[0]["capacity_cpu"] == 8.0
    # 120 s at 120 W = 4 Wh
    now = series.now()
    assert now is not None and now["energy_today_wh"] == pytest.approx(4.0)


def test_a_gap_counts_no_energy_and_midnight_starts_the_day_over() -> None:
    series = FleetSeries()
    series.observe(sample(DAY0 + 100, power=360.0))
    series.observe(sample(DAY0 + 110, power=360.0))  # 10 s at 360 W = 1 Wh
    series.observe(sample(DAY0 + 3_600, power=360.0))  # an hour later: not guessed
    now = series.now()
    assert now is not None and now["energy_today_wh"] == pytest.approx(1.0)
    series.observe(sample(DAY0 + SECONDS_PER_DAY - 10, power=360.0))
    series.observe(sample(DAY0 + SECONDS_PER_DAY + 20, power=360.0))  # 20 s past midnight
    now = series.now()
    assert now is not None and now["energy_today_wh"] == pytest.approx(2.0)
    # an older sample (a clock step back) is ignored
    series.observe(sample(DAY0 + 5, power=1e6))
    assert series.latest is not None and series.latest.at == DAY0 + SECONDS_PER_DAY + 20


def test_no_measurement_is_no_utilization_not_zero() -> None:
    series = FleetSeries()
    series.observe(sample(DAY0, util=None))
    series.observe(sample(DAY0 + 5, util=None))
    assert series.series()[0]["util"] is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 120), st.floats(0, 5_000)), min_size=1, max_size=300))
def test_memory_is_bounded_and_energy_is_the_trapezoid_sum(
    steps: list[tuple[float, float]],
) -> None:
    series = FleetSeries(keep=10)
    at = DAY0 + 1_000.0
    expected = 0.0
    last: tuple[float, float] | None = None
    for gap, power in steps:
        at += gap
        series.observe(sample(at, power=power))
        if last is not None and at - last[0] <= 60.0:
            expected += (last[1] + power) / 2 * (at - last[0]) / 3600
        last = (at, power)
    assert len(series.points) <= 10
    assert len(series.series()) <= 11
    now = series.now()
    assert now is not None and math.isclose(
        now["energy_today_wh"], round(expected, 2), abs_tol=0.011
    )


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        FleetSeries(keep=0)
    with pytest.raises(ValueError):
        FleetSeries(point_s=math.nan)


def test_notable_events_outlive_a_burst_of_placements(tmp_path: Path) -> None:
    engine = CentralEngine(parse_config({"central": {"state_dir": str(tmp_path)}}))
    engine._event("failover", "svc: gw-a -> gw-b", task="svc")
    engine._event("node-offline", "gw-a is offline", node="gw-a")
    for i in range(1_500):  # more than the ring of every event holds
        engine._event("placed", f"t{i} on gw-b", task=f"t{i}")
    every = engine.recent_events(2_000)
    # the ring of every event lost the failover; the notable ring brings it back, in order
    assert [e.kind for e in every[:2]] == ["failover", "node-offline"]
    assert len(every) == 1_002
    assert [e.kind for e in engine.recent_events(10, notable=True)] == [
        "failover",
        "node-offline",
    ]
    assert [e.detail for e in engine.recent_events(1, frozenset({"failover"}))] == [
        "svc: gw-a -> gw-b"
    ]
    placed = engine.recent_events(5, frozenset({"placed"}))
    assert [e.detail for e in placed] == [f"t{i} on gw-b" for i in range(1_495, 1_500)]
    assert "placed" in ROUTINE_EVENTS and engine.recent_events(0) == []
