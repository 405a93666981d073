"""The scheduling core: placement, modes, preemption, tidal reclaim, parking, and its invariants."""

from __future__ import annotations

import random
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.apply import apply_decisions
from edgesched.core.model import (
    Arch,
    CoreTopology,
    DecisionKind,
    Node,
    NodeState,
    Placement,
    PowerModel,
    Resources,
    ServerClass,
    Task,
)
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import TIDAL_BOOST, ClusterView, Scheduler, schedule
from edgesched.core.tidal import TidalProfile, TidalWindow

POWER = PowerModel(idle_w=100, peak_w=300, parked_w=10, wake_latency_s=60)


def node(
    nid: str,
    cpu: float = 16,
    mem: float = 64,
    arch: Arch = Arch.X86_64,
    cls: ServerClass = ServerClass.GENERAL,
    accel: int = 0,
    power: PowerModel = POWER,
    state: NodeState = NodeState.ACTIVE,
    idle_since: float | None = None,
) -> Node:
    return Node(
        nid,
        arch,
        cls,
        Resources(cpu, mem, accel),
        power,
        state=state,
        idle_since=idle_since,
    )


def task(
    tid: str,
    cpu: float = 2,
    prio: int = 10,
    workload: str = "w",
    at: float = 0.0,
    **kw: object,
) -> Task:
    return Task(tid, workload, prio, Resources(cpu, 4), submitted_at=at, **kw)  # type: ignore[arg-type]


def test_places_on_feasible_node_with_arch_image() -> None:
    nodes = (node("a", arch=Arch.ARM64), node("b", arch=Arch.X86_64))
    t = task("t1", images={Arch.ARM64: "img:arm"})
    result = schedule(ClusterView(nodes), [t], PolicyConfig())
    (place,) = result.of_kind(DecisionKind.PLACE)
    assert place.node_id == "a"
    assert place.image == "img:arm"
    assert "total" in place.scores


def test_waiting_task_gets_explained() -> None:
    nodes = (node("a", arch=Arch.ARM64), node("b", cpu=4))
    t = task("big", cpu=8, archs=frozenset({Arch.X86_64}))
    result = schedule(ClusterView(nodes), [t], PolicyConfig())
    assert not result.decisions
    reason = result.waiting["big"]
    assert reason.startswith("0/2 nodes available")
    assert "1 wrong architecture" in reason and "1 insufficient resources" in reason


def test_balance_spreads_and_energy_packs_on_efficient_node() -> None:
    efficient = PowerModel(idle_w=50, peak_w=150)
    nodes = (node("hungry"), node("lean", power=efficient))
    tasks = [task(f"t{i}", at=i) for i in range(4)]
    scheduler = Scheduler(PolicyConfig(mode=PolicyMode.BALANCE))
    spread = scheduler.schedule(ClusterView(nodes), tasks)
    assert {d.node_id for d in spread.of_kind(DecisionKind.PLACE)} == {"hungry", "lean"}
    # Switched at run time: the next cycle packs instead.
    scheduler = scheduler.with_policy(PolicyConfig(mode=PolicyMode.ENERGY))
    packed = scheduler.schedule(ClusterView(nodes), tasks)
    assert {d.node_id for d in packed.of_kind(DecisionKind.PLACE)} == {"lean"}


def test_accelerator_work_keeps_off_general_nodes_and_general_work_off_gpus() -> None:
    nodes = (node("gen"), node("gpu", cls=ServerClass.AI_ACCELERATOR, accel=4))
    plain = task("plain")
    train = Task("train", "ai", 10, Resources(4, 8, 1))
    result = schedule(ClusterView(nodes), [plain, train], PolicyConfig())
    where = {d.task_id: d.node_id for d in result.of_kind(DecisionKind.PLACE)}
    assert where == {"plain": "gen", "train": "gpu"}


def test_priority_preemption_evicts_lowest_youngest_first() -> None:
    n = node("a", cpu=8)
    running = (
        Placement(task("old-low", cpu=4, prio=1), "a", 0.0),
        Placement(task("new-low", cpu=4, prio=1), "a", 50.0),
    )
    urgent = task("urgent", cpu=4, prio=50)
    result = schedule(ClusterView((n,), running, now=100), [urgent], PolicyConfig())
    (pre,) = result.of_kind(DecisionKind.PREEMPT)
    assert pre.task_id == "new-low"
    assert result.of_kind(DecisionKind.PLACE)[0].task_id == "urgent"


def test_no_preemption_of_equal_priority_or_non_preemptible() -> None:
    n = node("a", cpu=4)
    running = (
        Placement(task("peer", cpu=2, prio=50), "a", 0.0),
        Placement(task("pinned", cpu=2, prio=1, preemptible=False), "a", 0.0),
    )
    result = schedule(ClusterView((n,), running), [task("x", cpu=2, prio=50)], PolicyConfig())
    assert not result.decisions
    assert "x" in result.waiting


def test_balance_mode_preempts_only_to_restore_a_tidal_share() -> None:
    n = node("a", cpu=8)
    running = (Placement(task("bulk", cpu=8, prio=60, workload="desktop"), "a", 0.0),)
    urgent = task("train", cpu=4, prio=40, workload="ai")
    plain = PolicyConfig(mode=PolicyMode.BALANCE)
    assert not schedule(ClusterView((n,), running), [urgent], plain).decisions
    window = TidalWindow("lunch", 0.0, 3600.0, {"ai": 0.6})
    tidal = PolicyConfig(mode=PolicyMode.BALANCE, tidal=TidalProfile("t", (window,)))
    result = schedule(ClusterView((n,), running, now=10), [urgent], tidal)
    (pre,) = result.of_kind(DecisionKind.PREEMPT)
    assert pre.task_id == "bulk"
    assert pre.scores["preemptor_priority"] == 40 + TIDAL_BOOST
    # Outside the window the same request waits.
    later = schedule(ClusterView((n,), running, now=4000), [urgent], tidal)
    assert not later.decisions


def test_tidal_share_is_a_guarantee_not_a_licence() -> None:
    """A class already at its share cannot preempt to grow beyond it."""
    n = node("a", cpu=10)
    window = TidalWindow("w", 0.0, 3600.0, {"ai": 0.5})
    policy = PolicyConfig(mode=PolicyMode.BALANCE, tidal=TidalProfile("t", (window,)))
    running = (
        Placement(task("ai-1", cpu=5, prio=40, workload="ai"), "a", 0.0),
        Placement(task("desk", cpu=5, prio=60, workload="desktop"), "a", 0.0),
    )
    result = schedule(ClusterView((n,), running, now=1), [task("ai-2", 5, 40, "ai")], policy)
    assert not result.decisions


def test_energy_mode_parks_idle_nodes_beyond_headroom_least_efficient_first() -> None:
    lean = PowerModel(idle_w=50, peak_w=150)
    nodes = (
        *(node(f"n{i}", idle_since=0.0) for i in range(4)),
        node("lean", power=lean, idle_since=0.0),
    )
    policy = PolicyConfig(mode=PolicyMode.ENERGY, min_spare_cpu=8, park_idle_after_s=60)
    result = schedule(ClusterView(nodes, now=1000, forecast_cpu=10), [], policy)
    parked = {d.node_id for d in result.of_kind(DecisionKind.PARK)}
    # Needs 10 * 1.15 + 8 = 19.5 cores awake: two 16-core nodes stay, the lean one among them.
    assert len(parked) == 3 and "lean" not in parked
    # Not yet idle long enough: nothing parks.
    early = schedule(ClusterView(nodes, now=30, forecast_cpu=10), [], policy)
    assert not early.of_kind(DecisionKind.PARK)


def test_energy_mode_wakes_for_waiting_work_and_for_forecast() -> None:
    nodes = (node("awake", cpu=4), node("p1", state=NodeState.PARKED))
    policy = PolicyConfig(mode=PolicyMode.ENERGY, min_spare_cpu=0, spare_cpu_fraction=0)
    result = schedule(ClusterView(nodes), [task("big", cpu=8)], policy)
    assert [d.node_id for d in result.of_kind(DecisionKind.WAKE)] == ["p1"]
    assert "big" in result.waiting
    ahead = schedule(ClusterView(nodes, forecast_cpu=12), [], policy)
    assert [d.node_id for d in ahead.of_kind(DecisionKind.WAKE)] == ["p1"]


def test_other_modes_wake_every_parked_node() -> None:
    nodes = (node("a"), node("p", state=NodeState.PARKED))
    result = schedule(ClusterView(nodes), [], PolicyConfig(mode=PolicyMode.BALANCE))
    assert [d.node_id for d in result.of_kind(DecisionKind.WAKE)] == ["p"]


def test_energy_mode_consolidates_migratable_work() -> None:
    nodes = (node("a"), node("b"), node("c"))
    running = (
        Placement(task("s1", cpu=2, migratable=True), "a", 0.0),
        Placement(task("s2", cpu=10), "b", 0.0),
    )
    policy = PolicyConfig(mode=PolicyMode.ENERGY, min_spare_cpu=0)
    result = schedule(ClusterView(nodes, running, now=10), [], policy)
    (move,) = result.of_kind(DecisionKind.MIGRATE)
    assert (move.task_id, move.from_node, move.node_id) == ("s1", "a", "b")


def test_duplicate_pending_task_is_an_error() -> None:
    try:
        schedule(ClusterView((node("a"),)), [task("x"), task("x")], PolicyConfig())
    except ValueError as exc:
        assert "pending twice" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("duplicate pending task accepted")


# --- properties -----------------------------------------------------------------------------

archs = st.sampled_from(list(Arch))
classes = st.sampled_from(list(ServerClass))
modes = st.sampled_from(list(PolicyMode))


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterView, list[Task], PolicyConfig]:
    n_nodes = draw(st.integers(1, 6))
    nodes = []
    for i in range(n_nodes):
        nodes.append(
            Node(
                f"n{i}",
                draw(archs),
                draw(classes),
                Resources(
                    draw(st.integers(2, 32)), draw(st.integers(4, 128)), draw(st.integers(0, 4))
                ),
                POWER,
                state=draw(st.sampled_from([NodeState.ACTIVE] * 3 + [NodeState.PARKED])),
                idle_since=draw(st.one_of(st.none(), st.floats(0, 100))),
            )
        )
    workloads = ["a", "b", "c"]
    placements: list[Placement] = []
    for i in range(draw(st.integers(0, 10))):
        host = draw(st.sampled_from(nodes))
        t = Task(
            f"r{i}",
            draw(st.sampled_from(workloads)),
            draw(st.integers(0, 100)),
            Resources(draw(st.integers(1, 8)), draw(st.integers(1, 16)), draw(st.integers(0, 1))),
            preemptible=draw(st.booleans()),
            migratable=draw(st.booleans()),
        )
        used = [p.task.demand for p in placements if p.node_id == host.id]
        total = Resources()
        for d in used:
            total = total + d
        if (total + t.demand).fits_in(host.capacity) and host.state is NodeState.ACTIVE:
            placements.append(Placement(t, host.id, draw(st.floats(0, 100))))
    pending = [
        Task(
            f"p{i}",
            draw(st.sampled_from(workloads)),
            draw(st.integers(0, 100)),
            Resources(draw(st.integers(1, 12)), draw(st.integers(1, 32)), draw(st.integers(0, 2))),
            submitted_at=draw(st.floats(0, 100)),
            archs=frozenset(draw(st.lists(archs, max_size=2))),
            server_classes=frozenset(draw(st.lists(classes, max_size=2))),
            preemptible=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    windows: tuple[TidalWindow, ...] = ()
    if draw(st.booleans()):
        windows = (TidalWindow("w", 0.0, 7200.0, {"a": draw(st.floats(0, 0.9))}),)
    policy = PolicyConfig(
        mode=draw(modes),
        tidal=TidalProfile("p", windows),
        preemption=draw(st.booleans()),
        min_spare_cpu=draw(st.integers(0, 16)),
        park_idle_after_s=0,
        accel_reserve_cpu=draw(st.sampled_from([0.0, 4.0])),
        accel_reserve_mem_gib=draw(st.sampled_from([0.0, 8.0])),
        score_nodes=draw(st.sampled_from([0, 1, 2, 500])),  # 1 and 2: a sample of 3+ nodes
    )
    view = ClusterView(tuple(nodes), tuple(placements), now=draw(st.floats(0, 7000)))
    return view, pending, policy


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_property_no_decision_overcommits_a_node(
    case: tuple[ClusterView, list[Task], PolicyConfig],
) -> None:
    view, pending, policy = case
    result = schedule(view, pending, policy)
    after = apply_decisions(view.nodes, view.placements, pending, result.decisions, view.now)
    load: dict[str, Resources] = defaultdict(Resources)
    for p in after.placements:
        load[p.node_id] = load[p.node_id] + p.task.demand
    states = {n.id: n for n in view.nodes}
    for node_id, used in load.items():
        assert used.fits_in(states[node_id].capacity), (node_id, used)
    # Every pending task is either placed or explained, never both.
    placed = set(after.placed)
    assert placed.isdisjoint(result.waiting)
    assert placed | set(result.waiting) == {t.id for t in pending}
    # Placed tasks land on nodes that were active, compatible and allowed.
    for d in result.of_kind(DecisionKind.PLACE):
        host = states[d.node_id]
        t = next(t for t in pending if t.id == d.task_id)
        assert host.state is NodeState.ACTIVE
        assert t.runs_on(host.arch)
        assert not t.server_classes or host.server_class in t.server_classes
    # Parked nodes never hold work after the cycle.
    parked = {n.id for n in after.nodes if n.state is NodeState.PARKED}
    assert not any(p.node_id in parked for p in after.placements)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_property_preemption_never_evicts_higher_for_lower(
    case: tuple[ClusterView, list[Task], PolicyConfig],
) -> None:
    view, pending, policy = case
    result = schedule(view, pending, policy)
    tasks = {p.task.id: p.task for p in view.placements} | {t.id: t for t in pending}
    decisions = list(result.decisions)
    for i, d in enumerate(decisions):
        if d.kind is not DecisionKind.PREEMPT:
            continue
        victim = tasks[d.task_id or ""]
        assert victim.preemptible
        # The PLACE that caused it follows the run of PREEMPTs for the same node.
        cause = next(x for x in decisions[i:] if x.kind is DecisionKind.PLACE)
        preemptor = tasks[cause.task_id or ""]
        assert cause.node_id == d.node_id
        assert d.scores["victim_priority"] < d.scores["preemptor_priority"]
        if not policy.tidal.windows:
            assert victim.priority < preemptor.priority
        if not policy.preemption or policy.mode is PolicyMode.BALANCE:
            # Only tidal reclaim may preempt: the preemptor holds a share, the victim does not.
            assert d.scores["preemptor_priority"] >= TIDAL_BOOST > d.scores["victim_priority"]


@settings(max_examples=200, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_property_same_inputs_same_decisions_whatever_the_order(
    case: tuple[ClusterView, list[Task], PolicyConfig], rnd: random.Random
) -> None:
    view, pending, policy = case
    first = schedule(view, pending, policy)
    nodes, placements, shuffled = list(view.nodes), list(view.placements), list(pending)
    rnd.shuffle(nodes)
    rnd.shuffle(placements)
    rnd.shuffle(shuffled)
    view2 = ClusterView(tuple(nodes), tuple(placements), view.now, view.forecast_cpu)
    second = schedule(view2, shuffled, policy)
    assert first == second


def test_pin_stage_plans_cores_for_changed_nodes_and_keeps_stable_pins() -> None:
    topo = CoreTopology.uniform(8, clusters=2)
    host = Node("arm", Arch.ARM64, ServerClass.GENERAL, Resources(8, 64), POWER, topology=topo)
    running = (Placement(task("old", cpu=2), "arm", 0.0),)
    new = [task("a", cpu=3), task("b", cpu=1, threads=2)]
    view = ClusterView((host,), running, now=5.0, pin_cores=True)
    result = schedule(view, new, PolicyConfig())
    pins = {d.task_id: d.cores for d in result.of_kind(DecisionKind.PIN)}
    assert set(pins) == {"old", "a", "b"}
    assert all(cores and set(cores) <= set(topo.cores) for cores in pins.values())
    assert len(pins["a"]) >= 3  # three whole cores of demand
    # Nothing changed since: with the pins fed back, the next cycle re-pins nothing.
    after = apply_decisions(view.nodes, running, new, result.decisions, 5.0)
    again = schedule(
        ClusterView(
            (host,),
            after.placements,
            now=6.0,
            pin_cores=True,
            pins={k: frozenset(v) for k, v in pins.items() if k},
        ),
        [task("c", cpu=1)],
        PolicyConfig(),
    )
    repinned = {d.task_id for d in again.of_kind(DecisionKind.PIN)}
    assert "c" in repinned
    assert repinned <= {"a", "b", "c", "old"}
    # Without the flag the core emits no pins at all.
    assert not schedule(ClusterView((host,), running), new, PolicyConfig()).of_kind(
        DecisionKind.PIN
    )


def test_marginal_power_prefers_cpu_work_where_accelerators_already_draw_power() -> None:
    gpu_power = PowerModel(idle_w=300, peak_w=1500)
    busy_gpu = node(
        "gpu", cpu=64, mem=512, cls=ServerClass.AI_ACCELERATOR, accel=2, power=gpu_power
    )
    cpu_box = node("cpu", cpu=64, mem=512, power=PowerModel(idle_w=100, peak_w=300))
    running = (
        Placement(Task("train", "ai", 10, Resources(8, 8, 2)), "gpu", 0.0),  # both GPUs busy
        Placement(task("web", cpu=8), "cpu", 0.0),
    )
    only_power = PolicyConfig(
        mode=PolicyMode.ENERGY,
        weights={
            "marginal_power": 1.0,
            "most_allocated": 0,
            "energy_efficiency": 0,
            "class_fit": 0,
        },
    )
    result = schedule(ClusterView((busy_gpu, cpu_box), running), [task("x", cpu=4)], only_power)
    (place,) = result.of_kind(DecisionKind.PLACE)
    # On the GPU node utilization is already 100% (accelerators), so 4 more cores add 0 W.
    assert place.node_id == "gpu"
    assert place.scores["marginal_power"] == 1.0


def test_accelerator_reserve_keeps_room_for_free_accelerators() -> None:
    gpu = node("gpu", cpu=32, mem=256, cls=ServerClass.AI_ACCELERATOR, accel=2)
    policy = PolicyConfig(accel_reserve_cpu=8, accel_reserve_mem_gib=64)
    # 32 cores - 2 free accelerators x 8 = 16 cores usable by CPU-only work.
    fits = schedule(ClusterView((gpu,)), [task("a", cpu=16)], policy)
    assert fits.of_kind(DecisionKind.PLACE)
    blocked = schedule(ClusterView((gpu,)), [task("b", cpu=17)], policy)
    assert not blocked.decisions
    assert "capacity kept for accelerators" in blocked.waiting["b"]
    # Accelerator work itself may use the reserve.
    train = Task("t", "ai", 10, Resources(24, 64, 2))
    assert schedule(ClusterView((gpu,)), [train], policy).of_kind(DecisionKind.PLACE)
    # Preemption honours the reserve too: evicting the 1 preemptible core is not enough room
    # (1 kept + 16 + 16 reserved > 32), though without a reserve the task simply fits.
    running = (
        Placement(task("low", cpu=1, prio=1), "gpu", 0.0),
        Placement(task("keep", cpu=1, prio=1, preemptible=False), "gpu", 0.0),
    )
    urgent = task("urgent", cpu=16, prio=90)
    assert not schedule(ClusterView((gpu,), running), [urgent], policy).decisions
    no_reserve = schedule(ClusterView((gpu,), running), [urgent], PolicyConfig())
    assert no_reserve.of_kind(DecisionKind.PLACE)


def test_affinity_demand_is_capped_at_the_nodes_cores() -> None:
    from edgesched.core.scheduler import affinity_demand

    task = Task("t", "default", 50, Resources(cpu=3, mem_gib=1), 0.0, threads=100_000)
    capped = affinity_demand(task, 8)
    assert len(capped.threads) == 8 and all(0 < load <= 1 for load in capped.threads)
    assert len(affinity_demand(task).threads) == 100_000  # uncapped without a node
    small = Task("s", "default", 50, Resources(cpu=0.5, mem_gib=1), 0.0)
    assert len(affinity_demand(small, 8).threads) == 1


# --- scoring a sample of a large fleet (policy.score_nodes) ---------------------------------


def _fleet(n: int, seed: int) -> tuple[Node, ...]:
    rnd = random.Random(seed)
    return tuple(
        node(
            f"n{i:05d}",
            cpu=rnd.choice([4, 8, 16, 32]),
            arch=rnd.choice([Arch.X86_64, Arch.ARM64]),
            cls=rnd.choice([ServerClass.GENERAL, ServerClass.AI_ACCELERATOR]),
            accel=rnd.choice([0, 0, 2]),
        )
        for i in range(n)
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(3, 80),
    st.integers(1, 12),
    st.integers(1, 40),
    st.sampled_from(list(Arch)),
    st.integers(0, 2),
)
def test_property_a_sample_places_a_task_iff_some_node_fits_and_picks_its_best(
    seed: int, n: int, want: int, cpu: int, arch: Arch, accel: int
) -> None:
    """One task over a fleet larger than twice ``score_nodes``: placed by the sample exactly
    when the whole fleet has a feasible node; on a feasible node; the best-scored of a run of
    consecutive rows that holds at least ``score_nodes`` feasible nodes (or is the fleet)."""
    from edgesched.core.nodetable import NodeTable, resource_vector
    from edgesched.core.plugins import FILTER_CHAIN
    from edgesched.core.scheduler import _start, _weighted_score

    nodes = _fleet(n, seed)
    t = Task(f"t{seed}", "w", 10, Resources(cpu, 4, accel), archs=frozenset({arch}))
    full = PolicyConfig(score_nodes=0, preemption=False)
    sampled = PolicyConfig(score_nodes=want, preemption=False)
    by_full = schedule(ClusterView(nodes), [t], full).of_kind(DecisionKind.PLACE)
    by_sample = schedule(ClusterView(nodes), [t], sampled).of_kind(DecisionKind.PLACE)
    assert bool(by_full) == bool(by_sample)
    table = NodeTable.build(nodes, ())
    demand = resource_vector(t.demand)
    feasible = FILTER_CHAIN.feasible(table, t, demand)
    if not by_sample:
        assert not feasible.any()
        return
    (decision,) = by_sample
    row = table.index[decision.node_id]
    assert feasible[row]
    if n <= 2 * want:  # no sample: the very same decision as over every node
        assert by_sample == by_full
        return
    # the window the sample scored: consecutive rows around the chosen one holding enough
    # feasible nodes, or the whole fleet; the chosen row scores best among its feasible ones
    cycle = _start(ClusterView(nodes), sampled)
    from edgesched.core.scheduler import _sample

    window, lo, mask = _sample(cycle, t, demand)
    assert lo <= row < lo + len(window)
    assert (mask == feasible[lo : lo + len(window)]).all()
    assert int(mask.sum()) >= want or len(window) == n
    total, _ = _weighted_score(sampled, window, t, demand)
    assert total[row - lo] == max(total[mask])
    assert "a sample of" in decision.reason or len(window) == n


def test_a_sample_spreads_tasks_over_a_large_fleet_and_costs_the_sample() -> None:
    """10,000 equal nodes, 200 tasks in one cycle: each task is scored over ~score_nodes
    rows starting where its id hashes, so the placements land all over the fleet (not in its
    first rows), every one on a distinct node here since the spread scores favour empty ones;
    and the same inputs give the same decisions."""
    nodes = tuple(node(f"n{i:05d}", cpu=8) for i in range(10_000))
    tasks = [task(f"job-{i}", cpu=1) for i in range(200)]
    policy = PolicyConfig(score_nodes=100)
    result = schedule(ClusterView(nodes), tasks, policy)
    placed = [d for d in result.of_kind(DecisionKind.PLACE)]
    assert len(placed) == 200
    rows = sorted(int(d.node_id[1:]) for d in placed)
    assert len(set(rows)) == 200
    assert rows[0] < 1_000 and rows[-1] > 9_000  # spread over the fleet
    deciles = {r // 1_000 for r in rows}
    assert len(deciles) == 10
    assert all("best of 100 feasible nodes (a sample of 100 of 10000 nodes)" in d.reason
               for d in placed)  # fmt: skip
    assert schedule(ClusterView(nodes), tasks, policy) == result


def test_a_sample_grows_until_it_holds_enough_feasible_nodes() -> None:
    """Only every 50th node has an accelerator: a task asking for one scans past the first
    window until its sample holds score_nodes of them; a task nothing can hold is waiting,
    explained over the whole fleet."""
    nodes = tuple(
        node(f"n{i:05d}", cls=ServerClass.AI_ACCELERATOR if i % 50 == 0 else ServerClass.GENERAL,
             accel=2 if i % 50 == 0 else 0)
        for i in range(5_000)
    )  # fmt: skip
    gpu = Task("gpu-1", "w", 10, Resources(2, 4, 1))
    huge = Task("huge", "w", 10, Resources(64, 4))
    result = schedule(ClusterView(nodes), [gpu, huge], PolicyConfig(score_nodes=20))
    (place,) = result.of_kind(DecisionKind.PLACE)
    assert place.task_id == "gpu-1" and int(place.node_id[1:]) % 50 == 0
    feasible = int(place.reason.split("best of ")[1].split(" ")[0])
    assert feasible >= 20
    assert result.waiting["huge"].startswith("0/5000 nodes available")


def test_score_nodes_is_checked() -> None:
    import pytest

    with pytest.raises(ValueError, match="score_nodes"):
        PolicyConfig(score_nodes=-1)
