"""The placement filter chain is declared once and every consumer runs that one declaration.

The scheduler's filter stage and the kube-scheduler extender's filter verb must accept the
same nodes, report a failing node under the same stage, and cache only what the chain says
is static.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.central.extender import filter_nodes, pod_to_task
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
from edgesched.core.nodetable import NodeTable, resource_vector
from edgesched.core.plugins import FILTER_CHAIN
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, feasible_nodes, schedule

Json = dict[str, Any]

POWER = PowerModel(idle_w=80, peak_w=300, parked_w=8)
K8S_ARCH = {Arch.ARM64: "arm64", Arch.X86_64: "amd64"}
DECLARED = (
    "node_ready",
    "arch_compatible",
    "server_class_allowed",
    "resources_fit",
    "accelerator_reserve",
)


def pod(
    cpu: float,
    mem_gib: float,
    gpus: int = 0,
    iops_k: int = 0,
    archs: frozenset[Arch] = frozenset(),
    classes: frozenset[ServerClass] = frozenset(),
) -> Json:
    """A minimal pending pod; ``archs`` and ``classes`` become required node affinity."""
    requests: dict[str, str] = {"cpu": f"{int(cpu * 1000)}m", "memory": f"{int(mem_gib * 1024)}Mi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    if iops_k:
        requests["edgesched.io/iops-k"] = str(iops_k)
    expressions = []
    if archs:
        values = sorted(K8S_ARCH[a] for a in archs)
        expressions.append({"key": "kubernetes.io/arch", "operator": "In", "values": values})
    if classes:
        values = sorted(c.value for c in classes)
        expressions.append({"key": "edgesched.io/server-class", "operator": "In", "values": values})
    spec: Json = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    if expressions:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": expressions}]
                }
            }
        }
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": spec}


def accepted_by_extender(
    pod_json: Json, nodes: list[Node], placements: list[Placement], policy: PolicyConfig
) -> tuple[set[str], dict[str, str]]:
    """(names the filter verb passes, name -> reason for every other candidate)."""
    fleet = {n.id: n for n in nodes}
    result = filter_nodes(
        {"Pod": pod_json, "NodeNames": list(fleet)}, fleet, policy, placements=placements
    )
    reasons = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    return set(result["NodeNames"]), reasons


# --- the declaration -------------------------------------------------------------------------


def test_the_chain_is_exactly_the_declared_stages_in_order() -> None:
    assert FILTER_CHAIN.names == DECLARED
    assert [s.name for s in FILTER_CHAIN.stages if s.static] == [
        "arch_compatible",
        "server_class_allowed",
    ]
    assert [s.name for s in FILTER_CHAIN.stages if s.resolvable] == [
        "resources_fit",
        "accelerator_reserve",
    ]


def test_no_module_calls_a_filter_outside_the_chain() -> None:
    """A second hand-written chain would call the filter functions itself."""
    root = Path(__file__).resolve().parents[1]
    call = re.compile(r"\b(" + "|".join(DECLARED) + r")\s*\(")
    offenders = []
    for folder in ("app", "core", "central", "edge", "sync", "policies", "rest", "fieldtest"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == root / "core" / "plugins.py":
                continue
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if call.search(line):
                    offenders.append(f"{path.relative_to(root)}:{lineno}: {line.strip()}")
    assert offenders == []
    # and the declaration itself does call each stage's function by that name
    source = (root / "core" / "plugins.py").read_text()
    for name in DECLARED:
        assert f"def {name}(" in source


# --- the scheduler and the extender agree ---------------------------------------------------

archs = st.sampled_from(list(Arch))
classes = st.sampled_from(list(ServerClass))


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[Node], list[Placement]]:
    nodes = []
    for i in range(draw(st.integers(1, 8))):
        cls = draw(classes)
        nodes.append(
            Node(
                f"n{i:02d}",
                draw(archs),
                cls,
                Resources(
                    draw(st.integers(4, 64)),
                    draw(st.integers(8, 256)),
                    draw(st.integers(0, 4)) if cls is ServerClass.AI_ACCELERATOR else 0,
                    draw(st.sampled_from([0, 500])) if cls is ServerClass.STORAGE_DENSE else 0,
                ),
                POWER,
                state=draw(st.sampled_from([NodeState.ACTIVE] * 4 + list(NodeState))),
            )
        )
    placements = [
        Placement(
            Task(
                f"r{i}",
                "w",
                draw(st.integers(0, 100)),
                Resources(
                    draw(st.integers(1, 32)), draw(st.integers(1, 64)), draw(st.integers(0, 2))
                ),
            ),
            draw(st.sampled_from(nodes)).id,
            0.0,
        )
        for i in range(draw(st.integers(0, 10)))
    ]
    return nodes, placements


@st.composite
def pods(draw: st.DrawFn) -> Json:
    return pod(
        cpu=draw(st.sampled_from([0.5, 1, 2, 4, 8, 16, 32, 48])),
        mem_gib=draw(st.sampled_from([1, 4, 16, 64])),
        gpus=draw(st.sampled_from([0, 0, 0, 1, 2])),
        iops_k=draw(st.sampled_from([0, 0, 0, 100])),
        archs=frozenset(draw(st.lists(archs, max_size=1))),
        classes=frozenset(draw(st.lists(classes, max_size=2))),
    )


policies = st.builds(
    PolicyConfig,
    mode=st.sampled_from(list(PolicyMode)),
    accel_reserve_cpu=st.sampled_from([0.0, 4.0, 12.0]),
    accel_reserve_mem_gib=st.sampled_from([0.0, 32.0]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), pods(), policies)
def test_scheduler_filter_stage_and_extender_filter_accept_the_same_nodes(
    fleet: tuple[list[Node], list[Placement]], pod_json: Json, policy: PolicyConfig
) -> None:
    nodes, placements = fleet
    task = pod_to_task(pod_json)
    ours = feasible_nodes(ClusterView(tuple(nodes), tuple(placements)), task, policy)
    theirs, reasons = accepted_by_extender(pod_json, nodes, placements, policy)
    assert ours == theirs
    assert set(reasons) == {n.id for n in nodes} - theirs  # every other node has a reason
    # and the core places the task exactly when some node passes, on one of those nodes
    result = schedule(ClusterView(tuple(nodes), tuple(placements)), [task], policy)
    placed = [d.node_id for d in result.decisions if d.task_id == task.id]
    if ours:
        assert placed and placed[-1] in ours
    elif placed:  # only by preempting, never on a node the chain refuses outright
        table = NodeTable.build(
            nodes, placements, (policy.accel_reserve_cpu, policy.accel_reserve_mem_gib)
        )
        eligible = FILTER_CHAIN.eligible(table, task, resource_vector(task.demand))
        assert eligible[table.index[placed[-1]]]


def test_each_stage_is_reported_under_its_own_phrase_by_both_consumers() -> None:
    """One node per stage, each failing first at that stage; a sixth passes."""
    nodes = [
        Node(
            "a-parked",
            Arch.ARM64,
            ServerClass.GENERAL,
            Resources(16, 64),
            POWER,
            state=NodeState.PARKED,
        ),
        Node("b-x86", Arch.X86_64, ServerClass.GENERAL, Resources(16, 64), POWER),
        Node("c-storage", Arch.ARM64, ServerClass.STORAGE_DENSE, Resources(16, 64), POWER),
        Node("d-full", Arch.ARM64, ServerClass.GENERAL, Resources(16, 64), POWER),
        Node("e-gpus", Arch.ARM64, ServerClass.GENERAL, Resources(16, 64, 2), POWER),
        Node("f-ok", Arch.ARM64, ServerClass.GENERAL, Resources(16, 64), POWER),
    ]
    busy = Task("r1", "w", 100, Resources(12, 8), preemptible=False)
    placements = [Placement(busy, "d-full", 0.0)]
    policy = PolicyConfig(mode=PolicyMode.PRIORITY, accel_reserve_cpu=8.0)
    pod_json = pod(8, 4, archs=frozenset({Arch.ARM64}), classes=frozenset({ServerClass.GENERAL}))
    task = pod_to_task(pod_json)

    table = NodeTable.build(
        nodes, placements, (policy.accel_reserve_cpu, policy.accel_reserve_mem_gib)
    )
    demand = resource_vector(task.demand)
    masks = {stage.name: mask for stage, mask in FILTER_CHAIN.evaluate(table, task, demand)}
    first_failed = {
        node.id: next((name for name in DECLARED if not masks[name][row]), None)
        for row, node in enumerate(table.nodes)
    }
    assert first_failed == dict(zip([n.id for n in nodes], [*DECLARED, None], strict=True))

    whys = {s.name: s.why for s in FILTER_CHAIN.stages}
    theirs, reasons = accepted_by_extender(pod_json, nodes, placements, policy)
    assert theirs == {"f-ok"}
    assert reasons == {
        node.id: f"edgesched: {whys[stage]}"
        for node, stage in zip(nodes[:-1], DECLARED, strict=True)
    }
    fleet = {n.id: n for n in nodes}
    result = filter_nodes(
        {"Pod": pod_json, "NodeNames": list(fleet)}, fleet, policy, placements=placements
    )
    assert set(result["FailedNodes"]) == {"d-full", "e-gpus"}  # resolvable by preemption

    # The scheduler, with the passing node gone, explains in chain order.
    view = ClusterView(tuple(nodes[:-1]), tuple(placements))
    outcome = schedule(view, [task], policy)
    assert [d for d in outcome.decisions if d.task_id == task.id] == []
    assert outcome.waiting[task.id] == (
        "0/5 nodes available: 1 not ready (parked or waking), 1 wrong architecture or no image, "
        "1 server class not allowed, 1 insufficient resources, 1 capacity kept for accelerators"
    )
    assert feasible_nodes(ClusterView(tuple(nodes), tuple(placements)), task, policy) == {"f-ok"}


# --- what the scheduler caches ---------------------------------------------------------------

images = st.dictionaries(archs, st.just("img"), max_size=2)


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    return Task(
        draw(st.sampled_from(["t1", "t2"])),
        draw(st.sampled_from(["a", "b"])),
        draw(st.integers(0, 100)),
        Resources(draw(st.integers(1, 64)), draw(st.integers(1, 64)), draw(st.integers(0, 2))),
        archs=frozenset(draw(st.lists(archs, max_size=2))),
        images=draw(images),
        server_classes=frozenset(draw(st.lists(classes, max_size=2))),
    )


@settings(max_examples=300, deadline=None)
@given(fleets(), tasks(), tasks())
def test_tasks_with_one_static_key_get_one_static_mask(
    fleet: tuple[list[Node], list[Placement]], first: Task, second: Task
) -> None:
    """The scheduler computes the static stages once per key: the key must cover them."""
    nodes, placements = fleet
    table = NodeTable.build(nodes, placements)
    masks = [FILTER_CHAIN.static_mask(table, t, resource_vector(t.demand)) for t in (first, second)]
    if FILTER_CHAIN.static_key(first) == FILTER_CHAIN.static_key(second):
        assert np.array_equal(masks[0], masks[1])
    # and the cached static mask gives the same feasible set as evaluating every stage
    for t, static in zip((first, second), masks, strict=True):
        demand = resource_vector(t.demand)
        everything = np.logical_and.reduce([m for _, m in FILTER_CHAIN.evaluate(table, t, demand)])
        assert np.array_equal(FILTER_CHAIN.feasible(table, t, demand, static), everything)
        assert np.array_equal(FILTER_CHAIN.feasible(table, t, demand), everything)
