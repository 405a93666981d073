"""The pure rules of services (issue 15): replica ids, specs, the reconcile rule, autoscaling,
and the core's spread of replicas (``core/service.py``, ``core/spread.py``)."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.lifecycle import Phase
from edgesched.core.model import Arch, Node, PowerModel, Resources, ServerClass
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, schedule
from edgesched.core.service import (
    Autoscale,
    Replica,
    ReplicaRef,
    ScaleReason,
    ScaleState,
    ServiceSpec,
    parse_replica_id,
    plan,
    rebalance_donor,
    recommend,
    replica_id,
)
from edgesched.core.spread import SpreadGroup
from edgesched.core.task import SpecError, TaskSpec


def service(replicas: int = 3, **extra: object) -> ServiceSpec:
    return ServiceSpec.from_json(
        {"name": "web", "template": {"command": ["srv"], "cpu": 1.0}, "replicas": replicas} | extra
    )


def running(spec: ServiceSpec, slot: int, incarnation: int = 0, since: float = 0.0) -> Replica:
    return Replica(
        ReplicaRef(spec.name, slot, spec.revision, incarnation),
        Phase.RUNNING,
        node=f"n{slot}",
        running_since=since,
    )


# --- ids and specs -------------------------------------------------------------------------------


@given(
    name=st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
    slot=st.integers(0, 999_999),
    revision=st.from_regex(r"[0-9a-f]{8}", fullmatch=True),
    incarnation=st.integers(0, 999_999_999),
)
def test_a_replica_id_parses_back_to_its_parts(
    name: str, slot: int, revision: str, incarnation: int
) -> None:
    task_id = replica_id(name, slot, revision, incarnation)
    TaskSpec(id=task_id, command=("x",))  # a valid task id
    assert parse_replica_id(task_id) == ReplicaRef(name, slot, revision, incarnation)


@pytest.mark.parametrize("task_id", ["web", "web.0", "web.0.abc.1", "Web.0.0123abcd.1", "a.b.c.d"])
def test_other_task_ids_name_no_replica(task_id: str) -> None:
    assert parse_replica_id(task_id) is None


def test_the_spec_round_trips_and_its_revision_is_the_templates() -> None:
    spec = service(
        4,
        min=2,
        max=8,
        autoscale={"metric": "load", "target_per_replica": 0.5},
        spread={"max_per_node": 1, "across": ["site", "node"]},
        rollout={"max_surge": 2},
    )
    again = ServiceSpec.from_json(spec.to_json())
    assert again == spec
    assert spec.template.restart.value == "always"  # (the default for a replica)
    assert spec.with_replicas(6).revision == spec.revision  # a count is not a revision
    other = ServiceSpec.from_json(spec.to_json() | {"template": {"command": ["srv", "-v"]}})
    assert other.revision != spec.revision
    assert spec.with_replicas(100).replicas == 8 and spec.with_replicas(0).replicas == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"template": {"command": ["x"]}}, "name"),
        ({"name": "Web", "template": {"command": ["x"]}}, "name"),
        ({"name": "web"}, "template"),
        ({"name": "web", "template": {"command": []}}, "template.command"),
        ({"name": "web", "template": {"command": ["x"], "restart": "never"}}, "template.restart"),
        ({"name": "web", "template": {"command": ["x"]}, "replicas": 5, "max": 3}, "replicas"),
        ({"name": "web", "template": {"command": ["x"]}, "replicas": True}, "replicas"),
        ({"name": "web", "template": {"command": ["x"]}, "spread": {"across": ["rack"]}},
         "spread.across"),
        ({"name": "web", "template": {"command": ["x"]}, "autoscale": {"metric": "rps"}},
         "autoscale.metric"),
        ({"name": "web", "template": {"command": ["x"]}, "rollout": {"max_surge": 0}},
         "rollout.max_surge"),
        ({"name": "web", "template": {"command": ["x"]}, "colour": "red"}, "colour"),
    ],
)  # fmt: skip
def test_a_bad_spec_is_refused_naming_its_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as refused:
        ServiceSpec.from_json(body)
    assert str(refused.value).startswith(field + ":"), refused.value


# --- the reconcile rule --------------------------------------------------------------------------


def test_a_new_service_starts_every_slot_and_one_that_runs_is_left_alone() -> None:
    spec = service(3)
    todo = plan(spec, [], 0.0)
    assert todo.start == ((0, 0), (1, 1), (2, 2)) and todo.stop == ()
    assert plan(spec, [running(spec, s, s) for s in range(3)], 0.0).empty


def test_scaling_in_stops_the_highest_slots_first() -> None:
    spec = service(5)
    replicas = [running(spec, s, s) for s in range(5)]
    todo = plan(spec.with_replicas(2), replicas, 0.0)
    assert [t for t, _ in todo.stop] == [
        replicas[4].task_id,
        replicas[3].task_id,
        replicas[2].task_id,
    ]
    assert todo.start == ()


def test_a_failed_replica_is_replaced_by_a_new_incarnation_and_a_lost_one_is_not() -> None:
    spec = service(2)
    failed = replace(running(spec, 0, 0), phase=Phase.FAILED)
    lost = replace(running(spec, 1, 1), phase=Phase.LOST)
    todo = plan(spec, [failed, lost], 0.0, next_incarnation=7)
    assert todo.start == ((0, 7),)  # (the slot on a dead node is the failover's)
    assert [t for t, _ in todo.stop] == [failed.task_id]  # retired: any copy left stops
    retired = replace(failed, stopping=True)
    assert plan(spec, [retired, lost], 0.0, next_incarnation=7).stop == ()


def test_a_rollout_surges_then_stops_the_old_once_the_new_is_healthy() -> None:
    old = service(3)
    new = ServiceSpec.from_json(old.to_json() | {"template": {"command": ["srv", "v2"]}})
    replicas = [running(old, s, s) for s in range(3)]
    first = plan(new, replicas, 100.0)
    assert first.start == ((0, 3),) and first.stop == () and first.outdated == 3
    starting = Replica(ReplicaRef("web", 0, new.revision, 3), Phase.PLACED, node="n9")
    assert plan(new, [*replicas, starting], 100.0).empty  # one at a time: it is not healthy
    healthy = replace(starting, phase=Phase.RUNNING, running_since=100.0)
    assert plan(new, [*replicas, healthy], 105.0).empty  # up 5 s of the 10 it must be
    done = plan(new, [*replicas, healthy], 110.0)
    assert [t for t, _ in done.stop] == [replicas[0].task_id]
    assert done.start == ((1, 4),)  # the next slot, as the first stops


def test_a_rollout_stalls_after_its_failures_and_empty_slots_still_fill() -> None:
    old = service(2)
    new = ServiceSpec.from_json(old.to_json() | {"template": {"command": ["bad"]}})
    failures = [Replica(ReplicaRef("web", 0, new.revision, i), Phase.FAILED) for i in range(10, 13)]
    still = [running(old, 0, 0)]
    todo = plan(new, [*still, *failures], 0.0)
    assert todo.stalled and todo.start == ((1, 13),)  # slot 1 was empty: filled anyway


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 6),
            st.sampled_from([Phase.RUNNING, Phase.PLACED, Phase.FAILED, Phase.LOST, Phase.EXITED]),
            st.booleans(),
            st.integers(0, 30),
        ),
        max_size=14,
        unique_by=lambda t: t[3],
    ),
    st.integers(0, 6),
    st.randoms(use_true_random=False),
)
def test_the_plan_is_deterministic_and_leaves_no_excess(
    held: list[tuple[int, Phase, bool, int]], want: int, rnd: random.Random
) -> None:
    spec = service(want)
    replicas = [
        Replica(ReplicaRef("web", slot, spec.revision, inc), phase, node="n", stopping=stop,
                running_since=0.0 if phase is Phase.RUNNING else None)
        for slot, phase, stop, inc in held
    ]  # fmt: skip
    todo = plan(spec, replicas, 50.0)
    shuffled = list(replicas)
    rnd.shuffle(shuffled)
    assert plan(spec, shuffled, 50.0) == todo
    # applying the plan: every slot below the count holds one live replica, none above
    stopped = {t for t, _ in todo.stop}
    after = [r for r in replicas if r.live and r.task_id not in stopped]
    slots = Counter(r.ref.slot for r in after) + Counter(s for s, _ in todo.start)
    assert sorted(slots) == list(range(want)), (slots, todo)
    assert set(slots.values()) <= {1}
    used = {r.ref.incarnation for r in replicas}
    assert not used & {i for _, i in todo.start}  # an id is never used twice


# --- autoscaling ---------------------------------------------------------------------------------


def scaled(replicas: int = 2, **rule: object) -> ServiceSpec:
    return service(
        replicas,
        min=1,
        max=10,
        autoscale={"target_per_replica": 1.0, "scale_in_delay_s": 60.0} | rule,
    )


def test_load_scales_out_within_the_step_limit() -> None:
    rec = recommend(scaled(2, metric="load"), 9.5, None, ScaleState(), 0.0)
    assert rec.replicas == 6 and rec.reason is ScaleReason.LOAD  # wants 10, at most +4


def test_the_forecast_scales_out_ahead_of_a_peak_the_load_does_not_show() -> None:
    spec = scaled(2)
    rec = recommend(spec, 1.5, 4.2, ScaleState(), 0.0)
    assert rec.replicas == 5 and rec.reason is ScaleReason.FORECAST
    assert "forecast peak 4.20" in rec.why
    assert (
        recommend(
            replace(spec, autoscale=Autoscale("load", 1.0)), 1.5, 4.2, ScaleState(), 0.0
        ).replicas
        == 2
    )


def test_a_scale_in_waits_for_the_delay_and_steps_down_one_at_a_time() -> None:
    spec = scaled(5)
    state = recommend(spec, 5.0, None, ScaleState(), 0.0).state  # wanted 5 at t=0
    rec = recommend(spec, 1.0, None, state, 30.0)
    assert rec.replicas == 5  # 5 was wanted 30 s ago: held
    rec = recommend(spec, 1.0, None, rec.state, 61.0)
    assert rec.replicas == 4 and "wanted at most 1" in rec.why  # one step of max_step_in
    assert recommend(spec, None, None, ScaleState(), 0.0).replicas == 5  # no load: unchanged


def test_min_and_max_bound_the_autoscaler() -> None:
    spec = scaled(2)
    assert recommend(spec, 0.0, None, ScaleState(), 0.0).state.recent[-1][1] == 1
    assert recommend(replace(spec, replicas=9), 500.0, None, ScaleState(), 0.0).replicas == 10


# --- the core's spread ---------------------------------------------------------------------------


def fleet(sites: int, per_site: int, cpu: float = 8.0) -> list[Node]:
    return [
        Node(
            id=f"s{s}-n{i}",
            arch=Arch.X86_64 if i % 2 else Arch.ARM64,
            server_class=ServerClass.GENERAL,
            capacity=Resources(cpu=cpu, mem_gib=32),
            power=PowerModel(20, 100),
            site=f"site-{s}",
        )
        for s in range(sites)
        for i in range(per_site)
    ]


def replicas_of(spec: ServiceSpec, n: int) -> list[TaskSpec]:
    return [spec.replica_spec(slot, slot) for slot in range(n)]


@settings(max_examples=60, deadline=None)
@given(
    sites=st.integers(1, 4),
    per_site=st.integers(1, 5),
    n=st.integers(1, 24),
    max_per_node=st.integers(0, 3),
    across=st.sampled_from([(), ("node",), ("site",), ("site", "node"), ("arch",)]),
    mode=st.sampled_from([PolicyMode.ENERGY, PolicyMode.BALANCE, PolicyMode.PRIORITY]),
)
def test_replicas_never_pass_the_per_node_bound_and_spread_evenly_across_sites(
    sites: int, per_site: int, n: int, max_per_node: int, across: tuple[str, ...], mode: PolicyMode
) -> None:
    nodes = fleet(sites, per_site)
    spec = service(n, spread={"max_per_node": max_per_node, "across": list(across)})
    tasks = replicas_of(spec, n)
    group = SpreadGroup("web", max_per_node, across, {})
    result = schedule(
        ClusterView(tuple(nodes), (), 0.0), [t.to_task(0.0) for t in tasks],
        PolicyConfig(mode=mode), {t.id: group for t in tasks},
    )  # fmt: skip
    placed = {d.task_id: d.node_id for d in result.decisions if d.kind.value == "place"}
    per_node = Counter(placed.values())
    room = min(max_per_node or 8, 8)  # (8 cores a node, 1 a replica)
    assert len(placed) == min(n, room * len(nodes))
    assert max(per_node.values(), default=0) <= room
    site_of = {node.id: node.site for node in nodes}
    if "site" in across and len(placed) == n:
        per_site_count = Counter(site_of[v] for v in placed.values())
        counts = [per_site_count.get(f"site-{s}", 0) for s in range(sites)]
        assert max(counts) - min(counts) <= 1, counts
    if across == ("node",) and len(placed) == n:
        counts = [per_node.get(node.id, 0) for node in nodes]
        assert max(counts) - min(counts) <= 1, counts


def test_replicas_placed_before_count_against_a_node() -> None:
    nodes = fleet(1, 3)
    spec = service(2, spread={"max_per_node": 1})
    tasks = replicas_of(spec, 2)
    group = SpreadGroup("web", 1, (), {"s0-n0": 1, "s0-n1": 1})
    result = schedule(
        ClusterView(tuple(nodes), (), 0.0), [t.to_task(0.0) for t in tasks], PolicyConfig(),
        {t.id: group for t in tasks},
    )  # fmt: skip
    placed = [d.node_id for d in result.decisions if d.kind.value == "place"]
    assert placed == ["s0-n2"]
    assert "at most 1 a node" in result.waiting[tasks[1].id]


# --- the decoder, fuzzed -------------------------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=12,
)
_VALID = service(
    3, min=1, max=6, autoscale={"metric": "load"}, spread={"max_per_node": 2, "across": ["node"]}
).to_json()


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.text(max_size=20), min_size=1, max_size=3), _JSON), max_size=4)
)
def test_the_service_decoder_refuses_only_with_a_spec_error(
    edits: list[tuple[list[str], object]],
) -> None:
    """A REST body, a job file or a document entry: any value at any path of a valid spec
    (or a new key) is accepted as a spec that round-trips, or refused with a SpecError naming
    a field; nothing else escapes."""
    body: dict[str, object] = json.loads(json.dumps(_VALID))
    for path, value in edits:
        target: object = body
        for key in path[:-1]:
            nxt = target.get(key) if isinstance(target, dict) else None
            if not isinstance(nxt, dict):
                break
            target = nxt
        if isinstance(target, dict):
            target[path[-1]] = value
    try:
        spec = ServiceSpec.from_json(body)
    except SpecError as refused:
        assert str(refused).split(":", 1)[0], refused
        return
    assert ServiceSpec.from_json(spec.to_json()) == spec


def test_the_rebalance_donor_is_the_highest_slot_of_the_fullest_domain() -> None:
    spec = service(4, spread={"across": ["site"]})
    site = {"n0": "a", "n1": "a", "n2": "a", "n3": "b"}.get
    replicas = [replace(running(spec, s, s), node=f"n{s}") for s in range(4)]
    donor = rebalance_donor(spec, replicas, site, domains=3)  # a: 3, b: 1, c: 0
    assert donor is not None and donor[0].ref.slot == 2 and donor[1] == 3
    assert rebalance_donor(spec, replicas, site, domains=2) is not None  # a: 3, b: 1
    even = [replace(r, node="n3") if r.ref.slot == 2 else r for r in replicas]
    assert rebalance_donor(spec, even, site, domains=2) is None  # a: 2, b: 2
    starting = [replace(replicas[0], phase=Phase.PLACED), *replicas[1:]]
    assert rebalance_donor(spec, starting, site, domains=3) is None  # not settled
    assert rebalance_donor(service(4), replicas, site, domains=3) is None  # no spread asked
