"""Tests for the per-core CPU affinity planner (edgesched.core.affinity)."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.affinity import (
    LOCALITY_MARGIN,
    AffinityDemand,
    AffinityPlan,
    arm48_demands,
    arm48_experiment,
    naive_plan,
    plan_affinity,
    simulate_throughput,
    to_pin_decisions,
)
from edgesched.core.model import CoreTopology, DecisionKind

EPS = 1e-6


@st.composite
def topologies(draw: st.DrawFn) -> CoreTopology:
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    start, clusters = 0, []
    for size in sizes:
        clusters.append(tuple(range(start, start + size)))
        start += size
    return CoreTopology(tuple(clusters))


loads = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)


@st.composite
def demand_lists(draw: st.DrawFn) -> list[AffinityDemand]:
    threads = draw(st.lists(st.lists(loads, min_size=1, max_size=16), max_size=20))
    return [AffinityDemand(f"t{i}", tuple(t)) for i, t in enumerate(threads)]


def check_plan(topology: CoreTopology, demands: list[AffinityDemand], plan: AffinityPlan) -> None:
    cores = set(topology.cores)
    assert list(plan.assignments) == [d.task_id for d in demands]
    assert list(plan.thread_cores) == [d.task_id for d in demands]
    assert list(plan.core_load) == list(topology.cores)
    recomputed = dict.fromkeys(topology.cores, 0.0)
    for d in demands:
        pinned = plan.assignments[d.task_id]
        assert pinned, d.task_id
        assert list(pinned) == sorted(set(pinned))
        assert set(pinned) <= cores
        placed = plan.thread_cores[d.task_id]
        assert len(placed) == len(d.threads)  # every thread exactly once
        assert set(placed) <= set(pinned)
        for core, load in zip(placed, d.threads, strict=True):
            recomputed[core] += load
    for core, load in plan.core_load.items():
        assert load == pytest.approx(recomputed[core], abs=EPS)
    total = math.fsum(d.load for d in demands)
    assert math.fsum(plan.core_load.values()) == pytest.approx(total, abs=EPS)


@settings(max_examples=150, deadline=None)
@given(topologies(), demand_lists())
def test_plan_is_complete_and_consistent(
    topology: CoreTopology, demands: list[AffinityDemand]
) -> None:
    plan = plan_affinity(topology, demands)
    check_plan(topology, demands, plan)
    check_plan(topology, demands, naive_plan(topology, demands, seed=3))
    check_plan(topology, demands, naive_plan(topology, demands, seed=3, mode="random"))


@settings(max_examples=100, deadline=None)
@given(topologies(), demand_lists())
def test_plan_is_deterministic(topology: CoreTopology, demands: list[AffinityDemand]) -> None:
    assert plan_affinity(topology, demands) == plan_affinity(topology, list(demands))
    assert naive_plan(topology, demands, 7) == naive_plan(topology, demands, 7)


@settings(max_examples=200, deadline=None)
@given(topologies(), demand_lists(), st.integers(0, 1000))
def test_plan_beats_naive_baselines(
    topology: CoreTopology, demands: list[AffinityDemand], seed: int
) -> None:
    # What holds (each checked on 20k generated cases before writing this): the planner never
    # overloads a core when a baseline does not, and whenever the baseline overloads no core,
    # its spread is at most the baseline's plus LOCALITY_MARGIN, the std the planner may give
    # up to keep a task inside one cluster. Caveats, both seen in generated cases: when a
    # baseline overloads cores, clipping utilization at 1.0 can give it the *lower* std (two
    # threads stacked on one core read as one busy core), so std is not compared then; and
    # local search is a heuristic for an NP-hard partition problem, so under heavy overload
    # its peak can exceed a lucky baseline's (by 0.5% in the worst case found; 1% allowed).
    def slack(naive: AffinityPlan) -> float:
        return max(naive.max_load(), 1.0) * (1.01 if naive.max_load() > 1.0 else 1.0) + EPS

    plan = plan_affinity(topology, demands)
    for mode in ("block", "random"):
        naive = naive_plan(topology, demands, seed, mode=mode)
        assert plan.max_load() <= slack(naive)
        if naive.max_load() <= 1.0:
            assert plan.std() <= naive.std() + LOCALITY_MARGIN + EPS
    # with a single cluster there is no locality to trade: when the block baseline overloads
    # no core, its peak and spread are matched or beaten outright
    flat = CoreTopology((topology.cores,))
    plan, naive = plan_affinity(flat, demands), naive_plan(flat, demands, seed)
    overloaded = naive.max_load() > 1.0
    assert plan.max_load() <= naive.max_load() * (1.01 if overloaded else 1.0) + EPS
    if not overloaded:
        assert plan.std() <= naive.std() + EPS


@settings(max_examples=100, deadline=None)
@given(topologies(), demand_lists())
def test_heaviest_fitting_task_stays_in_one_cluster(
    topology: CoreTopology, demands: list[AffinityDemand]
) -> None:
    # When every task fits some empty cluster, the planner homes the heaviest task first, so a
    # multi-thread one always gets a cluster, and with locality made binding it keeps it.
    # (Tasks too big for any cluster are spread over the node first and may fill the cluster
    # it would have taken; by default, locality also yields to relieve an overloaded core or
    # to cut the spread by more than LOCALITY_MARGIN.)
    def fits(d: AffinityDemand) -> bool:
        return any(len(d.threads) <= len(c) and d.load <= len(c) for c in topology.clusters)

    if not demands or not all(fits(d) for d in demands):
        return
    top = min(demands, key=lambda d: (-d.load, d.task_id))  # the planner's order
    if len(top.threads) == 1:
        return
    plan = plan_affinity(topology, demands, locality_margin=math.inf)
    home = [c for c in topology.clusters if set(plan.assignments[top.task_id]) <= set(c)]
    assert len(home) == 1


def test_task_that_fits_stays_within_one_cluster() -> None:
    topology = CoreTopology.uniform(48, 4)
    demands = [AffinityDemand(f"t{i}", (0.5,) * 6) for i in range(6)]
    demands += [AffinityDemand(f"s{i}", (0.3,)) for i in range(20)]
    plan = plan_affinity(topology, demands)
    for d in demands[:6]:
        cores = set(plan.assignments[d.task_id])
        assert sum(cores <= set(c) for c in topology.clusters) == 1
    assert plan.max_load() <= 0.6 + EPS  # 36 threads of 0.5 and 20 of 0.3 on 48 cores


def test_existing_pins_are_kept_when_already_balanced() -> None:
    topology = CoreTopology.uniform(48, 4)
    demands = arm48_demands(0.6, seed=1)
    first = plan_affinity(topology, demands)
    existing = {t: frozenset(c) for t, c in first.assignments.items()}
    again = plan_affinity(topology, demands, existing)
    assert again.assignments == first.assignments
    assert again.kept == frozenset(existing)
    # a newcomer is placed around the pinned tasks, which do not move
    grown = [*demands, AffinityDemand("new", (0.4, 0.4))]
    third = plan_affinity(topology, grown, existing)
    assert {t: third.assignments[t] for t in existing} == first.assignments
    assert "new" not in third.kept
    check_plan(topology, grown, third)


def test_bad_existing_pins_are_given_up() -> None:
    topology = CoreTopology.uniform(8, 2)
    demands = [AffinityDemand(f"t{i}", (0.6, 0.6)) for i in range(4)]
    existing = {d.task_id: frozenset({0}) for d in demands}  # all stacked on core 0
    plan = plan_affinity(topology, demands, existing)
    assert plan.kept == frozenset()
    assert plan.max_load() <= 1.0 + EPS


def test_arm48_experiment_at_load_07() -> None:
    r = arm48_experiment(0.7, seed=0)
    assert r["load"] == 0.7
    assert r["planned_std"] <= 0.09
    # The honest block baseline gives ~0.19 at this load (0.17-0.21 over seeds 0-19), short of
    # the article's 0.25+; only the random-per-thread baseline exceeds it (~0.35).
    assert r["naive_std"] >= 0.15
    assert r["naive_random_std"] >= 0.25
    assert r["planned_throughput"] == pytest.approx(0.7 * 48)  # no overcommitted core
    assert r["throughput_gain"] > 0.1
    assert arm48_experiment(0.7, seed=0) == r


def test_arm48_demands_total_load() -> None:
    for load in (0.5, 0.7, 0.9):
        demands = arm48_demands(load, seed=2)
        assert math.fsum(d.load for d in demands) == pytest.approx(load * 48)
        assert all(1 <= len(d.threads) <= 16 for d in demands)


def test_throughput_model() -> None:
    topology = CoreTopology.uniform(4)
    demands = [
        AffinityDemand("a", (0.6, 0.6, 0.6)),
        AffinityDemand("b", (0.5,)),
        AffinityDemand("c", (0.5,)),
    ]
    balanced = plan_affinity(topology, demands)  # a on 3 cores, b and c share the 4th
    assert balanced.max_load() == pytest.approx(1.0)
    assert simulate_throughput(topology, demands, balanced) == pytest.approx(2.8)
    # block baseline: c wraps onto a's first core (load 1.1), slowing a and c to 1/1.1
    stacked = naive_plan(topology, demands, seed=0)
    assert sorted(stacked.core_load.values()) == pytest.approx([0.5, 0.6, 0.6, 1.1])
    expected = (1.8 + 0.5) / 1.1 + 0.5
    assert simulate_throughput(topology, demands, stacked) == pytest.approx(expected)


def test_to_pin_decisions() -> None:
    topology = CoreTopology.uniform(8, 2)
    demands = [AffinityDemand("a", (0.5, 0.5)), AffinityDemand("b", (0.9,))]
    plan = plan_affinity(topology, demands)
    decisions = to_pin_decisions("node-1", plan, at=12.0)
    assert [d.task_id for d in decisions] == ["a", "b"]
    for d in decisions:
        assert d.kind is DecisionKind.PIN and d.node_id == "node-1" and d.at == 12.0
        assert d.task_id is not None
        assert d.cores == plan.assignments[d.task_id]
        assert d.reason == f"affinity: spread {plan.std() * 100:.1f}%"
        assert d.scores["core_std"] == pytest.approx(plan.std())


def test_planning_is_fast() -> None:
    topology = CoreTopology.uniform(48, 4)
    demands = arm48_demands(1.3, seed=0)  # ~200 threads
    assert sum(len(d.threads) for d in demands) >= 180
    start = time.perf_counter()
    for _ in range(5):
        plan_affinity(topology, demands)
    assert (time.perf_counter() - start) / 5 < 0.05  # ~4 ms typical; loose for slow CI


@pytest.mark.parametrize(
    ("topology", "demands", "message"),
    [
        (CoreTopology(()), [AffinityDemand("a", (0.5,))], "at least one core"),
        (
            CoreTopology.uniform(4),
            [AffinityDemand("a", (0.5,)), AffinityDemand("a", (0.2,))],
            "duplicate task id",
        ),
    ],
)
def test_bad_plan_input(
    topology: CoreTopology, demands: list[AffinityDemand], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_affinity(topology, demands)
    with pytest.raises(ValueError, match=message):
        naive_plan(topology, demands)


@pytest.mark.parametrize("load", [0.0, -0.1, 1.01, math.nan])
def test_bad_thread_load(load: float) -> None:
    with pytest.raises(ValueError, match=r"must be in \(0, 1\] cores"):
        AffinityDemand("a", (0.5, load))


def test_bad_demand_and_pins() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        AffinityDemand("a", ())
    with pytest.raises(ValueError, match="must not be empty"):
        AffinityDemand("", (0.5,))
    topology = CoreTopology.uniform(4)
    with pytest.raises(ValueError, match="existing pin"):
        plan_affinity(topology, [AffinityDemand("a", (0.5,))], {"a": frozenset({9})})
    with pytest.raises(ValueError, match="existing pin"):
        plan_affinity(topology, [AffinityDemand("a", (0.5,))], {"a": frozenset()})
