"""A service keeps its replica count through cuts, heals, scaling and rollouts (issue 15).

A hypothesis state machine drives central's real engine (its control step with the service
controller, the failover and the per-task reconcile) over the three nodes of
``test_service_runs_once.Fleet``, which follow central's assignments as the edge engine does
and keep running what they run while cut off. Rules fire in random orders: scale the service
(to any count within ``[min, max]``, also while nodes are cut off), roll out a new template,
cut a node off, heal it, crash a replica for good on a connected node, let time pass.

What must hold:

- **never below min**: after every rule, at least ``min`` slots hold a replica that runs (or
  is about to) on some node, cut off or not: central stops a replica only for a slot above
  the count or once the slot's replacement runs;
- **no lasting excess, none lost**: once every node is healed and the fleet settles, exactly
  ``replicas`` replicas run, one per slot ``0 .. replicas-1`` (the ones stopped are those of
  the highest slots, on every peer alike), all of the last template, and central's view of
  the service says so.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_service_runs_once import GRACE_S, NODES, Fleet

from edgesched.core.policy import PolicyMode
from edgesched.core.service import ServiceSpec, parse_replica_id
from edgesched.core.task import TaskSpec, TaskState

SLOW = os.environ.get("EDGESCHED_SLOW") == "1"
MIN, MAX = 2, 8
ACTIVE = (TaskState.RUNNING, TaskState.PREEMPTED, TaskState.ACCEPTED)
COMMANDS = (["srv", "v1"], ["srv", "v2"], ["srv", "v3"])


def web(replicas: int, command: list[str]) -> ServiceSpec:
    return ServiceSpec.from_json(
        {
            "name": "web",
            "template": {"command": command, "cpu": 1.0},
            "replicas": replicas,
            "min": MIN,
            "max": MAX,
            "spread": {"max_per_node": 3, "across": ["node"]},
            "rollout": {"max_surge": 1, "healthy_after_s": 2.0},
        }
    )


class Services(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fleet = Fleet()
        self.replicas = 4
        self.command = COMMANDS[0]
        asyncio.run(self.fleet.engine.apply_service(web(self.replicas, self.command)))
        self.fleet.step()

    def teardown(self) -> None:
        self.fleet.teardown()

    # --- reading the nodes ----------------------------------------------------------------

    def active_slots(self) -> set[int]:
        """Slots with a replica running (or about to) on any node, cut off or not."""
        slots = set()
        for node_id in NODES:
            for task_id, copy in self.fleet.copies[node_id].items():
                ref = parse_replica_id(task_id)
                if ref is not None and copy.state in ACTIVE:
                    slots.add(ref.slot)
        return slots

    def running(self) -> list[str]:
        return sorted(
            task_id
            for node_id in NODES
            for task_id, copy in self.fleet.copies[node_id].items()
            if copy.state is TaskState.RUNNING
        )

    # --- rules ----------------------------------------------------------------------------

    @rule(replicas=st.integers(MIN, MAX))
    def scale(self, replicas: int) -> None:
        asyncio.run(self.fleet.engine.scale_service("web", replicas))
        self.replicas = replicas
        self.fleet.step()

    @rule(command=st.sampled_from(COMMANDS))
    def roll_out(self, command: list[str]) -> None:
        asyncio.run(self.fleet.engine.apply_service(web(self.replicas, command)))
        self.command = command
        self.fleet.step()

    @rule(node=st.sampled_from(NODES))
    def cut_off(self, node: str) -> None:
        self.fleet.cut_off(node)

    @rule(node=st.sampled_from(NODES))
    def heal(self, node: str) -> None:
        self.fleet.heal(node)

    @precondition(lambda self: len(self.fleet.cut) < len(NODES))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A replica's process fails for good on a connected node (restarts used up)."""
        candidates = sorted(
            (node_id, task_id)
            for node_id in NODES
            if node_id not in self.fleet.cut
            for task_id, copy in self.fleet.copies[node_id].items()
            if copy.state is TaskState.RUNNING and parse_replica_id(task_id) is not None
        )
        if not candidates:
            return
        node_id, task_id = data.draw(st.sampled_from(candidates))
        self.fleet.copies[node_id][task_id].state = TaskState.FAILED
        self.fleet.step()

    @rule(dt=st.sampled_from([0.5, 3.0, GRACE_S + 1.0, 40.0]))
    def time_passes(self, dt: float) -> None:
        self.fleet.time_passes(dt)

    # --- what must hold ------------------------------------------------------------------

    @invariant()
    def never_below_min(self) -> None:
        slots = self.active_slots()
        assert len(slots) >= MIN, (slots, self.fleet.copies)

    def settle(self) -> None:
        for node_id in sorted(self.fleet.cut):
            self.fleet.heal(node_id)
        for _ in range(16):  # rollouts one slot at a time, each healthy after 2 s
            for node_id in NODES:
                for copy in self.fleet.copies[node_id].values():
                    if copy.state in (TaskState.PREEMPTED, TaskState.ACCEPTED):
                        copy.state = TaskState.RUNNING
            self.fleet.clock.now += 3.0
            self.fleet.step()

    def check_settled(self) -> None:
        self.settle()
        running = self.running()
        refs = [parse_replica_id(t) for t in running]
        assert all(r is not None for r in refs), running
        slots = Counter(r.slot for r in refs if r is not None)
        assert sorted(slots) == list(range(self.replicas)), (running, self.replicas)
        assert set(slots.values()) == {1}, running
        view = self.fleet.engine.services.view("web")
        assert view is not None
        if not view["rollout"]["stalled"]:  # (crashes of the new template stall it)
            revision = web(self.replicas, self.command).revision
            assert {r.revision for r in refs if r is not None} == {revision}, running
        assert view["replicas"] == self.replicas
        assert view["running"] == self.replicas, view
        per_node = Counter(
            n
            for n in NODES
            for t, c in self.fleet.copies[n].items()
            if c.state is TaskState.RUNNING
        )
        assert max(per_node.values()) <= 3, per_node  # the spread's bound


class ServicesSettled(Services):
    def teardown(self) -> None:
        try:
            self.check_settled()
        finally:
            super().teardown()


ServicesSettled.TestCase.settings = settings(
    max_examples=600 if SLOW else 40,
    stateful_step_count=40 if SLOW else 20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_replicas_stay_at_the_count_through_cuts_scaling_and_rollouts = ServicesSettled.TestCase


def test_scaled_down_while_a_node_is_cut_off_the_heal_stops_its_excess() -> None:
    """Six replicas over three nodes; one node is cut off and central scales to three while
    it is: on heal, that node's replicas of slots 3-5 stop and exactly slots 0-2 run."""
    machine = Services()
    try:
        machine.scale(6)
        node = next(n for n in NODES if any(
            (r := parse_replica_id(t)) is not None and r.slot >= 3
            for t in machine.fleet.copies[n]))  # fmt: skip
        machine.cut_off(node)
        machine.scale(3)
        held = [t for t, c in machine.fleet.copies[node].items() if c.state is TaskState.RUNNING]
        held_slots = [r.slot for t in held if (r := parse_replica_id(t)) is not None]
        assert any(slot >= 3 for slot in held_slots), held
        machine.heal(node)
        slots = sorted(r.slot for t in machine.running() if (r := parse_replica_id(t)))
        assert slots == [0, 1, 2]
        events = [e.detail for e in machine.fleet.engine.events if e.kind == "replica-stopped"]
        assert any("scaled to 3" in d for d in events)
    finally:
        machine.teardown()


def test_the_autoscaler_follows_the_reported_load_and_waits_to_scale_in() -> None:
    """Load reported at central's API scales the service out at once (step limits aside) and
    in only after the scale-in delay, a step at a time; each decision says why."""
    fleet = Fleet()
    try:
        spec = ServiceSpec.from_json(
            {
                "name": "api",
                "template": {"command": ["srv"], "cpu": 0.5},
                "replicas": 1,
                "min": 1,
                "max": 6,
                "autoscale": {
                    "metric": "load", "target_per_replica": 1.0, "scale_in_delay_s": 60.0,
                    "max_step_out": 4, "max_step_in": 1,
                },
            }
        )  # fmt: skip
        engine = fleet.engine
        asyncio.run(engine.apply_service(spec))
        fleet.step()

        def report(cores: float) -> None:
            asyncio.run(engine.report_service_load("api", cores))
            fleet.clock.now += 16.0  # (a decision every 15 s)
            fleet.step()

        report(3.5)
        view = engine.services.view("api")
        assert view is not None and view["replicas"] == 4 and view["running"] == 4, view
        assert view["reason"].startswith("load: 1 -> 4 replicas (load 3.50 cores"), view["reason"]
        report(0.5)
        assert engine.services.view("api")["replicas"] == 4  # type: ignore[index]
        for _ in range(2):
            report(0.5)  # decided at t=48 and t=64: the want of 4 (t=16) is within 60 s
        assert engine.services.view("api")["replicas"] == 4  # type: ignore[index]
        report(0.5)  # t=80: every want of the last 60 s was 1: one step in
        assert engine.services.view("api")["replicas"] == 3  # type: ignore[index]
        report(0.5)  # t=96: and the next
        view = engine.services.view("api")
        assert view is not None and view["replicas"] == 2 and view["running"] == 2, view
        scaled = [e.detail for e in engine.events if e.kind == "scaled"]
        assert scaled[-2].startswith("api: load: 4 -> 3 replicas"), scaled
        assert "wanted at most 1 for 60 s" in scaled[-1], scaled
    finally:
        fleet.teardown()


def test_energy_consolidation_migrates_replicas_make_before_break() -> None:
    """In energy mode with parking on, the core drains lightly used nodes of migratable work:
    a service's replicas are moved (the target runs the copy before the source stops its
    own); a service spread across nodes is left spread."""
    fleet = Fleet()
    try:
        engine = fleet.engine

        def service(name: str, spread: dict[str, object]) -> None:
            body = {"name": name, "template": {"command": ["srv"], "cpu": 1.0},
                    "replicas": 2, "spread": spread}  # fmt: skip
            asyncio.run(engine.apply_service(ServiceSpec.from_json(body)))
            fleet.step()

        service("web", {})
        service("kept", {"across": ["node"]})
        where = {t: n for n in NODES for t, c in fleet.copies[n].items()}
        web = sorted(t for t in where if t.startswith("web."))
        assert len({where[t] for t in web}) == 2, where  # priority mode spread them

        policy = replace(engine.config.policy, mode=PolicyMode.ENERGY, min_spare_cpu=0.0)
        engine.config = replace(engine.config, policy=policy)
        engine.central = replace(engine.central, park_nodes=True)
        for _ in range(4):
            fleet.clock.now += 6.0  # (the power stage runs every 5 s)
            fleet.step(rounds=3)
        running = {
            t: n for n in NODES for t, c in fleet.copies[n].items() if c.state is TaskState.RUNNING
        }
        assert len({running[t] for t in web}) == 1, running  # moved together
        kept = sorted(t for t in running if t.startswith("kept."))
        assert len(kept) == 2 and len({running[t] for t in kept}) == 2, running  # still apart
        moved = [e.detail for e in engine.events if e.kind == "migrated"]
        assert moved and all("consolidate: drain" in d for d in moved), moved
        assert not any(d.startswith("kept.") for d in moved), moved
        for task_id in web:  # the source copy stopped only after the target ran it
            copies = [c for n in NODES if (c := fleet.copies[n].get(task_id)) is not None]
            assert sorted(c.state.value for c in copies) in (
                ["running"],
                ["cancelled", "running"],
            ), copies
        view = engine.services.view("web")
        assert view is not None and view["running"] == 2, view
    finally:
        fleet.teardown()


def test_a_spread_that_a_failover_skewed_is_evened_out_after_the_heal() -> None:
    """Three replicas spread across three nodes; one node is cut off and its replica fails
    over onto another (2/1/0). After the heal the reconcile keeps one copy, and the service's
    spread is evened out again by a make-before-break migration to the healed node (1/1/1)."""
    fleet = Fleet()
    try:
        engine = fleet.engine
        body = {"name": "web", "template": {"command": ["srv"], "cpu": 1.0}, "replicas": 3,
                "spread": {"across": ["node"]}}  # fmt: skip
        asyncio.run(engine.apply_service(ServiceSpec.from_json(body)))
        fleet.step()

        def running() -> Counter[str]:
            return Counter(
                n for n in NODES for c in fleet.copies[n].values() if c.state is TaskState.RUNNING
            )

        assert sorted(running().values()) == [1, 1, 1]
        fleet.cut_off("gw-a")
        fleet.time_passes(GRACE_S + 1.0)  # its replica fails over
        fleet.heal("gw-a")
        for _ in range(6):
            fleet.time_passes(3.0)
        assert sorted(running().values()) == [1, 1, 1], fleet.copies
        moved = [e.detail for e in engine.events if e.kind == "migrated"]
        assert any("rebalance: node" in d and "-> gw-a" in d for d in moved), moved
        view = engine.services.view("web")
        assert view is not None and view["running"] == 3, view
    finally:
        fleet.teardown()


def test_huge_cpu_requests_keep_the_fleet_sample_finite() -> None:
    """Tasks asking 1e308 cores each (finite, so accepted, and never placed) summed to
    infinity in the fleet's demand, which GET /v1/fleet then served as JSON's non-standard
    Infinity (the schemathesis fuzzer found it through a service's replicas)."""
    fleet = Fleet()
    try:
        for i in range(3):
            spec = TaskSpec(id=f"huge-{i}", command=("x",), cpu=1.2e308)
            fleet.engine._pending(spec, None, 1, "accepted")
        fleet.step()
        sample = fleet.engine.fleet_sample()
        assert sample.demand_cpu == 1e9, sample  # (capped per class)
        json.dumps(sample.to_json(), allow_nan=False)  # (standard JSON)
    finally:
        fleet.teardown()
