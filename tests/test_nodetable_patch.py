"""NodeTable's one-row patches (``with_node``, ``without_node``) against a fresh build.

Each patched table must hold, field by field, what :meth:`NodeTable.build` gives for the
resulting nodes and placements, and leave the table it was made from as it was (forks may
share its columns).
"""

from __future__ import annotations

import copy
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.model import (
    Arch,
    Node,
    NodeState,
    Placement,
    PowerModel,
    Resources,
    ServerClass,
    Task,
)
from edgesched.core.nodetable import NodeTable


def assert_same_table(got: NodeTable, want: NodeTable) -> None:
    """``got`` holds what ``want`` does: every field, numpy columns exactly (dtype, shape,
    values, Fortran order of the matrices), ``usage`` within 1e-9 (workloads at ~0 aside)."""
    for f in fields(NodeTable):
        g, w = getattr(got, f.name), getattr(want, f.name)
        if isinstance(w, np.ndarray):
            assert isinstance(g, np.ndarray), f.name
            assert (g.dtype, g.shape) == (w.dtype, w.shape), f.name
            np.testing.assert_array_equal(g, w, err_msg=f.name, strict=True)
        elif f.name == "usage":
            g = {k: v for k, v in g.items() if abs(v) > 1e-9}
            w = {k: v for k, v in w.items() if abs(v) > 1e-9}
            assert g.keys() == w.keys()
            for k in w:
                assert g[k] == pytest.approx(w[k], abs=1e-9), k
        else:
            assert g == w, f.name
    assert got.capacity.flags.f_contiguous and got.used.flags.f_contiguous


def node(node_id: str, cpu: float = 8.0, **changes: Any) -> Node:
    return replace(
        Node(
            id=node_id,
            arch=Arch.X86_64,
            server_class=ServerClass.GENERAL,
            capacity=Resources(cpu=cpu, mem_gib=2 * cpu),
            power=PowerModel(idle_w=50.0 + cpu, peak_w=100.0 + 10 * cpu),
        ),
        **changes,
    )


def placed(task_id: str, node_id: str, cpu: float, workload: str = "svc") -> Placement:
    task = Task(task_id, workload, 1, Resources(cpu=cpu, mem_gib=cpu))
    return Placement(task, node_id, 0.0)


def used(placements: list[Placement]) -> np.ndarray:
    """A row's ``used`` as build sums it (exact for the binary fractions used here)."""
    total = np.zeros(4)
    for p in placements:
        d = p.task.demand
        total += (d.cpu, d.mem_gib, float(d.accel), d.iops_k)
    return total


def snapshot(table: NodeTable) -> NodeTable:
    """A deep copy, to check a patch left ``table`` as it was."""
    return copy.deepcopy(table)


NODES = [node("b"), node("d", cpu=4.0, arch=Arch.ARM64), node("f", cpu=16.0)]
ON = {
    "b": [placed("t1", "b", 1.0), placed("t2", "b", 0.5, "batch")],
    "d": [placed("t3", "d", 2.0)],
    "f": [],
}


def base() -> NodeTable:
    return NodeTable.build(NODES, [p for n in NODES for p in ON[n.id]], (1.0, 2.0))


@pytest.mark.parametrize("new_id", ["a", "c", "e", "g"])  # start, middle (twice), end
def test_with_node_inserts_a_row_in_id_order(new_id: str) -> None:
    table = base()
    before = snapshot(table)
    new = node(new_id, cpu=2.0, server_class=ServerClass.STORAGE_DENSE)
    here = [placed("t9", new_id, 1.0, "batch"), placed("t8", new_id, 0.5, "ml")]
    got = table.with_node(new, used(here), here)
    want = NodeTable.build(
        [*NODES, new], [p for n in NODES for p in ON[n.id]] + here, table.reserve_per_accel
    )
    assert_same_table(got, want)
    assert_same_table(table, before)
    assert got.on_node[got.index[new_id]] is here


def test_with_node_replaces_the_row_of_its_id() -> None:
    table = base()
    before = snapshot(table)
    changed = node("d", cpu=6.0, state=NodeState.PARKED, perf=2.0)
    here = [placed("t4", "d", 0.5, "batch")]  # t3 gone, t4 there instead
    got = table.with_node(changed, used(here), here)
    nodes = [NODES[0], changed, NODES[2]]
    want = NodeTable.build(nodes, ON["b"] + here, table.reserve_per_accel)
    assert_same_table(got, want)
    assert "svc" in got.usage and got.usage["batch"] == 1.0  # svc still runs on b
    assert_same_table(table, before)
    assert got.used is not table.used and got.state is not table.state  # cycles write them


def test_a_replaced_row_shares_the_fixed_columns_it_leaves_as_they_were() -> None:
    table = base()
    got = table.with_node(replace(NODES[1], idle_since=5.0), used(ON["d"]), ON["d"])
    assert got.nodes[1].idle_since == 5.0
    assert got.capacity is table.capacity and got.peak_w is table.peak_w
    assert got.used is not table.used and got.state is not table.state
    assert_same_table(
        got, NodeTable.build(got.nodes, [p for n in NODES for p in ON[n.id]], (1.0, 2.0))
    )


def test_without_node_removes_a_row_and_what_runs_there() -> None:
    table = base()
    before = snapshot(table)
    got = table.without_node("b")
    assert_same_table(got, NodeTable.build(NODES[1:], ON["d"], table.reserve_per_accel))
    assert "batch" not in got.usage  # only b ran batch work
    assert_same_table(table, before)
    with pytest.raises(KeyError):
        table.without_node("x")


def test_removing_every_row_leaves_the_empty_table() -> None:
    table = base()
    for node_id in ("d", "f", "b"):
        table = table.without_node(node_id)
    assert_same_table(table, NodeTable.build([], [], (1.0, 2.0)))
    assert table.usage == {}
    # ... and the empty table takes a row again.
    here = [placed("t1", "z", 1.0)]
    got = table.with_node(node("z"), used(here), here)
    assert_same_table(got, NodeTable.build([node("z")], here, (1.0, 2.0)))


IDS = "abcdefgh"
op_st = st.one_of(
    st.tuples(
        st.just("with"),
        st.sampled_from(IDS),
        st.sampled_from([1.0, 2.0, 4.0]),
        st.sampled_from(list(NodeState)),
        st.lists(st.tuples(st.sampled_from([0.5, 1.0, 0.25]), st.sampled_from("xyz")), max_size=3),
    ),
    st.tuples(st.just("without"), st.sampled_from(IDS)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(op_st, max_size=30))
def test_any_sequence_of_patches_gives_the_built_table(ops: list[tuple[Any, ...]]) -> None:
    nodes: dict[str, Node] = {}
    on: dict[str, list[Placement]] = {}
    table = NodeTable.build([], [])
    for op in ops:
        before = snapshot(table)
        if op[0] == "with":
            _, node_id, cpu, state, tasks = op
            nodes[node_id] = node(node_id, cpu=cpu, state=state)
            on[node_id] = [placed(f"{node_id}{i}", node_id, c, w) for i, (c, w) in enumerate(tasks)]
            patched = table.with_node(nodes[node_id], used(on[node_id]), on[node_id])
        elif op[1] in nodes:
            del nodes[op[1]], on[op[1]]
            patched = table.without_node(op[1])
        else:
            continue
        assert_same_table(table, before)
        table = patched
        assert_same_table(
            table, NodeTable.build(list(nodes.values()), [p for r in on.values() for p in r])
        )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(op_st, max_size=12), max_size=6))
def test_many_rows_at_once_give_the_built_table(batches: list[list[tuple[Any, ...]]]) -> None:
    """``with_rows`` over batches of changes (the last change of an id in a batch wins, as
    the fleet index hands them: one row per moved node) holds what a fresh build does, and
    leaves the table it was made from as it was."""
    nodes: dict[str, Node] = {}
    on: dict[str, list[Placement]] = {}
    table = NodeTable.build([], [], (1.0, 2.0))
    for batch in batches:
        changes: dict[str, tuple[Node, Any, list[Placement]] | None] = {}
        for op in batch:
            if op[0] == "with":
                _, node_id, cpu, state, tasks = op
                nodes[node_id] = node(node_id, cpu=cpu, state=state)
                on[node_id] = [
                    placed(f"{node_id}{i}", node_id, c, w) for i, (c, w) in enumerate(tasks)
                ]
                changes[node_id] = (nodes[node_id], used(on[node_id]), on[node_id])
            else:
                nodes.pop(op[1], None)
                on.pop(op[1], None)
                changes[op[1]] = None  # (an id with no row: nothing to remove)
        before = snapshot(table)
        patched = table.with_rows(changes)
        assert_same_table(table, before)
        table = patched
        assert_same_table(
            table,
            NodeTable.build(list(nodes.values()), [p for r in on.values() for p in r], (1.0, 2.0)),
        )


def test_a_row_must_hold_the_node_of_its_id() -> None:
    table = NodeTable.build([node("a")], [])
    with pytest.raises(ValueError, match="given node 'b'"):
        table.with_rows({"a": (node("b"), np.zeros(4), [])})
