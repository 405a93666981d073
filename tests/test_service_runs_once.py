"""Failover, reconcile and migrate never leave a service running nowhere, nor twice (issue 14).

A hypothesis state machine drives central's real engine (:class:`CentralEngine`: its control
step places, fails over past the grace, settles copies placed twice, finishes migrations and
re-places what was not taken up) over three nodes modelled by the rules the edge engine
follows (``EdgeEngine._follow_policy`` and ``_follow_assignment``):

- a connected node takes every assignment to it: a new task, a newer epoch of a copy it runs
  (kept running), a newer epoch of a copy that finished here (run again); it cancels its copy
  on an inactive assignment and on a stop order naming its copy's epoch;
- a node cut off hears nothing and tells nothing (central sees it offline since the cut),
  but keeps running what it runs;
- locally, whatever the link: local work preempts a copy, a service's process exits (the node
  restarts it: restart=always) and a preempted or restarting copy runs again.

Rules fire in random orders (cut, heal, preempt, exit, resume, migrate, cancel, time passing).
At the end every node is healed and its copies resume; after central and the nodes have
settled, every service not cancelled runs on exactly one node, and central's view of it says
so (``running_on`` is that one node, its phase running); a cancelled one runs nowhere.

The nodes write their reports through central's replicas of their documents (as
``bench/bench_control_step.py`` does): the sync protocol is tested elsewhere; this is the
scheduling logic of both tiers, interleaved.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edgesched.central.engine import CentralEngine, TaskRefused
from edgesched.central.liveness import NodeStatus
from edgesched.config import parse_config
from edgesched.core.model import Arch, ServerClass
from edgesched.core.task import RestartPolicy, TaskSpec, TaskState
from edgesched.policies.models import ActiveModels
from edgesched.sync.doc import NodeDoc, PolicyDoc, client_id_for
from edgesched.sync.schema import AssignmentRef, Registration, TaskReport

NODES = ("gw-a", "gw-b", "gw-c")
SERVICES = ("svc-0", "svc-1", "svc-2")
GRACE_S = 10.0
SLOW = os.environ.get("EDGESCHED_SLOW") == "1"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class NoJournal:
    """The fleet document's journal: persistence is not what this test is about."""

    async def flushed(self) -> None:
        return None


@dataclass
class Copy:
    """A node's copy of a task, as the edge engine holds it."""

    state: TaskState
    epoch: int
    restarts: int = 0


ACTIVE = (TaskState.RUNNING, TaskState.PREEMPTED, TaskState.ACCEPTED)


class Fleet(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.clock = Clock()
        config = parse_config(
            {
                "central": {
                    "central_id": "central",
                    "state_dir": self.tmp.name,
                    "failover_after_s": GRACE_S,
                    "silent_after_s": 0.0,  # (no messages here: silence means nothing)
                    "take_up_s": 30.0,
                }
            }
        )
        engine = CentralEngine(config, clock=self.clock)
        engine.models = ActiveModels(
            Path(self.tmp.name) / "models",
            {
                "forecast": engine.central.forecast_model,
                "placement": engine.central.placement_model,
            },
        )
        engine.policy = PolicyDoc("policy", client_id_for("central"))
        engine.fleet = PolicyDoc("fleet", client_id_for("central"))
        engine.fleet.packed = True
        engine.fleet.track_changes("assignments", "stops", "power")
        engine._fleet_journal = NoJournal()  # type: ignore[assignment]
        registration = Registration(
            arch=Arch.X86_64, server_class=ServerClass.GENERAL, cpu=8, mem_gib=16
        )
        for node_id in NODES:
            doc = NodeDoc(f"node-{node_id}", engine.replicas.client_id)
            doc.set_registration(registration)
            engine.replicas.add(node_id, doc)
            self._set_status(engine, node_id, "online")
        self.engine = engine
        self.copies: dict[str, dict[str, Copy]] = {n: {} for n in NODES}
        self.cut: set[str] = set()
        self.submitted: list[str] = []
        self.cancelled: set[str] = set()
        self.step()

    def teardown(self) -> None:
        self.tmp.cleanup()

    # --- the two tiers ------------------------------------------------------------------------

    def _set_status(self, engine: CentralEngine, node_id: str, state: str) -> None:
        status = NodeStatus(state, self.clock.now)
        engine.liveness.nodes[node_id] = status
        engine._node_status_changed(node_id, status)

    def report(self, node_id: str) -> None:
        """The node's copies into its document (central's replica of it), and fresh."""
        replica = self.engine.replicas.replicas[node_id]
        for task_id, copy in self.copies[node_id].items():
            held = replica.doc.task(task_id)
            if (
                held is not None
                and (held.state, held.assignment)
                == (
                    copy.state,
                    AssignmentRef("central", copy.epoch),
                )
                and held.restarts == copy.restarts
            ):
                continue
            replica.doc.put_task(
                task_id,
                TaskReport(
                    state=copy.state,
                    updated_at=self.clock.now,
                    cpu=1.0,
                    restarts=copy.restarts,
                    started_at=self.clock.now if copy.state is TaskState.RUNNING else None,
                    assignment=AssignmentRef("central", copy.epoch),
                ),
            )
        replica.peer.synced_at[node_id] = self.clock.now  # (its full answer: fresh)
        self.engine._replica_changed(node_id)

    def follow(self, node_id: str) -> None:
        """What EdgeEngine._follow_policy does with central's assignments and stop orders."""
        fleet = self.engine.fleet
        assert fleet is not None
        copies = self.copies[node_id]
        for task_id, entry in fleet.assignments().items():
            if entry.node != node_id:
                continue
            copy = copies.get(task_id)
            if not entry.active:
                if copy is not None and not copy.state.terminal:
                    copy.state = TaskState.CANCELLED
                continue
            if copy is None:
                copies[task_id] = Copy(TaskState.RUNNING, entry.epoch)
            elif copy.epoch < entry.epoch and not copy.state.terminal:
                copy.epoch = entry.epoch  # kept (by a reconcile, a migration back)
            elif copy.epoch < entry.epoch:
                copies[task_id] = Copy(TaskState.RUNNING, entry.epoch)  # run again
        for key, order in fleet.stops().items():
            task_id, _, target = key.rpartition("@")
            copy = copies.get(task_id)
            if (
                target == node_id
                and copy is not None
                and not copy.state.terminal
                and copy.epoch == order.epoch
            ):
                copy.state = TaskState.CANCELLED

    def step(self, rounds: int = 2) -> None:
        """Central's step, then ``rounds`` exchanges: every connected node hears central and
        reports, and central steps on what it heard (two: a report, central's stop order
        on it, the node following that order)."""
        self.engine.control_step()
        for _ in range(rounds):
            for node_id in NODES:
                if node_id not in self.cut:
                    self.follow(node_id)
                    self.report(node_id)
            self.engine.control_step()

    def copy_of(self, node_id: str, task_id: str) -> Copy | None:
        return self.copies[node_id].get(task_id)

    # --- rules --------------------------------------------------------------------------------

    @precondition(lambda self: len(self.submitted) < len(SERVICES))
    @rule()
    def submit(self) -> None:
        task_id = SERVICES[len(self.submitted)]
        spec = TaskSpec(id=task_id, command=("sleep", "1d"), cpu=1.0, restart=RestartPolicy.ALWAYS)
        self.engine._pending(spec, None, 1, "accepted")
        self.submitted.append(task_id)
        self.step()

    @rule(node=st.sampled_from(NODES))
    def cut_off(self, node: str) -> None:
        if node in self.cut:
            return
        self.cut.add(node)
        self._set_status(self.engine, node, "offline")
        self.step()

    @rule(node=st.sampled_from(NODES))
    def heal(self, node: str) -> None:
        if node not in self.cut:
            return
        self.cut.discard(node)
        self._set_status(self.engine, node, "online")
        self.step()

    @rule(node=st.sampled_from(NODES), task=st.sampled_from(SERVICES))
    def preempt(self, node: str, task: str) -> None:
        copy = self.copy_of(node, task)
        if copy is not None and copy.state is TaskState.RUNNING:
            copy.state = TaskState.PREEMPTED  # local work took its cores
            self.step()

    @rule(node=st.sampled_from(NODES), task=st.sampled_from(SERVICES))
    def exit_and_restart(self, node: str, task: str) -> None:
        copy = self.copy_of(node, task)
        if copy is not None and copy.state is TaskState.RUNNING:
            copy.state = TaskState.ACCEPTED  # exited; restart=always: waits out its backoff
            copy.restarts += 1
            self.step()

    @rule(node=st.sampled_from(NODES), task=st.sampled_from(SERVICES))
    def resume(self, node: str, task: str) -> None:
        copy = self.copy_of(node, task)
        if copy is not None and copy.state in (TaskState.PREEMPTED, TaskState.ACCEPTED):
            copy.state = TaskState.RUNNING
            self.step()

    @rule(task=st.sampled_from(SERVICES), to=st.sampled_from(NODES))
    def migrate(self, task: str, to: str) -> None:
        if task not in self.submitted or to in self.cut:
            return
        try:
            asyncio.run(self.engine.migrate(task, to))
        except TaskRefused:
            return  # (not active, already there, cannot run there: refused, nothing moved)
        self.step()

    @rule(task=st.sampled_from(SERVICES))
    def cancel(self, task: str) -> None:
        if task not in self.submitted or task in self.cancelled:
            return
        try:
            asyncio.run(self.engine.cancel(task))
        except TaskRefused:
            return
        self.cancelled.add(task)
        self.step()

    @rule(dt=st.sampled_from([0.5, 3.0, GRACE_S + 1.0, 40.0]))
    def time_passes(self, dt: float) -> None:
        self.clock.now += dt
        self.step()

    # --- what must hold -----------------------------------------------------------------------

    @invariant()
    def a_cancelled_service_runs_nowhere_central_hears(self) -> None:
        for task_id in self.cancelled:
            for node_id in NODES:
                copy = self.copy_of(node_id, task_id)
                if node_id not in self.cut and copy is not None:
                    assert copy.state not in ACTIVE, (task_id, node_id, copy)

    def teardown_check(self) -> None:
        """Heal everything, let local work end, settle; then each service runs once."""
        for node_id in sorted(self.cut):
            self.heal(node_id)
        for _ in range(12):
            for node_id in NODES:
                for copy in self.copies[node_id].values():
                    if copy.state in (TaskState.PREEMPTED, TaskState.ACCEPTED):
                        copy.state = TaskState.RUNNING
            self.clock.now += 5.0
            self.step()
        for task_id in self.submitted:
            running = sorted(
                n
                for n in NODES
                if (c := self.copy_of(n, task_id)) is not None and c.state is TaskState.RUNNING
            )
            entry = self.engine.index.assignments.get(task_id)
            assert entry is not None
            view = self.engine.task_view(task_id, entry)
            if task_id in self.cancelled:
                assert running == [], (task_id, running, self.copies)
                assert view["phase"] == "cancelled", view
            else:
                assert len(running) == 1, (task_id, running, self.copies, view)
                assert view["running_on"] == running, (view, running)
                assert view["phase"] == "running", view


class FleetSettled(Fleet):
    """The machine, with the end-state check run once every rule sequence is over."""

    def teardown(self) -> None:
        try:
            self.teardown_check()
        finally:
            super().teardown()


FleetSettled.TestCase.settings = settings(
    max_examples=1000 if SLOW else 60,
    stateful_step_count=50 if SLOW else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_every_live_service_runs_exactly_once = FleetSettled.TestCase


def test_a_service_cancelled_after_its_failover_stops_on_the_healed_node() -> None:
    """What the machine found first: gw-a is cut, its service fails over to gw-b, the
    operator cancels it; gw-b cancels its copy, but gw-a, healed, follows no assignment of
    its own any more. Central orders its copy stopped ("cancelled at central")."""
    fleet = Fleet()
    try:
        fleet.submit()
        (first,) = [n for n in NODES if fleet.copy_of(n, "svc-0") is not None]
        fleet.cut_off(first)
        fleet.time_passes(GRACE_S + 1.0)
        (second,) = [n for n in NODES if n != first and fleet.copy_of(n, "svc-0") is not None]
        fleet.cancel("svc-0")
        assert fleet.copies[second]["svc-0"].state is TaskState.CANCELLED
        assert fleet.copies[first]["svc-0"].state is TaskState.RUNNING  # cut off: not heard
        fleet.heal(first)
        assert fleet.copies[first]["svc-0"].state is TaskState.CANCELLED
        assert fleet.engine.fleet is not None
        stop = fleet.engine.fleet.stops().get(f"svc-0@{first}")
        assert stop is None or stop.reason == "cancelled at central"  # (dropped once done)
        assert any("stop their copies" in e.detail for e in fleet.engine.events)
    finally:
        fleet.teardown()
