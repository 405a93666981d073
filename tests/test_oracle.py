"""The clairvoyant power manager (core/oracle.py): the demand it knows, the view it shows the
core, the run it picks, and what knowing the future buys on a small scenario."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_energy_slo import Cls, Scenario

from edgesched.core.model import Arch, Node, PowerModel, Resources, ServerClass, Task
from edgesched.core.oracle import (
    Clairvoyant,
    OfferedDemand,
    best_oracle,
    lead_for,
    oracle_name,
    oracle_strategy,
    spare_of,
)
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, ScheduleResult
from edgesched.core.simulator import simulate
from edgesched.core.strategies import CoreStrategy


def task(tid: str, at: float, dur: float | None, cpu: float = 1.0, accel: int = 0) -> Task:
    return Task(tid, "a", 10, Resources(cpu, 1, accel=accel), submitted_at=at, duration_s=dur)


def brute_level(tasks: Sequence[Task], t: float) -> tuple[float, float]:
    cpu = accel = 0.0
    for x in tasks:
        end = x.submitted_at + (x.duration_s if x.duration_s is not None else float("inf"))
        if x.submitted_at <= t < end:
            cpu += x.demand.cpu
            accel += x.demand.accel
    return cpu, accel


intervals = st.lists(
    st.tuples(
        st.integers(0, 100),  # start
        st.one_of(st.none(), st.integers(0, 50)),  # duration (None: a service)
        st.integers(1, 8),  # cores
        st.integers(0, 2),  # accelerators
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(intervals, st.integers(-10, 160), st.integers(0, 60))
def test_the_peak_is_the_highest_level_in_the_window(
    spec: list[tuple[int, int | None, int, int]], start: int, width: int
) -> None:
    tasks = [
        task(f"t{i}", float(s), None if d is None else float(d), c, a)
        for i, (s, d, c, a) in enumerate(spec)
    ]
    demand = OfferedDemand.of(tasks)
    # levels change only at whole seconds here: probing every second and every boundary
    # covers every level the window holds
    probes = [float(t) for t in range(start, start + width + 1)]
    want_cpu = max(brute_level(tasks, t)[0] for t in probes)
    want_accel = max(brute_level(tasks, t)[1] for t in probes)
    assert demand.peak(start, start + width) == pytest.approx((want_cpu, want_accel))
    for t in probes:
        assert demand.level(t) == pytest.approx(brute_level(tasks, t))


def test_a_task_ending_as_another_starts_frees_its_cores_first() -> None:
    demand = OfferedDemand.of([task("a", 0, 10, cpu=4), task("b", 10, 10, cpu=4)])
    assert demand.peak(0, 20) == (4.0, 0.0)
    assert demand.level(20) == (0.0, 0.0)


def test_a_window_before_any_task_asks_nothing() -> None:
    demand = OfferedDemand.of([task("a", 100, 10, cpu=4)])
    assert demand.peak(0, 50) == (0.0, 0.0)
    assert demand.peak(0, 100) == (4.0, 0.0)
    with pytest.raises(ValueError):
        demand.peak(10, 5)


@dataclass
class Recorder:
    name: str = "recorder"
    seen: list[ClusterView] = field(default_factory=list)

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        self.seen.append(view)
        return ScheduleResult(())


def test_the_core_sees_the_true_peak_over_the_lead_and_a_ready_forecast() -> None:
    demand = OfferedDemand.of([task("a", 0, 100, cpu=2), task("b", 150, 100, cpu=6, accel=1)])
    inner = Recorder()
    oracle = Clairvoyant(inner, demand, lead_s=60.0)
    view = ClusterView((), forecast_cpu=99.0, forecast_ready=False, forecast_accel=9.0, now=50)
    oracle.decide(view, ())
    oracle.decide(ClusterView((), now=100.0), ())
    first, second = inner.seen
    assert (first.forecast_cpu, first.forecast_accel, first.forecast_ready) == (2.0, 0.0, True)
    assert (second.forecast_cpu, second.forecast_accel) == (6.0, 1.0)  # b starts at 150


def node(nid: str, wake: float) -> Node:
    return Node(
        nid,
        Arch.X86_64,
        ServerClass.GENERAL,
        Resources(16, 64),
        PowerModel(100, 200, parked_w=5, wake_latency_s=wake),
    )


def test_the_lead_is_the_slowest_wake_up_and_a_tick() -> None:
    assert lead_for([node("a", 30), node("b", 120)]) == 180.0
    assert lead_for([]) == 60.0


def test_knowing_the_future_wakes_ahead_of_a_burst_the_forecast_cannot_see() -> None:
    # Two 16-core nodes; a 4-core task runs all along, then at 1 h a burst asks 24 cores
    # more for ten minutes, with a 10 s objective and a 120 s wake-up. With no spare, the
    # forecast, which has never seen the burst, parks the second node; the oracle, with no
    # spare either, keeps it parked until the burst is one lead away, then has it awake when
    # the burst lands.
    nodes = (node("n1", 120), node("n2", 120))
    burst = [task(f"b{i}", 3600.0, 600.0, cpu=4) for i in range(6)]
    tasks = (task("base", 0.0, 7200.0, cpu=4), *burst)
    sc = Scenario(nodes, tasks, {"a": Cls("a", 10, 10.0)}, days=2 / 24)
    policy = PolicyConfig(mode=PolicyMode.ENERGY, spare_cpu_fraction=0.0, min_spare_cpu=0.0)
    forecast = simulate(sc, CoreStrategy("energy", policy))
    oracle = simulate(sc, oracle_strategy(nodes, tasks, spare=0.0))
    assert forecast.slo_misses > 0  # the burst waited for the wake-up
    assert oracle.slo_misses == 0
    assert oracle.parks >= 1 and oracle.wakes >= 1  # it did park, and woke ahead
    # it parked the second node for most of the first hour: well under two nodes all along
    all_awake_kwh = 2 * 0.1 * 2 + 0.2  # both idle for 2 h, plus the work's dynamic power
    assert oracle.energy_kwh < 0.8 * all_awake_kwh


def test_the_pick_is_the_least_energy_within_the_bound() -> None:
    runs = [(oracle_name(0.0), 9.0, 5), (oracle_name(0.1), 9.5, 1), (oracle_name(0.3), 9.8, 0)]
    best = best_oracle(runs, max_misses=1)
    assert (best.spare, best.energy_kwh, best.misses, best.tried) == (0.1, 9.5, 1, 3)
    assert best_oracle(runs, max_misses=10).spare == 0.0
    none = best_oracle(runs[:1], max_misses=0)
    assert (none.spare, none.energy_kwh, none.tried) == (None, None, 1)


def test_names_carry_the_spare() -> None:
    assert spare_of(oracle_name(0.25)) == 0.25
    with pytest.raises(ValueError):
        spare_of("energy")
