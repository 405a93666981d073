"""Central's pure decisions: the fleet view, placement, failover choice, and the reconcile of
a task placed twice (property-tested: one copy survives, the same on every replica)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import REG
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.central.placement import (
    Settlement,
    assignment_entry,
    claims_of,
    failovers,
    fleet_view,
    node_of,
    place,
    prunable,
    reconcile,
)
from edgesched.core.policy import PolicyConfig
from edgesched.core.task import TaskSpec, TaskState
from edgesched.sync.reconcile import ReconcilePolicy
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentRef,
    AssignmentState,
    NodeView,
    Refusals,
    Registration,
    StopOrder,
    TaskReport,
)


def kept(settled: Settlement | None) -> str:
    """The node whose copy a settlement keeps (a task placed twice always has one)."""
    assert settled is not None and settled.winner is not None
    return settled.winner.node_id


def spec(task_id: str, cpu: float = 1.0, restart: str = "always", **kw: Any) -> TaskSpec:
    return TaskSpec.from_json(
        {"id": task_id, "command": ["sleep", "1"], "cpu": cpu, "mem_gib": 0.5,
         "restart": restart, **kw}
    )  # fmt: skip


def doc(tasks: dict[str, TaskReport] | None = None, **reg: Any) -> NodeView:
    return NodeView(registration=Registration.from_entry({**REG, **reg}), tasks=tasks or {})


def copy(
    epoch: int, replacement: bool, state: str = "running", at: float = 0.0, cpu: float = 1.0
) -> TaskReport:
    return TaskReport(
        state=TaskState(state),
        cpu=cpu,
        mem_gib=0.5,
        accepted_at=at,
        updated_at=at,
        assignment=AssignmentRef(central="central", epoch=epoch, replacement=replacement),
    )


def assigned(
    node: str,
    epoch: int = 1,
    state: str = "active",
    at: float = 0.0,
    task: TaskSpec | None = None,
) -> AssignmentEntry:
    """Central's assignment of ``task`` (a service ``svc`` by default) to ``node``."""
    return AssignmentEntry(
        spec=task or spec("svc"),
        node=node,
        epoch=epoch,
        central="central",
        at=at,
        state=AssignmentState(state),
    )


def test_registration_to_node_and_bad_ones_named() -> None:
    node = node_of("gw1", NodeView.from_content({"node": {"registration": REG}}))
    assert node.capacity.cpu == 8 and node.power.peak_w == 200 and node.site == "s1"
    assert node == Registration.from_entry(REG).to_node("gw1")
    power = {"idle_w": 60.0, "peak_w": 10.0, "parked_w": 8.0, "wake_latency_s": 45.0}
    bad_power = {**REG, "power": power}  # peak below idle: decodes, the core refuses it
    for bad, refused in (
        (None, 0),  # no registration yet
        ({**REG, "arch": "sparc"}, 1),  # refused by the schema: reads as no registration
        ({k: v for k, v in REG.items() if k != "cpu"}, 1),
        (bad_power, 0),
    ):
        refusals = Refusals("test")
        view = NodeView.from_content({"node": {"registration": bad}}, refusals)
        assert refusals.total() == refused, bad
        try:
            node_of("gw1", view)
        except ValueError as exc:
            assert "gw1" in str(exc)
        else:
            raise AssertionError(f"accepted {bad!r}")


def test_only_online_nodes_are_targets_and_their_tasks_count() -> None:
    docs = {
        "a": doc({"t": copy(1, False, cpu=7.5)}),
        "b": doc(),
        "c": doc(arch="arm64"),
        "d": NodeView(registration=None, tasks={}),  # no registration yet
    }
    view = fleet_view(docs, {"a": "online", "b": "online", "c": "offline", "d": "online"}, 10.0)
    assert [n.id for n in view.nodes] == ["a", "b"]
    assert "offline" in view.unusable["c"] and "registration" in view.unusable["d"]
    choice = place(spec("x", cpu=2.0), view, PolicyConfig())
    assert choice.node_id == "b"  # a has only 0.5 cores left
    assert place(spec("y"), view, PolicyConfig(), pin="c").node_id is None
    assert place(spec("y"), view, PolicyConfig(), exclude=["a", "b"]).node_id is None


def test_failover_only_for_services_offline_past_the_grace() -> None:
    assignments = {
        "svc": assignment_entry(spec("svc"), "a", central="central", epoch=1,
                                replacement=False, score=1, at=0, reason=""),
        "batch": assignment_entry(spec("batch", restart="never"), "a", central="central",
                                  epoch=1, replacement=False, score=1, at=0, reason=""),
        "elsewhere": assignment_entry(spec("elsewhere"), "b", central="central", epoch=1,
                                      replacement=False, score=1, at=0, reason=""),
    }  # fmt: skip
    assert assignments["svc"] == AssignmentEntry(
        spec=spec("svc"), node="a", epoch=1, central="central", at=0, score=1
    )
    assert failovers(assignments, {"a": 100.0}, now=105.0, grace_s=10.0) == []
    assert failovers(assignments, {"a": 100.0}, now=111.0, grace_s=10.0) == ["svc"]


def test_reconcile_keeps_the_original_and_ignores_stale_replicas() -> None:
    assignments = {"svc": assigned("b", epoch=2)}
    docs = {"a": doc({"svc": copy(1, False)}), "b": doc({"svc": copy(2, True)})}
    # a's replica is stale (not fresh): nothing to settle yet
    assert reconcile(assignments, docs, {}, ReconcilePolicy.KEEP_ORIGINAL, fresh={"b"}) == []
    (settled,) = reconcile(assignments, docs, {}, ReconcilePolicy.KEEP_ORIGINAL, {"a", "b"})
    assert kept(settled) == "a" and [c.node_id for c in settled.losers] == ["b"]
    (other,) = reconcile(assignments, docs, {}, ReconcilePolicy.KEEP_REPLACEMENT, {"a", "b"})
    assert kept(other) == "b"
    # once the stop order is out, there is nothing left to settle
    stops = {"svc@b": StopOrder(epoch=2, winner="a", at=0.0)}
    assert reconcile(assignments, docs, stops, ReconcilePolicy.KEEP_ORIGINAL, {"a", "b"}) == []
    # a local task sharing the id is not central's to settle
    docs["a"] = doc({"svc": replace(copy(1, False), assignment=None)})
    assert [c.node_id for c in claims_of("svc", docs)] == ["b"]


def test_reconcile_never_leaves_a_service_running_nowhere() -> None:
    """Issue 14: a copy preempted on its cut-off node never wins over a running one, whatever
    the policy; a copy already ordered stopped competes no more."""
    fresh = {"a", "b"}
    rule = ReconcilePolicy.KEEP_ORIGINAL
    # the original (a, epoch 1) preempted by local work, the replacement (b, 2) running
    docs = {"a": doc({"svc": copy(1, False, "preempted")}), "b": doc({"svc": copy(2, True)})}
    (settled,) = reconcile({"svc": assigned("b", epoch=2)}, docs, {}, rule, fresh)
    assert kept(settled) == "b" and [c.node_id for c in settled.losers] == ["a"]
    # failed over to b (epoch 2), b's copy still queued there: a's, running, keeps it
    docs = {"a": doc({"svc": copy(1, False)}), "b": doc({"svc": copy(2, True, "accepted")})}
    for policy in ReconcilePolicy:
        (settled,) = reconcile({"svc": assigned("b", epoch=2)}, docs, {}, policy, fresh)
        assert kept(settled) == "a", policy
    # migrated to b, b runs it, a's copy ordered stopped by the migration: no competitor
    docs["b"] = doc({"svc": copy(2, False)})
    stops = {"svc@a": StopOrder(epoch=1, winner="b", at=0.0)}
    assert reconcile({"svc": assigned("b", epoch=2)}, docs, stops, rule, fresh) == []
    best = ReconcilePolicy.LONGEST_RUNNING  # (which would keep a's, the older one)
    assert reconcile({"svc": assigned("b", epoch=2)}, docs, stops, best, fresh) == []


copies = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.tuples(st.integers(1, 5), st.booleans(), st.sampled_from(["running", "placed", "exited"]),
              st.floats(0, 1000)),
    min_size=1,
)  # fmt: skip


@settings(max_examples=200)
@given(copies, st.sampled_from(list(ReconcilePolicy)), st.permutations(["a", "b", "c", "d"]))
def test_reconcile_leaves_exactly_one_active_copy_on_every_replica(
    spread: dict[str, tuple[int, bool, str, float]],
    policy: ReconcilePolicy,
    order: list[str],
) -> None:
    docs = {n: doc({"t": copy(e, r, s, at)}) for n, (e, r, s, at) in spread.items()}
    assignments = {"t": assigned("a", task=spec("t"))}
    fresh = set(spread)
    first = reconcile(assignments, docs, {}, policy, fresh)
    shuffled = {n: docs[n] for n in order if n in docs}  # another replica, another order
    assert first == reconcile(assignments, shuffled, {}, policy, fresh)
    active = [n for n, (_, _, s, _) in spread.items() if s != "exited"]
    if len(active) < 2:
        if active and active[0] != "a" and spread[active[0]][0] > 1:
            # one copy, off the assignment's node at a later epoch: adopted, nothing stops
            (adopted,) = first
            assert kept(adopted) == active[0] and adopted.losers == ()
        else:
            assert first == []
        return
    (settled,) = first
    stopped = {c.node_id for c in settled.losers}
    assert kept(settled) in active and kept(settled) not in stopped
    assert set(active) - stopped == {kept(settled)}


def test_central_adopts_a_sites_failover_and_beats_it_at_equal_epochs() -> None:
    """Issue 16: a cut-off site's coordinator restarted a replica on b (epoch 2, decided by
    ``site:b``) while central still had it on a (epoch 1): central adopts b's copy; had
    central failed it over too (to c, epoch 2), central's copy wins on every peer."""
    rule = ReconcilePolicy.KEEP_ORIGINAL
    by_site = replace(copy(2, True), assignment=AssignmentRef("site:b", 2, True))
    docs = {"a": doc({}), "b": doc({"svc": by_site})}
    (adopted,) = reconcile({"svc": assigned("a")}, docs, {}, rule, {"a", "b"})
    assert kept(adopted) == "b" and adopted.losers == ()
    # a queued copy is not adopted (it may never run); nor one at central's own epoch
    queued = replace(by_site, state=TaskState.ACCEPTED)
    assert reconcile({"svc": assigned("a")}, {"b": doc({"svc": queued})}, {}, rule, {"b"}) == []
    assert reconcile({"svc": assigned("a", epoch=2)}, docs, {}, rule, {"a", "b"}) == []
    # central failed it over to c at the same epoch: both replacements, central's ranks first
    docs["c"] = doc({"svc": copy(2, True)})
    (raced,) = reconcile({"svc": assigned("c", epoch=2)}, docs, {}, rule, {"a", "b", "c"})
    assert kept(raced) == "c" and [c.node_id for c in raced.losers] == ["b"]


def test_a_task_may_choose_its_own_reconcile_rule() -> None:
    docs = {"a": doc({"svc": copy(1, False)}), "b": doc({"svc": copy(2, True)})}
    own = spec("svc", reconcile="keep-replacement")
    assignments = {"svc": assigned("b", epoch=2, task=own)}
    (settled,) = reconcile(assignments, docs, {}, ReconcilePolicy.KEEP_ORIGINAL, {"a", "b"})
    assert kept(settled) == "b" and settled.policy is ReconcilePolicy.KEEP_REPLACEMENT


def _entry(state: str, node: str = "a", at: float = 0.0) -> AssignmentEntry:
    return assigned(node, state=state, at=at)


def _report(state: str, updated_at: float) -> TaskReport:
    return TaskReport(state=TaskState(state), updated_at=updated_at)


def test_finished_assignments_are_forgotten_after_the_retention_only() -> None:
    assignments = {
        "done-old": _entry("active"),
        "done-new": _entry("active"),
        "running": _entry("active"),
        "silent": _entry("active"),  # its node never said anything: maybe cut off, running
        "cancelled-old": _entry("cancelled"),
        "failed-over": _entry("active", node="b"),  # b finished it; a still runs its copy
        "young": _entry("active", at=950.0),
    }
    docs = {
        "a": NodeView(
            registration=None,
            tasks={
                "done-old": _report("exited", 10.0),
                "done-new": _report("exited", 950.0),
                "running": _report("running", 10.0),
                "failed-over": _report("running", 10.0),
                "young": _report("exited", 10.0),
            },
        ),
        "b": NodeView(registration=None, tasks={"failed-over": _report("failed", 10.0)}),
    }
    assert prunable(assignments, docs, 1000.0, 500.0) == ["cancelled-old", "done-old"]


def test_a_pending_assignment_is_never_forgotten() -> None:
    assignments = {"pending": _entry("pending")}  # accepted long ago, still waiting for a node
    docs = {"a": NodeView(registration=None, tasks={})}
    assert prunable(assignments, docs, 1000.0, 500.0) == []


TASK_IDS = st.sampled_from(["t1", "t2", "t3"])


def fleets(
    states: list[str],
) -> st.SearchStrategy[tuple[dict[str, AssignmentEntry], dict[str, NodeView]]]:
    """Assignments in ``states`` and the node documents' copies of them."""
    assignments = st.dictionaries(
        TASK_IDS,
        st.builds(_entry, st.sampled_from(states), st.sampled_from(["a", "b"]), st.floats(0, 2000)),
    )
    docs = st.dictionaries(
        st.sampled_from(["a", "b"]),
        st.builds(
            NodeView,
            registration=st.none(),
            tasks=st.dictionaries(
                TASK_IDS, st.builds(_report, st.sampled_from(list(TaskState)), st.floats(0, 2000))
            ),
        ),
    )
    return st.tuples(assignments, docs)


@pytest.mark.parametrize(
    "states",
    [
        pytest.param(["active", "cancelled"], id="active-or-cancelled"),
        pytest.param(["active", "cancelled", "pending"], id="with-pending"),
    ],
)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_an_assignment_with_an_active_copy_is_never_forgotten(
    states: list[str], data: st.DataObject
) -> None:
    assignments, docs = data.draw(fleets(states))
    active_states = ("accepted", "placed", "running", "preempted")
    for task_id in prunable(assignments, docs, 1500.0, 300.0):
        entry = assignments[task_id]
        assert entry.state in ("active", "cancelled") and entry.at <= 1200.0
        copies = [d.tasks[task_id] for d in docs.values() if task_id in d.tasks]
        assert not any(c.state in active_states for c in copies)
        if entry.state == "active":
            mine = docs[entry.node].tasks[task_id]
            assert mine.state in ("exited", "failed", "cancelled")
            assert mine.updated_at <= 1200.0
