"""Sliced accelerators: the packing rule (core/slices.py), the spec field and the core's fit."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.config import ConfigError, parse_config
from edgesched.core.model import (
    Arch,
    Node,
    Placement,
    PowerModel,
    Resources,
    ServerClass,
    Task,
)
from edgesched.core.nodetable import NodeTable, resource_vector
from edgesched.core.plugins import FILTER_CHAIN
from edgesched.core.slices import (
    HELD_LABEL,
    Device,
    Grant,
    Request,
    device_env,
    held_label,
    parse_held_label,
    plan,
    release,
    used_slots,
)
from edgesched.core.task import SpecError, TaskSpec
from edgesched.sync.schema import Registration

devices_st = st.lists(st.integers(1, 7), min_size=1, max_size=5).map(
    lambda sizes: tuple(Device(i, s, "time" if s > 1 else "whole") for i, s in enumerate(sizes))
)
# an operation: ("whole", n) / ("slices", k) asks; ("release", i) frees the i-th held grant
op_st = st.one_of(
    st.tuples(st.just("whole"), st.integers(1, 3)),
    st.tuples(st.just("slices"), st.integers(1, 8)),
    st.tuples(st.just("release"), st.integers(0, 20)),
)


def _check(devices: tuple[Device, ...], grants: list[Grant]) -> None:
    by_index = {d.index: d for d in devices}
    seen: dict[int, list[int]] = {d.index: [] for d in devices}
    for g in grants:
        for index, slots in g.held:
            seen[index].extend(slots)
    for index, taken in seen.items():
        # never oversubscribed: no slot held twice, none beyond the device
        assert len(taken) == len(set(taken))
        assert all(0 <= s < by_index[index].slices for s in taken)
        # fractions granted on a device sum to at most 1
        assert sum(Fraction(1, by_index[index].slices) for _ in taken) <= 1


@settings(max_examples=300, deadline=None)
@given(devices=devices_st, ops=st.lists(op_st, max_size=40))
def test_random_requests_and_releases_never_oversubscribe(
    devices: tuple[Device, ...], ops: list[tuple[str, int]]
) -> None:
    grants: list[Grant] = []
    for n, (kind, value) in enumerate(ops):
        if kind == "release":
            if grants:
                gone = grants[value % len(grants)].task_id
                grants = list(release(grants, gone))
            continue
        request = Request(devices=value) if kind == "whole" else Request(slices=value)
        before = used_slots(devices, grants)
        grant = plan(devices, grants, f"t{n}", request)
        # deterministic: the same state asks the same
        assert plan(devices, list(grants), f"t{n}", request) == grant
        if grant is None:
            # refused only when it really does not fit
            if kind == "whole":
                assert sum(1 for d in devices if not before[d.index]) < value
            else:
                sliced = [d for d in devices if d.slices > 1]
                assert all(d.slices - len(before[d.index]) < value for d in sliced)
            continue
        if kind == "whole":
            assert len(grant.held) == value
            for index, slots in grant.held:
                # a whole-device task only on a fully free device, and it takes all of it
                assert not before[index]
                assert len(slots) == next(d.slices for d in devices if d.index == index)
        else:
            assert len(grant.held) == 1  # slices never span devices
            index, slots = grant.held[0]
            assert len(slots) == value
            assert not set(slots) & before[index]
            # best fit: no device that fits keeps fewer free slices after the grant
            assert next(d.slices for d in devices if d.index == index) > 1
            left = {
                d.index: d.slices - len(before[d.index]) - value for d in devices if d.slices > 1
            }
            assert left[index] == min(v for v in left.values() if v >= 0)
        grants.append(grant)
        _check(devices, grants)


def test_best_fit_fills_a_partly_used_device_first() -> None:
    devices = (Device(0, 4, "time"), Device(1, 4, "time"))
    a = plan(devices, [], "a", Request(slices=1))
    assert a == Grant("a", ((0, (0,)),))
    b = plan(devices, [a], "b", Request(slices=2))
    assert b == Grant("b", ((0, (1, 2)),))  # device 0 keeps 1 free: fewer than device 1's 2
    whole = plan(devices, [a, b], "w", Request(devices=1))
    assert whole == Grant("w", ((1, (0, 1, 2, 3)),))
    assert plan(devices, [a, b, whole], "x", Request(devices=1)) is None
    assert plan(devices, [a, b, whole], "y", Request(slices=2)) is None
    assert plan(devices, [a, b, whole], "z", Request(slices=1)) == Grant("z", ((0, (3,)),))


def test_device_env_names_the_unit() -> None:
    mig = Device(0, 2, "mig", ("MIG-aaa", "MIG-bbb"), "17:00.0")
    vf = Device(1, 3, "sriov", ("0000:3b:00.1", "0000:3b:00.2", "0000:3b:00.3"), "3b:00.0")
    shared = Device(2, 4, "time")
    assert device_env((mig,), Grant("t", ((0, (1,)),))) == {
        "CUDA_VISIBLE_DEVICES": "MIG-bbb",
        "EDGESCHED_ACCEL_SLICE": "0:1/2",
    }
    assert device_env((vf,), Grant("t", ((1, (0, 2)),))) == {
        "EDGESCHED_VF_PCI": "0000:3b:00.1,0000:3b:00.3",
        "EDGESCHED_ACCEL_SLICE": "1:0,2/3",
    }
    assert device_env((shared,), Grant("t", ((2, (3,)),))) == {
        "CUDA_VISIBLE_DEVICES": "2",
        "EDGESCHED_ACCEL_SLICE": "2:3/4",
    }
    assert device_env((shared,), Grant("t", ())) == {}


def test_grant_json_round_trip() -> None:
    g = Grant("t", ((0, (1, 2)), (3, (0,))))
    assert Grant.from_json(g.to_json()) == g
    with pytest.raises(ValueError):
        Grant.from_json({"task": "t", "held": [[0, ["x"]]]})


def test_spec_without_slices_serializes_as_before() -> None:
    spec = TaskSpec(id="t", command=("true",), accel=1)
    assert "accel_slices" not in spec.to_json()
    sliced = TaskSpec(id="s", command=("true",), accel_slices=2)
    data = sliced.to_json()
    assert data["accel_slices"] == 2
    assert TaskSpec.from_json(data) == sliced
    task = sliced.to_task(0.0)
    assert task.demand.accel == 0 and task.demand.accel_slices == 2
    with pytest.raises(SpecError, match="accel_slices"):
        TaskSpec(id="b", command=("true",), accel=1, accel_slices=1)
    with pytest.raises(SpecError, match="accel_slices"):
        TaskSpec.from_json({"id": "b", "command": ["true"], "accel_slices": -1})


def _node(ident: str, accel: int, slices: int) -> Node:
    return Node(
        ident,
        Arch.X86_64,
        ServerClass.AI_ACCELERATOR,
        Resources(cpu=64.0, mem_gib=512.0, accel=accel, accel_slices=slices),
        PowerModel(100.0, 500.0),
    )


def _task(ident: str, accel: int = 0, slices: int = 0) -> Task:
    return Task(ident, "ai", 50, Resources(cpu=1.0, mem_gib=1.0, accel=accel, accel_slices=slices))


def _feasible(nodes: list[Node], running: list[Placement], task: Task) -> set[str]:
    table = NodeTable.build(nodes, running)
    mask = FILTER_CHAIN.feasible(table, task, resource_vector(task.demand))
    return {table.nodes[i].id for i in range(len(table)) if mask[i]}


def test_core_fit_packs_slices_per_device() -> None:
    sliced, whole = _node("sliced", 2, 8), _node("whole", 2, 0)
    nodes = [sliced, whole]
    assert _feasible(nodes, [], _task("s", slices=3)) == {"sliced"}  # unsliced offers none
    assert _feasible(nodes, [], _task("w", accel=2)) == {"sliced", "whole"}
    # 3 + 3 slices of 4: one task on each device, so no device is whole any more
    running = [
        Placement(_task("a", slices=3), "sliced", 0.0),
        Placement(_task("b", slices=3), "sliced", 1.0),
    ]
    assert _feasible(nodes, running, _task("w", accel=1)) == {"whole"}
    assert _feasible(nodes, running, _task("s2", slices=2)) == set()  # 1 free on each device
    assert _feasible(nodes, running, _task("s1", slices=1)) == {"sliced"}
    # 2 + 2 slices: best fit puts both on device 0, so device 1 stays whole
    running = [
        Placement(_task("a", slices=2), "sliced", 0.0),
        Placement(_task("b", slices=2), "sliced", 1.0),
    ]
    assert _feasible(nodes, running, _task("w", accel=1)) == {"sliced", "whole"}
    assert _feasible(nodes, running, _task("w2", accel=2)) == {"whole"}


@settings(max_examples=150, deadline=None)
@given(
    count=st.integers(1, 4),
    per=st.integers(1, 4),
    asks=st.lists(st.tuples(st.booleans(), st.integers(1, 4)), max_size=12),
)
def test_core_fit_agrees_with_the_packing(
    count: int, per: int, asks: list[tuple[bool, int]]
) -> None:
    """What the core's filter admits, one after another, the packing grants: the core
    never places more on a node than its devices hold."""
    node = _node("n", count, count * per)
    devices = tuple(Device(i, per) for i in range(count))
    running: list[Placement] = []
    grants: list[Grant] = []
    for n, (whole, amount) in enumerate(asks):
        task = _task(f"t{n}", accel=amount if whole else 0, slices=0 if whole else amount)
        admitted = "n" in _feasible([node], running, task)
        request = Request(devices=amount) if whole else Request(slices=amount)
        grant = plan(devices, grants, task.id, request)
        assert admitted == (grant is not None)
        if grant is not None:
            grants.append(grant)
            running.append(Placement(task, "n", float(n)))
            _check(devices, grants)


def test_config_accel_time_slices_is_validated() -> None:
    assert parse_config({}).edge.accel_time_slices == 1
    assert parse_config({"edge": {"accel_time_slices": 4}}).edge.accel_time_slices == 4
    for bad in (0, -1, 65, 2.5, True, "4"):
        with pytest.raises(ConfigError, match="accel_time_slices"):
            parse_config({"edge": {"accel_time_slices": bad}})


def test_registration_carries_slices_only_when_set() -> None:
    plain = Registration(
        arch=Arch.X86_64, server_class=ServerClass.AI_ACCELERATOR, cpu=8.0, accel=2
    )
    assert "accel_slices" not in plain.to_entry()
    sliced = Registration(
        arch=Arch.X86_64, server_class=ServerClass.AI_ACCELERATOR, cpu=8.0, accel=2, accel_slices=8
    )
    assert sliced.to_entry()["accel_slices"] == 8
    assert Registration.from_entry(sliced.to_entry()) == sliced
    assert sliced.to_node("n").capacity.accel_slices == 8
    assert plain.to_node("n").capacity.accel_slices == 0


def test_the_node_s_held_grants_make_its_own_view_exact() -> None:
    """After a release the replay (start order) can pack tighter than the real grants: the
    fleet-level view may then admit a whole-device task the node must keep waiting; the
    node's own view, with its grants in the held label, refuses it."""
    devices = (Device(0, 4, "time"), Device(1, 4, "time"))
    a = plan(devices, [], "a", Request(slices=3))
    b = plan(devices, [a] if a else [], "b", Request(slices=3))
    assert a is not None and b is not None
    c = plan(devices, [a, b], "c", Request(slices=1))
    assert c == Grant("c", ((0, (3,)),))
    held = [b, c]  # a released: device 0 holds c's slot 3, device 1 holds b
    assert plan(devices, held, "x", Request(devices=1)) is None
    node = _node("n", 2, 8)
    running = [
        Placement(_task("b", slices=3), "n", 1.0),
        Placement(_task("c", slices=1), "n", 2.0),
    ]
    # the replay puts b on device 0 with c beside it: device 1 looks whole
    assert _feasible([node], running, _task("x", accel=1)) == {"n"}
    labelled = replace(node, labels={HELD_LABEL: held_label(held)})
    assert parse_held_label(labelled.labels[HELD_LABEL]) == {"b": b, "c": c}
    assert _feasible([labelled], running, _task("x", accel=1)) == set()
    assert _feasible([labelled], running, _task("y", slices=1)) == {"n"}
    assert parse_held_label("not json") == {} and parse_held_label(None) == {}
