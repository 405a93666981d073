"""The discrete-event simulator's accounting, on small scenarios whose answers are known."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from edgesched.core.model import Arch, Node, PowerModel, Resources, ServerClass, Task
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.simulator import simulate
from edgesched.core.strategies import CoreStrategy, FirstFit, partition_fleet
from edgesched.core.tidal import TidalProfile, TidalWindow

HOUR = 3600.0


@dataclass(frozen=True)
class Cls:
    name: str
    priority: int
    slo_wait_s: float
    demand_curve: tuple[float, ...] = (1.0,)


@dataclass(frozen=True)
class FlatTariff:
    price: float = 0.1

    def price_at(self, t: float) -> float:
        return self.price


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[Node, ...]
    tasks: tuple[Task, ...]
    classes: Mapping[str, Cls]
    tariff: FlatTariff = field(default_factory=FlatTariff)
    days: float = 1 / 24  # one hour


def mknode(nid: str, cpu: float = 10, idle: float = 100, peak: float = 200) -> Node:
    return Node(
        nid,
        Arch.X86_64,
        ServerClass.GENERAL,
        Resources(cpu, 100),
        PowerModel(idle, peak, parked_w=10, wake_latency_s=30),
    )


def mktask(tid: str, at: float, dur: float, cpu: float = 5, prio: int = 10, w: str = "a") -> Task:
    return Task(tid, w, prio, Resources(cpu, 1), submitted_at=at, duration_s=dur)


def test_energy_and_utilization_are_integrated_exactly() -> None:
    # One 10-core node, one 5-core task for the first half hour: util 50% then 0%.
    sc = Scenario((mknode("a"),), (mktask("t", 0.0, 1800.0),), {"a": Cls("a", 10, 5)})
    r = simulate(sc, FirstFit(), batch_s=0.0)
    # 0.5 h at 150 W + 0.5 h at 100 W = 125 Wh
    assert r.energy_kwh == pytest.approx(0.125, rel=1e-6)
    assert r.energy_cost == pytest.approx(0.0125, rel=1e-6)
    assert r.utilization_awake == pytest.approx(0.25, rel=1e-6)
    assert r.completed == 1
    assert r.work_core_h == pytest.approx(2.5)
    assert r.classes["a"].slo_misses == 0


def test_draw_charges_dynamic_power_for_a_share_of_the_allocation() -> None:
    # As above, but the task's 5 cores draw dynamic power for half of them (a replica that its
    # requests half fill): 0.5 h at 100 + 100 * 0.25 W + 0.5 h at 100 W = 112.5 Wh.
    sc = Scenario((mknode("a"),), (mktask("t", 0.0, 1800.0),), {"a": Cls("a", 10, 5)})
    r = simulate(sc, FirstFit(), batch_s=0.0, draw={"t": 0.5})
    assert r.energy_kwh == pytest.approx(0.1125, rel=1e-6)
    assert r.utilization_awake == pytest.approx(0.25, rel=1e-6)  # on the allocation


def test_waiting_past_the_slo_is_a_miss_and_never_started_is_a_miss() -> None:
    tasks = (
        mktask("first", 0.0, 600.0, cpu=10),
        mktask("second", 1.0, 600.0, cpu=10),  # waits ~599 s for the node
        mktask("never", 2.0, 600.0, cpu=20),  # never fits
    )
    sc = Scenario((mknode("a"),), tasks, {"a": Cls("a", 10, 60)})
    r = simulate(sc, FirstFit())
    stats = r.classes["a"]
    assert stats.started == 2
    assert stats.slo_misses == 2
    assert stats.wait_p99_s > 500


def test_preempted_task_restarts_and_counts() -> None:
    tasks = (
        mktask("low", 0.0, 3400.0, cpu=10, prio=1, w="low"),
        mktask("high", 100.0, 300.0, cpu=10, prio=50, w="high"),
    )
    classes = {"low": Cls("low", 1, 3600), "high": Cls("high", 50, 5)}
    sc = Scenario((mknode("a"),), tasks, classes)
    r = simulate(sc, CoreStrategy("p", PolicyConfig(mode=PolicyMode.PRIORITY)))
    assert r.preemptions == 1
    assert r.classes["low"].preempted == 1
    assert r.classes["high"].slo_misses == 0
    # high runs 100..~401, low restarts from scratch after it: 3400 s more, past the hour
    assert r.classes["low"].completed == 0
    assert r.classes["high"].completed == 1


def test_energy_mode_parks_idle_nodes_and_saves_energy() -> None:
    # Two hours: nothing is parked before the forecast has data (10 minutes without a prior).
    nodes = tuple(mknode(f"n{i}") for i in range(4))
    tasks = tuple(mktask(f"t{i}", 10.0 * i, 6600.0, cpu=2) for i in range(3))
    sc = Scenario(nodes, tasks, {"a": Cls("a", 10, 60)}, days=2 / 24)
    spread = simulate(sc, CoreStrategy("b", PolicyConfig(mode=PolicyMode.BALANCE)))
    energy = simulate(
        sc,
        CoreStrategy(
            "e", PolicyConfig(mode=PolicyMode.ENERGY, park_idle_after_s=60, min_spare_cpu=2)
        ),
    )
    assert energy.parks >= 2
    assert energy.energy_kwh < spread.energy_kwh * 0.7
    assert energy.utilization_awake > spread.utilization_awake
    assert energy.classes["a"].slo_misses == 0
    assert energy.completed == spread.completed == 3


def test_tidal_window_gives_its_class_the_node_back() -> None:
    window = TidalWindow("w", 600.0, HOUR, {"owner": 0.6})
    tasks = (
        mktask("borrower", 0.0, 3000.0, cpu=10, prio=60, w="borrower"),
        mktask("owner", 700.0, 600.0, cpu=5, prio=40, w="owner"),
    )
    classes = {"borrower": Cls("borrower", 60, 60), "owner": Cls("owner", 40, 30)}
    sc = Scenario((mknode("a"),), tasks, classes)
    policy = PolicyConfig(mode=PolicyMode.BALANCE, tidal=TidalProfile("t", (window,)))
    r = simulate(sc, CoreStrategy("tidal", policy))
    assert r.classes["borrower"].preempted == 1
    assert r.classes["owner"].slo_misses == 0
    untidal = simulate(sc, CoreStrategy("plain", PolicyConfig(mode=PolicyMode.BALANCE)))
    assert untidal.classes["owner"].slo_misses == 1


def test_static_partition_keeps_classes_in_their_slices() -> None:
    nodes = (mknode("a"), mknode("b"))
    tasks = (
        mktask("x1", 0.0, 3000.0, cpu=8, w="x"),
        mktask("x2", 1.0, 3000.0, cpu=8, w="x"),  # its slice is full, the other is free
        mktask("y1", 2.0, 3000.0, cpu=2, w="y"),
    )
    classes = {"x": Cls("x", 10, 60, (8.0,)), "y": Cls("y", 10, 60, (8.0,))}
    sc = Scenario(nodes, tasks, classes)
    samples = {"x": tasks[0], "y": tasks[2]}
    peaks = {"x": Resources(cpu=8.0), "y": Resources(cpu=8.0)}
    static = partition_fleet(nodes, peaks, samples)
    assert sorted(len(s) for s in static.slices.values()) == [1, 1]
    r = simulate(sc, static)
    # x2 waits for x1 to finish (3000 s) although node b stays nearly empty
    assert r.classes["x"].slo_misses == 1
    assert r.classes["x"].wait_p99_s > 2900
    assert r.classes["y"].slo_misses == 0
    shared = simulate(sc, FirstFit())
    assert shared.classes["x"].started == 2
