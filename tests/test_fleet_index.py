"""Central's fleet index against the slow path it replaces, on random event sequences.

Each example drives one :class:`~edgesched.central.fleetindex.FleetIndex` and a plain copy of
the same facts (node documents, liveness, freshness, assignments, stops, power orders)
through a random sequence of changes, and after each check compares what the index says
with what the from-scratch functions of :mod:`edgesched.central.placement` compute over the
whole state (``fleet_view`` + ``with_power``, ``failovers``, ``reconcile``, ``prunable``, the
stop orders done). Like the engine, the test then acts on what it was told (stop orders for
the losers, the winner's assignment, forgotten assignments, dropped stop orders), so the
index's "what changed since" and the oracle's "everything" must keep agreeing. A second
property holds the index's table, patched row by row as nodes come, go and change, to the
table :meth:`~edgesched.central.fleetindex.FleetIndex._build_table` builds from scratch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_nodetable_patch import assert_same_table

from edgesched.central import fleetindex
from edgesched.central.fleetindex import PATCH_UP_TO, FleetIndex
from edgesched.central.placement import (
    failovers,
    fleet_view,
    prunable,
    reconcile,
)
from edgesched.central.power import reported, with_power
from edgesched.core.model import Arch, Placement, ServerClass
from edgesched.core.nodetable import NodeTable
from edgesched.core.task import TaskSpec, TaskState
from edgesched.sync.reconcile import ReconcilePolicy
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentRef,
    AssignmentState,
    NodeView,
    PowerOrder,
    PowerReport,
    Registration,
    StopOrder,
    TaskReport,
)

NODES = ("a", "b", "c")
TASKS = ("t0", "t1", "t2")  # few of each: copies collide, nodes heal
GRACE = 30.0
RETENTION = 50.0
REGISTRATIONS = (
    None,
    Registration(arch=Arch.X86_64, server_class=ServerClass.GENERAL, cpu=8, mem_gib=16),
    Registration(arch=Arch.ARM64, server_class=ServerClass.GENERAL, cpu=4, mem_gib=8),
    Registration(arch=Arch.X86_64, server_class=ServerClass.AI_ACCELERATOR, cpu=16, accel=2),
)


def spec(task_id: str, restart: str, cpu: float) -> TaskSpec:
    return TaskSpec.from_json({"id": task_id, "command": ["true"], "restart": restart, "cpu": cpu})


@dataclass
class World:
    """The facts, held plainly: what the oracle functions read."""

    registration: dict[str, Registration | None] = field(default_factory=dict)
    power: dict[str, PowerReport | None] = field(default_factory=dict)
    tasks: dict[str, dict[str, TaskReport]] = field(default_factory=dict)
    status: dict[str, tuple[str, float]] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)
    assignments: dict[str, AssignmentEntry] = field(default_factory=dict)
    stops: dict[str, StopOrder] = field(default_factory=dict)
    orders: dict[str, PowerOrder] = field(default_factory=dict)
    now: float = 100.0

    def views(self) -> dict[str, NodeView]:
        return {
            n: NodeView(self.registration.get(n), dict(t), self.power.get(n))
            for n, t in self.tasks.items()
        }


# --- events -------------------------------------------------------------------------------

report_st = st.builds(
    lambda state, epoch, repl, dt, cpu, assigned: (state, epoch, repl, dt, cpu, assigned),
    st.sampled_from([TaskState.RUNNING, TaskState.RUNNING, *TaskState]),
    st.integers(1, 3),
    st.booleans(),
    st.floats(0, 80),
    st.sampled_from([0.5, 1.0, 2.0]),
    st.sampled_from([True, True, False]),
)


def weighted(*choices: tuple[int, st.SearchStrategy[tuple[Any, ...]]]) -> st.SearchStrategy[Any]:
    """One of ``choices``, drawn in proportion to its weight."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


def events_on(nodes: tuple[str, ...]) -> dict[str, st.SearchStrategy[tuple[Any, ...]]]:
    """The index's input events about ``nodes``, by kind (each test weighs them its way)."""
    node = st.sampled_from(nodes)
    task = st.sampled_from(TASKS)
    return {
        "report": st.tuples(st.just("report"), node, task, report_st),
        "unreport": st.tuples(st.just("unreport"), node, task),
        "register": st.tuples(st.just("register"), node, st.integers(0, 3)),
        "power": st.tuples(st.just("power"), node, st.sampled_from(["active", "parked", "none"])),
        "status": st.tuples(st.just("status"), node, st.sampled_from(["online", "offline"])),
        "fresh": st.tuples(st.just("fresh"), node, st.booleans()),
        "heal": st.tuples(st.just("heal"), node),
        "assign": st.tuples(
            st.just("assign"),
            task,
            node,
            st.sampled_from(list(AssignmentState)),
            st.sampled_from(["always", "never"]),
            st.integers(1, 3),
        ),
        "unassign": st.tuples(st.just("unassign"), task),
        "stop": st.tuples(st.just("stop"), task, node),
        "order": st.tuples(st.just("order"), node, st.sampled_from(["active", "parked"])),
        "tick": st.tuples(st.just("tick"), st.floats(0.5, 40)),
    }


_ON = events_on(NODES)
event_st = weighted(
    (8, _ON["report"]),
    (2, _ON["unreport"]),
    (2, _ON["register"]),
    (1, _ON["power"]),
    (2, _ON["status"]),
    (1, _ON["fresh"]),
    (3, _ON["heal"]),
    (4, _ON["assign"]),
    (1, _ON["unassign"]),
    (1, _ON["stop"]),
    (1, _ON["order"]),
    (2, _ON["tick"]),
    (3, st.tuples(st.just("check"))),
)


def apply(world: World, index: FleetIndex, event: tuple[Any, ...]) -> None:
    kind = event[0]
    now = world.now
    if kind == "report":
        _, node, task, (state, epoch, repl, dt, cpu, assigned) = event
        report = TaskReport(
            state=state,
            updated_at=now - dt,
            cpu=cpu,
            workload="batch" if cpu < 1 else "svc",
            assignment=AssignmentRef("central", epoch, repl, float(epoch)) if assigned else None,
        )
        world.tasks.setdefault(node, {})[task] = report
        touch_node(world, index, node, {task})
    elif kind == "unreport":
        _, node, task = event
        if task in world.tasks.get(node, {}):
            del world.tasks[node][task]
            touch_node(world, index, node, {task})
    elif kind == "register":
        _, node, which = event
        world.registration[node] = REGISTRATIONS[which]
        world.tasks.setdefault(node, {})
        touch_node(world, index, node, set())
    elif kind == "power":
        _, node, state = event
        world.power[node] = None if state == "none" else PowerReport(state, now - 5, now - 60)
        world.tasks.setdefault(node, {})
        touch_node(world, index, node, set())
    elif kind == "status":
        _, node, state = event
        world.status[node] = (state, now)
        index.set_status(node, state, now)
        if state == "offline":
            world.fresh.discard(node)
            index.set_fresh(node, False)
    elif kind == "fresh":
        _, node, fresh = event
        fresh = fresh and world.status.get(node, ("unknown", 0))[0] == "online"
        (world.fresh.add if fresh else world.fresh.discard)(node)
        index.set_fresh(node, fresh)
    elif kind == "heal":  # back online, resynced: its copies count again
        _, node = event
        world.status[node] = ("online", now)
        index.set_status(node, "online", now)
        world.fresh.add(node)
        index.set_fresh(node, True)
    elif kind == "assign":
        _, task, node, state, restart, epoch = event
        entry = AssignmentEntry(
            spec=spec(task, restart, 1.0),
            node="" if state is AssignmentState.PENDING else node,
            epoch=epoch,
            central="central",
            at=now,
            state=state,
        )
        world.assignments[task] = entry
        index.set_assignment(task, entry)
    elif kind == "unassign":
        _, task = event
        world.assignments.pop(task, None)
        index.set_assignment(task, None)
    elif kind == "stop":
        _, task, node = event
        order = StopOrder(epoch=1, winner="x", at=now, reason="test")
        world.stops[f"{task}@{node}"] = order
        index.set_stop(f"{task}@{node}", order)
    elif kind == "order":
        _, node, state = event
        world.orders[node] = PowerOrder(state=state, reason="test", at=now)
        index.set_order(node, world.orders[node])
    elif kind == "tick":
        world.now += event[1]
    elif kind == "check":
        check(world, index)


def touch_node(world: World, index: FleetIndex, node: str, changed: set[str]) -> None:
    index.update_node(node, world.views()[node], changed)


def table_facts(table: NodeTable) -> dict[str, Any]:
    return {
        "nodes": [(n.id, n.state, n.idle_since, n.capacity) for n in table.nodes],
        "on_node": [
            sorted((p.task.id, p.task.demand, p.task.workload) for p in row)
            for row in table.on_node
        ],
    }


def check(world: World, index: FleetIndex) -> None:
    now = world.now
    views = world.views()
    status = {n: world.status.get(n, ("unknown", 0.0))[0] for n in views}
    # The oracle's view: every replica, plus active assignments their node has not reported
    # (counted on that node, as the engine's _view does).
    view = fleet_view(views, status, now)
    view = with_power(view, {n: reported(v) for n, v in views.items()}, world.orders)
    placements = list(view.placements) + [
        Placement(e.task_spec.to_task(now), e.node, now)
        for t, e in world.assignments.items()
        if e.active and not (views.get(e.node) is not None and t in views[e.node].tasks)
    ]
    # every task id central knows (placed by it or reported by a node), kept sorted
    reporting = {t for v in views.values() for t in v.tasks}
    assert list(index.task_ids) == sorted(world.assignments.keys() | reporting)
    want = NodeTable.build(view.nodes, placements)
    got = index.table()
    assert table_facts(got) == table_facts(want)
    np.testing.assert_allclose(got.used, want.used, atol=1e-9)
    assert {k: v for k, v in got.usage.items() if abs(v) > 1e-9} == {
        k: v for k, v in want.usage.items() if abs(v) > 1e-9
    }
    assert set(index.unusable()) == set(view.unusable)
    # Each task's copies: the nodes' reports of it, in node id order.
    copies = {
        t: {n: v.tasks[t] for n, v in sorted(views.items()) if t in v.tasks}
        for t in {t for v in views.values() for t in v.tasks}
    }
    assert set(index.holders) == set(copies)
    for task_id, held in copies.items():
        assert list(index.copies_of(task_id).items()) == list(held.items())
    # Each node's reports counted by state, as kept incrementally.
    for member in index.members.values():
        assert +member.states == Counter(r.state.value for r in member.reports.values())
    # Failovers.
    offline = {n: s for n, (state, s) in world.status.items() if state == "offline"}
    assert index.failover_candidates(now) == failovers(world.assignments, offline, now, GRACE)
    # Reconcile, then act on it as the engine does.
    policy = ReconcilePolicy.KEEP_ORIGINAL
    settled = reconcile(world.assignments, views, world.stops, policy, world.fresh)
    got_settled = index.settlements(policy)
    assert got_settled == settled
    event(f"settled {min(len(settled), 2)}")
    for s in settled:
        entry = world.assignments[s.task_id]
        kept = "" if s.winner is None else s.winner.node_id  # (None: cancelled at central)
        if s.winner is not None and entry.node != kept:
            moved = replace(entry, node=kept, epoch=entry.epoch + 1, at=now)
            world.assignments[s.task_id] = moved
            index.set_assignment(s.task_id, moved)
        for loser in s.losers:
            key = f"{s.task_id}@{loser.node_id}"
            world.stops[key] = StopOrder(epoch=loser.epoch, winner=kept, at=now)
            index.set_stop(key, world.stops[key])
    # Stop orders done.
    done = sorted(
        key
        for key in world.stops
        if (doc := views.get(key.rpartition("@")[2])) is not None
        and ((r := doc.tasks.get(key.rpartition("@")[0])) is None or not r.active)
    )
    assert index.stops_done() == done
    for key in done:
        del world.stops[key]
        index.set_stop(key, None)
    # Forgetting finished assignments.
    forget = prunable(world.assignments, views, now, RETENTION)
    event(f"forgot {min(len(forget), 2)}")
    event(f"failovers {min(len(index._overdue), 1)}")
    assert index.forgettable(now) == forget
    for task_id in forget:
        del world.assignments[task_id]
        index.set_assignment(task_id, None)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(event_st, min_size=30, max_size=150))
def test_the_index_agrees_with_the_full_recomputation(events: list[tuple[Any, ...]]) -> None:
    world = World()
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    for step in [*events, ("check",), ("tick", 100.0), ("check",)]:
        apply(world, index, step)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(event_st, min_size=30, max_size=150))
def test_the_index_agrees_with_the_full_recomputation_rebuilding_its_forget_heap(
    events: list[tuple[Any, ...]],
) -> None:
    """The same, with the heap of forgetting times rebuilt as soon as superseded times
    outnumber the live ones (``PRUNE_SLACK`` 0): a rebuild loses no time and keeps none."""
    world = World()
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    with patch.object(fleetindex, "PRUNE_SLACK", 0):
        for step in [*events, ("check",), ("tick", 100.0), ("check",)]:
            apply(world, index, step)


def test_a_task_changed_again_and_again_leaves_no_trail_of_forgetting_times() -> None:
    """Each change of a finished assignment's copy moves its forgetting time, and the id is
    filed again under the new time's second: superseded ones are dropped once they
    outnumber the live ones."""
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    spec = TaskSpec(id="t0", command=("true",))
    entry = AssignmentEntry(spec=spec, node="n0", epoch=1, central="c", at=0.0)
    index.set_assignment("t0", entry)
    ref = AssignmentRef("c", 1)
    for i in range(5 * fleetindex.PRUNE_SLACK):
        report = TaskReport(state=TaskState.EXITED, updated_at=float(i), assignment=ref)
        index.update_node("n0", NodeView(None, {"t0": report}), ["t0"])
    assert len(index._prune_at) == 1
    assert index._prune_held <= 2 + fleetindex.PRUNE_SLACK
    assert index.forgettable(5 * fleetindex.PRUNE_SLACK + RETENTION) == ["t0"]


def test_a_forgetting_time_later_in_the_current_second_waits_for_it() -> None:
    """Times are filed by whole seconds: a call within a time's second but before it
    forgets nothing and loses nothing, a call at or after it forgets; a time moved within
    the same second is taken at its new value, once."""
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    ref = AssignmentRef("c", 1)
    for task_id, updated in (("a", 10.25), ("b", 10.75)):
        spec = TaskSpec(id=task_id, command=("true",))
        index.set_assignment(
            task_id, AssignmentEntry(spec=spec, node="n0", epoch=1, central="c", at=0.0)
        )
        report = TaskReport(state=TaskState.EXITED, updated_at=updated, assignment=ref)
        index.update_node("n0", NodeView(None, {task_id: report}), [task_id])
    assert index.forgettable(RETENTION + 10.0) == []
    assert index.forgettable(RETENTION + 10.5) == ["a"]
    moved = TaskReport(state=TaskState.EXITED, updated_at=10.9, assignment=ref)  # same second
    index.update_node("n0", NodeView(None, {"b": moved}), ["b"])
    assert index.forgettable(RETENTION + 10.8) == []
    assert index.forgettable(RETENTION + 10.95) == ["b"]
    assert index.forgettable(RETENTION + 100.0) == [] and index._prune_held == 0


def test_a_step_touches_only_what_changed() -> None:
    """After a settled state, one changed report puts one task up for reconcile and one
    node's row in the table: the index does not look at the rest."""
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    reg = REGISTRATIONS[1]
    assert reg is not None
    nodes = [f"n{i:03d}" for i in range(200)]
    for n in nodes:
        index.set_status(n, "online", 0.0)
        index.set_fresh(n, True)
        index.update_node(n, NodeView(reg, {}), None)
    for i in range(1000):
        task, node = f"t{i:04d}", nodes[i % len(nodes)]
        entry = AssignmentEntry(spec(task, "always", 0.5), node, 1, "central", 1.0)
        index.set_assignment(task, entry)
    table = index.table()
    assert index.settlements(ReconcilePolicy.KEEP_ORIGINAL) == []
    assert index.stops_done() == [] and index.forgettable(10.0) == []
    # Two nodes now claim t0001: only it is due, and the table is patched, not rebuilt.
    ref = AssignmentRef("central", 1)
    report = TaskReport(state=TaskState.RUNNING, updated_at=2.0, cpu=0.5, assignment=ref)
    index.update_node(nodes[1], NodeView(reg, {"t0001": report}), {"t0001"})
    index.update_node(nodes[7], NodeView(reg, {"t0001": report}), {"t0001"})
    assert index.table() is table
    assert len(index._reconcile_due) == 1
    settled = index.settlements(ReconcilePolicy.KEEP_ORIGINAL)
    assert [
        (s.task_id, s.winner and s.winner.node_id, [c.node_id for c in s.losers]) for s in settled
    ] == [("t0001", nodes[1], [nodes[7]])]
    # A node going offline patches the table: a new one without it, the old one as it was.
    index.set_status(nodes[3], "offline", 5.0)
    patched = index.table()
    assert nodes[3] not in patched.index and patched is not table and len(table) == 200
    assert_same_table(patched, index._build_table())


TABLE_NODES = ("a", "b", "c", "d", "e", "f")  # rows come and go at the start, middle, end
_ON_TABLE = events_on(TABLE_NODES)
table_event_st = weighted(
    (6, _ON_TABLE["report"]),
    (2, _ON_TABLE["unreport"]),
    (3, _ON_TABLE["register"]),
    (2, _ON_TABLE["power"]),
    (4, _ON_TABLE["status"]),
    (3, _ON_TABLE["assign"]),
    (1, _ON_TABLE["unassign"]),
    (2, _ON_TABLE["order"]),
    (1, _ON_TABLE["tick"]),
    (4, st.tuples(st.just("table"))),
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(st.integers(1, 3), min_size=len(TABLE_NODES), max_size=len(TABLE_NODES)),
    st.lists(table_event_st, min_size=20, max_size=120),
)
def test_the_patched_table_is_the_table_built_from_scratch(
    registrations: list[int], events: list[tuple[Any, ...]]
) -> None:
    world = World()
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    start: list[tuple[Any, ...]] = []  # a fleet of registered nodes, online
    for node, which in zip(TABLE_NODES, registrations, strict=True):
        start += [("register", node, which), ("status", node, "online")]
    build = index._build_table
    with patch.object(index, "_build_table", side_effect=build) as rebuilt:
        for step in [*start, ("table",), *events, ("table",)]:
            if step[0] != "table":
                apply(world, index, step)
                continue
            old = index._table
            got = index.table()
            assert_same_table(got, build())
            event(f"usable {len(got)}")
            if old is None:
                continue
            before, after = ({n.id: n for n in t.nodes} for t in (old, got))
            for kind, moved in [
                ("inserted", after.keys() - before.keys()),
                ("removed", before.keys() - after.keys()),
                ("replaced", {n for n in after.keys() & before.keys() if after[n] != before[n]}),
            ]:
                if moved:
                    event(f"rows {kind}")
    # Only the first table() built it (at most six rows move at once): the rest patched it.
    assert rebuilt.call_count == 1
    check(world, index)  # and what it holds is what the oracle sees


def test_many_node_changes_at_once_patch_the_table_in_one_pass() -> None:
    """Up to PATCH_UP_TO nodes changed since the last table() are patched in one by one; more
    go in one pass of ``NodeTable.with_rows`` (a site going dark, or a fleet coming up,
    costs one pass, not one patch per node, and never a rebuild)."""
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    nodes = [f"n{i:02d}" for i in range(3 * PATCH_UP_TO)]
    for i, n in enumerate(nodes):
        report = TaskReport(state=TaskState.RUNNING, updated_at=1.0, cpu=0.5 + i % 2)
        index.set_status(n, "online", 0.0)
        index.update_node(n, NodeView(REGISTRATIONS[1 + i % 3], {f"t{i}": report}), None)
    build = index._build_table
    index.table()
    with (
        patch.object(index, "_build_table", side_effect=build) as rebuilt,
        patch.object(
            NodeTable, "with_rows", autospec=True, side_effect=NodeTable.with_rows
        ) as passes,
    ):
        for n in nodes[1::3][:PATCH_UP_TO]:
            index.set_status(n, "offline", 5.0)
        assert len(index.table()) == len(nodes) - PATCH_UP_TO
        assert_same_table(index.table(), build())
        assert passes.call_count == 0
        usable = set(index.table().index)
        for n in nodes[: PATCH_UP_TO + 1]:  # some go, some come back
            index.set_status(n, "offline" if n in usable else "online", 6.0)
        assert_same_table(index.table(), build())
        assert passes.call_count == 1
        assert rebuilt.call_count == 0  # (this test's build() is the unpatched method)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.booleans(), st.floats(0.01, 64.0), st.floats(0, 512)),
        min_size=1,
        max_size=400,
    )
)
def test_a_nodes_sums_kept_as_it_changes_stay_those_of_its_tasks(
    changes: list[tuple[int, bool, float, float]],
) -> None:
    """A node's used resources are kept as its tasks change (one addition or subtraction a
    change), summed again exactly every ``EXACT_EVERY`` changes: after hundreds of changes
    of arbitrary sizes they are those of the tasks it runs, and exactly zero once it runs
    none (no rounding left behind to make an empty node read as partly used)."""
    index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
    reg = REGISTRATIONS[1]
    assert reg is not None
    index.set_status("n", "online", 0.0)
    index.update_node("n", NodeView(reg, {}), None)
    running: dict[str, TaskReport] = {}
    for i, (task, active, cpu, mem) in enumerate(changes):
        task_id = f"t{task}"
        state = TaskState.RUNNING if active else TaskState.EXITED
        running[task_id] = TaskReport(state=state, updated_at=float(i), cpu=cpu, mem_gib=mem)
        index.update_node("n", NodeView(reg, dict(running)), {task_id})
        if i % 37 == 0:
            index.table()  # (sums taken now and then, as steps do)
    table = index.table()
    row = table.index["n"]
    live = [r for r in running.values() if r.active]
    want = [sum(r.cpu for r in live), sum(r.mem_gib for r in live)]
    np.testing.assert_allclose(table.used[row, :2], want, rtol=1e-12, atol=1e-9)
    for task_id in running:  # every task exits: the node runs nothing
        running[task_id] = replace(running[task_id], state=TaskState.EXITED)
    index.update_node("n", NodeView(reg, dict(running)), set(running))
    table = index.table()
    assert table.used[table.index["n"]].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert table.usage == {}


def test_a_recheck_of_the_whole_fleet_is_worked_through_a_slice_a_step() -> None:
    """recheck_all (leadership, a shard gained) over more assignments than a step takes:
    settlements come a slice at a time (at most the limit each), the backlog shrinks to
    zero, and together they are what one unbounded look gives; forgetting times are
    scheduled a slice at a time too, and every finished one is forgotten in the end."""
    reg = REGISTRATIONS[1]
    assert reg is not None

    def fleet() -> FleetIndex:
        index = FleetIndex(grace_s=GRACE, retention_s=RETENTION)
        nodes = [f"n{i:03d}" for i in range(50)]
        for n in nodes:
            index.set_status(n, "online", 0.0)
            index.set_fresh(n, True)
        ref = AssignmentRef("central", 1)
        running = TaskReport(state=TaskState.RUNNING, updated_at=2.0, cpu=0.5, assignment=ref)
        done = TaskReport(state=TaskState.EXITED, updated_at=2.0, cpu=0.5, assignment=ref)
        reports: dict[str, dict[str, TaskReport]] = {n: {} for n in nodes}
        for i in range(600):
            task, node = f"t{i:04d}", nodes[i % len(nodes)]
            index.set_assignment(task, AssignmentEntry(spec(task, "never", 0.5), node, 1,
                                                       "central", 1.0))  # fmt: skip
            reports[node][task] = done if i % 3 == 0 else running
            if i % 10 == 0:  # also claimed by the next node: to settle
                reports[nodes[(i + 1) % len(nodes)]][task] = running
        for n in nodes:
            index.update_node(n, NodeView(reg, reports[n]), None)
        index.settlements(ReconcilePolicy.KEEP_ORIGINAL)
        index.forgettable(0.0)
        return index

    def view(settled: list[Any]) -> list[tuple[str, str, list[str]]]:
        return sorted(
            (s.task_id, s.winner.node_id if s.winner else "", [c.node_id for c in s.losers])
            for s in settled
        )

    whole = fleet()
    whole.recheck_all()
    whole.recheck_some(None)  # forgetting times scheduled at once
    assert whole.backlog == 600  # (every task due a look)
    at_once = view(whole.settlements(ReconcilePolicy.KEEP_ORIGINAL))
    assert at_once and whole.backlog == 0

    sliced = fleet()
    sliced.recheck_all()
    assert sliced.backlog == 1200  # 600 to settle, 600 to schedule
    got: list[Any] = []
    backlogs = []
    while sliced.backlog:
        batch = sliced.settlements(ReconcilePolicy.KEEP_ORIGINAL, limit=150)
        assert len(batch) <= 150
        got += batch
        sliced.recheck_some(150)
        backlogs.append(sliced.backlog)
    assert backlogs == sorted(backlogs, reverse=True) and len(backlogs) == 4
    assert view(got) == at_once
    late = RETENTION + 10.0
    forgotten = whole.forgettable(late)
    assert len(forgotten) == 180  # the exited tasks (a third) but the 20 still running elsewhere
    assert sliced.forgettable(late) == forgotten
