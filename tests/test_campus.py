"""Tests of the seeded smart-campus scenario generator (edgesched.core.campus)."""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np
import pytest

from edgesched.core.campus import (
    BINS_PER_DAY,
    CLASS_NAMES,
    TARGET_UTILIZATION,
    CampusScenario,
    Tariff,
    WorkloadClass,
    arm48_node,
    campus_fleet,
    campus_scenario,
    campus_tariff,
    expected_cores_in_use,
)
from edgesched.core.model import SECONDS_PER_DAY, Arch, Node, NodeState, ServerClass, Task

HOUR = 3600.0


@pytest.fixture(scope="module")
def scenario() -> CampusScenario:
    return campus_scenario(seed=0)


def _arrived(sc: CampusScenario) -> list[Task]:
    """Tasks that arrive during the scenario (not the warm-start carry-over)."""
    return [t for t in sc.tasks if t.id not in sc.carried_over]


def _fits(node: Node, task: Task) -> bool:
    if not task.runs_on(node.arch):
        return False
    if task.server_classes and node.server_class not in task.server_classes:
        return False
    return task.demand.fits_in(node.capacity)


def _in_hours(t_s: float, start_h: float, end_h: float) -> bool:
    h = (t_s % SECONDS_PER_DAY) / HOUR
    return start_h <= h < end_h if start_h < end_h else (h >= start_h or h < end_h)


# ---------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_scenario(scenario: CampusScenario) -> None:
    again = campus_scenario(seed=0)
    assert again == scenario
    assert again.tasks == scenario.tasks


def test_different_seed_gives_different_tasks(scenario: CampusScenario) -> None:
    other = campus_scenario(seed=1)
    assert other.nodes == scenario.nodes
    assert other.classes == scenario.classes
    mine = {(t.submitted_at, t.duration_s) for t in _arrived(scenario)}
    theirs = {(t.submitted_at, t.duration_s) for t in _arrived(other)}
    assert mine.isdisjoint(theirs)


def test_generation_time() -> None:
    start = time.perf_counter()
    sc = campus_scenario(seed=7)
    elapsed = time.perf_counter() - start
    print(f"\ncampus_scenario(seed=7, days=1, scale=1): {len(sc.tasks)} tasks in {elapsed:.2f} s")


# ---------------------------------------------------------------------------- structure


def test_ids_unique_and_sorted(scenario: CampusScenario) -> None:
    node_ids = [n.id for n in scenario.nodes]
    assert len(set(node_ids)) == len(node_ids)
    assert node_ids == sorted(node_ids)
    task_ids = [t.id for t in scenario.tasks]
    assert len(set(task_ids)) == len(task_ids)
    times = [t.submitted_at for t in scenario.tasks]
    assert times == sorted(times)
    assert all(n.state is NodeState.ACTIVE and n.site == "campus" for n in scenario.nodes)


def test_tasks_are_finite_and_within_horizon(scenario: CampusScenario) -> None:
    for t in scenario.tasks:
        assert t.duration_s is not None and t.duration_s > 0
        assert 0.0 <= t.submitted_at < scenario.horizon_s
        assert t.workload in scenario.classes
        assert t.priority == scenario.classes[t.workload].priority
        assert t.threads == round(t.demand.cpu)
        assert t.migratable == (t.workload in {"video-conferencing", "cloud-desktop"})


def test_task_count_is_moderate(scenario: CampusScenario) -> None:
    assert 20_000 <= len(scenario.tasks) <= 65_000
    counts = Counter(t.workload for t in scenario.tasks)
    assert set(counts) == set(CLASS_NAMES)


def test_every_task_fits_some_node(scenario: CampusScenario) -> None:
    # Tasks of a class differ only in their sizes; check every distinct shape.
    shapes = {
        (t.workload, t.demand, t.archs, t.server_classes, tuple(sorted(t.images))): t
        for t in scenario.tasks
    }
    for task in shapes.values():
        assert any(_fits(node, task) for node in scenario.nodes), task


def test_class_constraints(scenario: CampusScenario) -> None:
    by_class = {t.workload: t for t in scenario.tasks}
    fr = by_class["face-recognition"]
    assert set(fr.images) == {Arch.ARM64, Arch.X86_64}
    cd = by_class["cloud-desktop"]
    assert cd.runs_on(Arch.X86_64) and not cd.runs_on(Arch.ARM64)
    ai = by_class["ai-training"]
    assert ai.server_classes == frozenset({ServerClass.AI_ACCELERATOR})
    assert all(1 <= t.demand.accel <= 2 for t in scenario.tasks if t.workload == "ai-training")
    assert all(t.demand.accel == 0 for t in scenario.tasks if t.workload != "ai-training")
    va = by_class["video-analytics"]
    assert va.demand.iops_k > 0 and not va.server_classes
    priorities = [scenario.classes[name].priority for name in CLASS_NAMES]
    assert priorities == sorted(priorities, reverse=True)
    assert scenario.classes["face-recognition"].priority == max(priorities)


def test_fleet_composition(scenario: CampusScenario) -> None:
    archs = {n.arch for n in scenario.nodes}
    assert archs == {Arch.ARM64, Arch.X86_64}
    pools = Counter(n.labels["pool"] for n in scenario.nodes)
    assert pools == {"x86-gen": 16, "arm-gen": 16, "ai-x86": 8, "ai-arm": 4, "sto-x86": 6}
    assert scenario.fleet_cpu == 16 * 64 + 16 * 48 + 8 * 64 + 4 * 80 + 6 * 32
    assert {n.server_class for n in scenario.nodes} == set(ServerClass)


def test_arm48_node() -> None:
    node = arm48_node()
    assert node.id == "arm48"
    assert node.arch is Arch.ARM64 and node.server_class is ServerClass.GENERAL
    assert node.capacity.cpu == 48
    assert node.topology is not None
    assert [len(c) for c in node.topology.clusters] == [12, 12, 12, 12]
    assert arm48_node("arm-x").id == "arm-x"


def test_scale_multiplies_node_counts() -> None:
    one = Counter(n.labels["pool"] for n in campus_fleet(1.0))
    two = Counter(n.labels["pool"] for n in campus_fleet(2.0))
    assert two == {pool: 2 * count for pool, count in one.items()}
    tiny = Counter(n.labels["pool"] for n in campus_fleet(0.01))
    assert tiny == {pool: 1 for pool in one}
    sc2 = campus_scenario(seed=0, days=0.25, scale=2.0)
    sc1 = campus_scenario(seed=0, days=0.25, scale=1.0)
    assert len(sc2.nodes) == 2 * len(sc1.nodes)
    assert sc2.fleet_cpu == 2 * sc1.fleet_cpu
    # Demand follows the fleet: about twice the tasks.
    assert 1.8 < len(sc2.tasks) / len(sc1.tasks) < 2.2


# ---------------------------------------------------------------------------- durations

#: Stated bounds per class: (median range s, p99 range s).
DURATION_BOUNDS: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "face-recognition": ((10.0, 60.0), (120.0, 600.0)),
    "video-conferencing": ((600.0, 1800.0), (1800.0, 5400.0)),
    "cloud-desktop": ((600.0, 1800.0), (1800.0, 5400.0)),
    "ai-training": ((900.0, 2400.0), (2400.0, 7200.0)),
    "video-analytics": ((300.0, 1800.0), (1800.0, 7200.0)),
}


def test_per_class_duration_quantiles(scenario: CampusScenario) -> None:
    arrived = _arrived(scenario)
    for name, wc in scenario.classes.items():
        durations = np.array([t.duration_s for t in arrived if t.workload == name])
        q50, q90, q99 = np.quantile(durations, [0.5, 0.9, 0.99])
        # The sample follows the class's lognormal ...
        assert q50 == pytest.approx(wc.duration_quantile(0.5), rel=0.10), name
        assert q90 == pytest.approx(wc.duration_quantile(0.9), rel=0.10), name
        assert q99 == pytest.approx(wc.duration_quantile(0.99), rel=0.20), name
        # ... and the class stays within its stated bounds.
        (m_lo, m_hi), (p_lo, p_hi) = DURATION_BOUNDS[name]
        assert m_lo <= q50 <= m_hi, (name, q50)
        assert p_lo <= q99 <= p_hi, (name, q99)


def test_overall_duration_quantiles(scenario: CampusScenario) -> None:
    durations = np.array([t.duration_s for t in _arrived(scenario)])
    q50, q99 = np.quantile(durations, [0.5, 0.99])
    assert 10.0 <= q50 <= 100.0
    assert 600.0 <= q99 <= 3600.0


# ---------------------------------------------------------------------------- calibration


def test_demand_curves_are_calibrated(scenario: CampusScenario) -> None:
    cap = scenario.fleet_cpu
    mean_total = sum(wc.mean_demand for wc in scenario.classes.values())
    assert mean_total / cap == pytest.approx(TARGET_UTILIZATION, rel=1e-9)
    sum_of_peaks = sum(wc.peak_demand for wc in scenario.classes.values())
    assert sum_of_peaks / cap < 0.95
    for wc in scenario.classes.values():
        assert len(wc.demand_curve) == BINS_PER_DAY
        assert min(wc.demand_curve) >= 0
    # Each class's own peak fits the servers it may use.
    ai = scenario.classes["ai-training"]
    ai_nodes = [n for n in scenario.nodes if n.server_class is ServerClass.AI_ACCELERATOR]
    assert ai.peak_demand <= sum(n.capacity.cpu for n in ai_nodes)
    peak_tasks = ai.peak_demand / ai.mean_cpu
    assert peak_tasks * ai.mean_accel <= sum(n.capacity.accel for n in ai_nodes)
    cd = scenario.classes["cloud-desktop"]
    x86_cpu = sum(n.capacity.cpu for n in scenario.nodes if n.arch is Arch.X86_64)
    assert cd.peak_demand <= x86_cpu


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_load_matches_target(seed: int) -> None:
    sc = campus_scenario(seed=seed)
    work = sum(t.demand.cpu * (t.duration_s or 0.0) for t in _arrived(sc))
    load = work / (sc.fleet_cpu * SECONDS_PER_DAY)
    assert load == pytest.approx(TARGET_UTILIZATION, rel=0.05)


def test_expected_in_use_tracks_demand_curve(scenario: CampusScenario) -> None:
    for wc in scenario.classes.values():
        expected = np.array(expected_cores_in_use(wc))
        curve = np.array(wc.demand_curve)
        assert expected.mean() == pytest.approx(curve.mean(), rel=0.01), wc.name
        assert np.abs(expected - curve).max() <= 0.05 * curve.max(), wc.name


def _realized_in_use(tasks: list[Task], grid: np.ndarray) -> np.ndarray:
    starts = np.array([t.submitted_at for t in tasks])
    ends = starts + np.array([t.duration_s or 0.0 for t in tasks])
    cpu = np.array([t.demand.cpu for t in tasks])
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([cpu, -cpu])
    order = np.argsort(times, kind="stable")
    level = np.cumsum(deltas[order])
    idx = np.searchsorted(times[order], grid, side="right") - 1
    return np.where(idx >= 0, level[np.maximum(idx, 0)], 0.0)


def test_realized_load_follows_expected(scenario: CampusScenario) -> None:
    """Cores in use by the generated tasks (no scheduler) track the expected total per hour."""
    grid = np.arange(BINS_PER_DAY) * (SECONDS_PER_DAY / BINS_PER_DAY)
    realized = _realized_in_use(list(scenario.tasks), grid).reshape(24, -1).mean(axis=1)
    expected = np.zeros(BINS_PER_DAY)
    for wc in scenario.classes.values():
        expected += np.array(expected_cores_in_use(wc))
    hourly = expected.reshape(24, -1).mean(axis=1)
    assert np.all(np.abs(realized - hourly) <= 0.25 * hourly)
    # Thanks to the warm start the first hour is already loaded.
    assert realized[0] >= 0.75 * hourly[0]


def test_class_peaks_where_the_article_says(scenario: CampusScenario) -> None:
    classes = scenario.classes
    assert _in_hours(classes["face-recognition"].peak_time_s, 7.0, 9.0)
    assert _in_hours(classes["video-conferencing"].peak_time_s, 9.0, 12.0)
    assert _in_hours(classes["cloud-desktop"].peak_time_s, 9.0, 18.0)
    assert _in_hours(classes["video-analytics"].peak_time_s, 22.0, 6.0)
    ai_peak = classes["ai-training"].peak_time_s
    assert _in_hours(ai_peak, 12.5, 14.0) or _in_hours(ai_peak, 22.0, 6.0)
    # The same holds for the load the tasks are expected to produce.
    for name, window in [
        ("face-recognition", (7.0, 9.0)),
        ("video-conferencing", (9.0, 12.0)),
        ("video-analytics", (22.0, 6.0)),
    ]:
        expected = expected_cores_in_use(classes[name])
        peak_s = expected.index(max(expected)) * SECONDS_PER_DAY / BINS_PER_DAY
        assert _in_hours(peak_s, *window), name
    # Face recognition at the gates is a real rush: its morning peak dwarfs its night level.
    fr = classes["face-recognition"]
    assert fr.demand_at(8 * HOUR) > 10 * fr.demand_at(3 * HOUR)
    assert fr.demand_at(8 * HOUR) > fr.demand_at(18 * HOUR)


def test_realized_face_recognition_rush(scenario: CampusScenario) -> None:
    grid = np.arange(BINS_PER_DAY) * (SECONDS_PER_DAY / BINS_PER_DAY)
    fr = [t for t in scenario.tasks if t.workload == "face-recognition"]
    hourly = _realized_in_use(fr, grid).reshape(24, -1).mean(axis=1)
    assert int(np.argmax(hourly)) in (7, 8)


# ---------------------------------------------------------------------------- warm start, days


def test_warm_start_carries_running_tasks_at_midnight(scenario: CampusScenario) -> None:
    carried = [t for t in scenario.tasks if t.id in scenario.carried_over]
    assert carried
    assert all(t.submitted_at == 0.0 for t in carried)
    cold = campus_scenario(seed=0, warm_start=False)
    assert not cold.carried_over
    # The warm start only adds the carried tasks; the day's own arrivals are the same.
    assert cold.tasks == tuple(_arrived(scenario))


def test_fractional_and_multiple_days() -> None:
    half = campus_scenario(seed=3, days=0.5)
    assert all(t.submitted_at < 0.5 * SECONDS_PER_DAY for t in half.tasks)
    two = campus_scenario(seed=3, days=2.0)
    assert two.horizon_s == 2 * SECONDS_PER_DAY
    day1 = [t for t in _arrived(two) if t.submitted_at < SECONDS_PER_DAY]
    day2 = [t for t in _arrived(two) if t.submitted_at >= SECONDS_PER_DAY]
    assert 0.9 < len(day2) / len(day1) < 1.1
    offsets1 = {round(t.submitted_at, 3) for t in day1}
    offsets2 = {round(t.submitted_at - SECONDS_PER_DAY, 3) for t in day2}
    assert len(offsets1 & offsets2) < 0.01 * len(offsets1)  # days differ, not a repeated day


# ---------------------------------------------------------------------------- tariff


def test_tariff() -> None:
    tariff = campus_tariff()
    assert len(tariff.prices) == 24
    assert tariff.price_at(3 * HOUR) == 0.08
    assert tariff.price_at(23.5 * HOUR) == 0.08
    assert tariff.price_at(9 * HOUR) == 0.24
    assert tariff.price_at(18 * HOUR) == 0.24
    assert tariff.price_at(14 * HOUR) == 0.14
    assert tariff.price_at(SECONDS_PER_DAY + 9 * HOUR) == tariff.price_at(9 * HOUR)
    assert tariff.price_at(-1.0) == tariff.price_at(SECONDS_PER_DAY - 1.0)
    with pytest.raises(ValueError, match="24 hourly prices"):
        Tariff((0.1,) * 23)
    with pytest.raises(ValueError, match=">= 0"):
        Tariff((-0.1,) + (0.1,) * 23)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"days": 0.0}, "days must be a finite number > 0"),
        ({"days": -1.0}, "days must be a finite number > 0"),
        ({"days": math.nan}, "days must be a finite number > 0"),
        ({"scale": 0.0}, "scale must be a finite number > 0"),
        ({"scale": -2.0}, "scale must be a finite number > 0"),
    ],
)
def test_bad_input_raises(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        campus_scenario(**kwargs)  # type: ignore[arg-type]


def test_workload_class_validation(scenario: CampusScenario) -> None:
    wc = scenario.classes["video-analytics"]
    with pytest.raises(ValueError, match="288 points"):
        WorkloadClass(
            name="x",
            priority=1,
            slo_wait_s=1.0,
            demand_curve=(1.0,) * 10,
            code="x",
            cpu_choices=(1.0,),
            cpu_weights=(1.0,),
            mem_gib_per_cpu=1.0,
            duration_median_s=1.0,
            duration_sigma=1.0,
        )
    with pytest.raises(ValueError, match="quantile"):
        wc.duration_quantile(1.0)
