"""The central engine: the fleet's replicas, its liveness, its heartbeat and its API.

``edgesched central run --config central.toml``. One MQTT connection (a
:class:`~edgesched.sync.session.MqttSession` as ``central_id``) carries every channel:

* :class:`~edgesched.central.heartbeat.Heartbeat`: the nodes' lease on central;
* :class:`~edgesched.central.liveness.Liveness`: retained status and last wills;
* :class:`~edgesched.central.replicas.NodeReplicas`: a vetted replica of every node's
  document (fan-in), discovered as nodes speak, snapshotted to SQLite;
* the policy document (desired state), which central writes (journaled to SQLite before
  anything leaves) and the nodes follow: the assignments of tasks submitted at central, and
  the stop orders of the reconcile rule.

The control loop (every ``cycle_s``, or as soon as a replica or a node's status changes)
places waiting tasks, fails services over from nodes offline past ``failover_after_s``, and
settles tasks placed twice by the pure rule of :mod:`edgesched.central.placement`. The
forecast loop samples what each workload class asks of the fleet and forecasts the next 15
minutes with the per-class ONNX model; ``learned`` mode places with the ONNX score, and an
admin swaps either model for the whole fleet through the policy document
(:mod:`edgesched.policies.models`). Loops run
in one ``asyncio.TaskGroup`` owned by :meth:`CentralEngine.run`; :meth:`stop` ends them,
saves the replicas and closes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgesched.central.heartbeat import CentralPeers, Heartbeat
from edgesched.central.liveness import Liveness, NodeStatus
from edgesched.central.metrics import CentralMetrics
from edgesched.central.placement import (
    FleetView,
    assignment_entry,
    failovers,
    fleet_view,
    place,
    prunable,
    reconcile,
)
from edgesched.central.power import PARKED, power_orders, reported, with_power
from edgesched.central.replicas import NodeReplicas
from edgesched.central.telemetry import TelemetryCollector
from edgesched.config import EdgeschedConfig, builtin_profiles
from edgesched.core.classdemand import ClassDemand
from edgesched.core.model import Node, Placement
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.task import TaskSpec
from edgesched.policies.models import ActiveModels, ModelBlob
from edgesched.policies.ortsession import ModelLoadError
from edgesched.rest.server import ApiStarter
from edgesched.sync.doc import PolicyDoc, client_id_for
from edgesched.sync.journal import DocJournal
from edgesched.sync.peer import DocPeer
from edgesched.sync.reconcile import ReconcilePolicy
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentState,
    ModelEntry,
    PowerOrder,
    StopOrder,
    TaskReport,
    TidalEntry,
)
from edgesched.sync.session import MqttSession, wait_event
from edgesched.sync.store import Store, StoreError

POLICY_DOC = "policy"
MAX_EVENTS = 1000
#: How often central samples what each workload class asks of the fleet (5-minute bins).
DEMAND_SAMPLE_S = 5.0
#: How often the leader looks for finished assignments to forget.
PRUNE_EVERY_S = 60.0


class TaskRefused(Exception):
    """A submission or cancel refused; ``status`` is the HTTP status, ``field`` what was wrong."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status = status
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Event:
    """Something the fleet did that an operator wants on a timeline."""

    at: float
    kind: str  # node-online, node-offline, placed, failover, reconciled, cancelled, ...
    detail: str
    node: str | None = None
    task: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "detail": self.detail,
            "node": self.node,
            "task": self.task,
        }


log = logging.getLogger("edgesched.central.engine")


class CentralEngine:
    """Owns central's store, its MQTT session and the loops that keep the fleet view."""

    def __init__(
        self,
        config: EdgeschedConfig,
        *,
        clock: Callable[[], float] = time.time,
        api: ApiStarter[CentralEngine] | None = None,
    ) -> None:
        """``api`` starts central's HTTP API once the engine is up (``edgesched.serve`` wires
        in :func:`edgesched.central.api.serve`); without it the engine serves no API."""
        self.config = config
        self._api = api
        self.central = config.central
        self.state_dir = Path(self.central.state_dir)
        self.clock = clock
        self.metrics = CentralMetrics()
        self._endpoint = self.central.mqtt.endpoint(self.central.central_id)  # files read now
        self.session = MqttSession(
            self._endpoint,
            backoff_initial_s=min(0.5, self.central.mqtt.reconnect_max_s),
            backoff_max_s=self.central.mqtt.reconnect_max_s,
        )
        self.heartbeat = Heartbeat(self.central.central_id, self.central.heartbeat_s, clock)
        self.peers = CentralPeers(self.central.central_id, 3 * self.central.heartbeat_s, clock)
        self._was_leader: bool | None = None
        self.liveness = Liveness(clock, site_of=self._site_of)
        self.telemetry = TelemetryCollector()
        self.replicas = NodeReplicas(
            self.central.central_id,
            self.session,
            nodes=self.central.nodes,
            centrals=self.central.peers,
            clock=clock,
        )
        self.session.fallback = self.replicas
        self.session.add(self.heartbeat)
        self.session.add(self.peers)
        self.session.add(self.liveness)
        self.session.add(self.telemetry)
        self.reconcile_policy = ReconcilePolicy(self.central.reconcile)
        self.policy: PolicyDoc | None = None
        self._tidal_name = "config"  # the [policy] tidal of the config file until switched
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self.api_port: int | None = None
        self.started_at = clock()
        self._journal: DocJournal | None = None
        self._store: Store | None = None
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one control step or submission at a time
        self.liveness.on_change = self._node_status_changed
        self.replicas.on_change = lambda _node: self._wake.set()
        self.models: ActiveModels | None = None  # loaded in run(): onnxruntime is slow to import
        self.demand = ClassDemand()  # what each workload class asks of the fleet, 5-min bins
        self.forecast_cpu: float | None = None
        self._pruned_at = 0.0

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("central engine not started")
        return self._store

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Restore the replicas from SQLite, then serve until :meth:`stop`."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._store = await Store.open(self.state_dir / "central.db")
        fallbacks = self.metrics.model_fallbacks
        try:
            self.models = ActiveModels(
                self.state_dir / "models",
                {
                    "forecast": self.central.forecast_model,
                    "placement": self.central.placement_model,
                },
                on_event=lambda kind, stage: fallbacks.labels(kind, stage).inc(),
            )
            await self._seed_demand()
            self.replicas.store = self._store
            restored = await self.replicas.load()
            log.info("central %s: %d node replicas restored", self.central.central_id, restored)
            await self._open_policy()
            async with asyncio.TaskGroup() as group:
                runner = None if self._api is None else await self._api(self)
                loops: list[asyncio.Task[None]] = []
                try:
                    loops = [
                        group.create_task(_need(self._journal).run(), name="policy-log"),
                        group.create_task(self.session.run(), name="mqtt"),
                        group.create_task(self._snapshot_loop(), name="snapshots"),
                        group.create_task(self._control_loop(), name="control"),
                        group.create_task(self._forecast_loop(), name="forecast"),
                    ]
                    self._ready.set()
                    log.info(
                        "central %s up: broker %s:%d, API on %s:%s",
                        self.central.central_id,
                        self._endpoint.host,
                        self._endpoint.port,
                        self.central.api_host,
                        self.api_port,
                    )
                    log.info(
                        "dashboard: http://%s:%s/dashboard/#token=<the token in %s>",
                        self.central.api_host,
                        self.api_port,
                        self.state_dir / "api-token-read",
                    )
                    await self._stop.wait()
                    with contextlib.suppress(TimeoutError):  # journal what is queued
                        async with asyncio.timeout(5.0):
                            await _need(self._journal).flushed()
                finally:
                    for task in loops:
                        task.cancel()
                    if runner is not None:
                        await runner.cleanup()
            await self.replicas.persist_changed()
        finally:
            await self.store.close()
            log.info("central %s stopped", self.central.central_id)

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.central.snapshot_s)
            written = await self.replicas.persist_changed()
            if written:
                self.metrics.snapshots.inc(written)

    async def _open_policy(self) -> None:
        """Central's policy document, rebuilt from SQLite; journaled; synced as a channel."""
        client_id = client_id_for(self.central.central_id)
        self.policy = await PolicyDoc.load_from(self.store, POLICY_DOC, client_id)
        self._adopt_policy()
        self.policy.on_remote_change(lambda _sender: self._adopt_policy())  # a peer switched
        self._journal = DocJournal(self.policy, self.store)
        writers = {client_id} | {client_id_for(p) for p in self.central.peers}
        self.session.add(
            DocPeer(
                self.policy,
                self.central.central_id,
                before_publish=self._journal.flushed,  # on disk before it leaves
                writers=frozenset(writers),
                subscribe=False,  # the replicas' wildcard subscription carries it
            )
        )

    def _event(
        self, kind: str, detail: str, *, node: str | None = None, task: str | None = None
    ) -> None:
        event = Event(self.clock(), kind, detail, node, task)
        self.events.append(event)
        self.metrics.events.labels(kind).inc()
        log.info("%s: %s", kind, detail)

    def _node_status_changed(self, node_id: str, status: NodeStatus) -> None:
        self._event(f"node-{status.state}", f"{node_id} is {status.state}", node=node_id)
        replica = self.replicas.replicas.get(node_id)
        allowed = not self.central.nodes or node_id in self.central.nodes
        if replica is None and allowed:
            # Only the node writes its status topic (the ACL), so this is the node speaking:
            # hold its document now, and our first step 1 asks it for everything. A node
            # whose document does not change would otherwise never be heard of.
            replica = self.replicas.add(node_id)
        if status.state == "online" and replica is not None:
            replica.peer.request_resync()  # its answer makes the replica fresh again
        self._wake.set()

    def _site_of(self, node_id: str) -> str | None:
        """The site a node registered (None until its document says)."""
        replica = self.replicas.replicas.get(node_id)
        if replica is None:
            return None
        registration = replica.doc.registration()
        return None if registration is None else registration.site

    def is_fresh(self, node_id: str) -> bool:
        """Whether the node's replica is current: online, and a full resync answered since."""
        replica = self.replicas.replicas.get(node_id)
        status = self.liveness.nodes.get(node_id)
        if replica is None or status is None or status.state != "online":
            return False
        synced = replica.peer.synced_at.get(node_id)
        return synced is not None and synced >= status.since

    def fresh_nodes(self) -> set[str]:
        return {n for n in self.replicas.replicas if self.is_fresh(n)}

    # --- tasks submitted at central -------------------------------------------------------

    def _view(self) -> FleetView:
        """The fleet as central sees it now, with assignments their node has not reported yet
        counted on it (so a burst of submissions does not pile onto one node)."""
        docs = self.replicas.views()
        status = {n: self.liveness.state(n) for n in docs}
        view = fleet_view(docs, status, self.clock())
        # Parked and waking nodes are no placement targets (the core sees their state).
        view = with_power(view, {n: reported(c) for n, c in docs.items()}, self._orders())
        # Reported in any state: a task its node has finished no longer holds anything there.
        extra = []
        for task_id, entry in _need(self.policy).assignments().items():
            node = docs.get(entry.node)
            if not entry.active or (node is not None and task_id in node.tasks):
                continue
            extra.append(Placement(entry.task_spec.to_task(view.now), entry.node, view.now))
        return FleetView(view.nodes, view.placements + tuple(extra), view.now, view.unusable)

    async def submit(self, spec: TaskSpec, pin: str | None = None) -> dict[str, Any]:
        """Accept a task: placed now if a node can take it, else waiting (state ``pending``).
        Journaled to SQLite before this returns."""
        policy = _need(self.policy)
        async with self._lock:
            if policy.assignment(spec.id) is not None:
                raise TaskRefused(409, "id", f"task {spec.id!r} already exists")
            if pin is not None and pin not in self.replicas.replicas:
                raise TaskRefused(422, "node", f"no node {pin!r} is known to central")
            if self.peers.is_leader():
                self._place(spec, pin=pin, epoch=1, replacement=False)
            else:  # the leading central replica places it
                leader = self.peers.leader()
                self._pending(
                    spec, pin, 1, f"accepted by {self.central.central_id}; {leader} leads"
                )
        await _need(self._journal).flushed()
        self._wake.set()
        entry = policy.assignment(spec.id)
        assert entry is not None
        return self.task_view(spec.id, entry)

    def _place(
        self,
        spec: TaskSpec,
        *,
        pin: str | None,
        epoch: int,
        replacement: bool,
        view: FleetView | None = None,
    ) -> str | None:
        choice = place(spec, self._view() if view is None else view, self._policy_config(), pin=pin)
        now = self.clock()
        policy = _need(self.policy)
        if choice.node_id is None:
            self._pending(spec, pin, epoch, choice.reason)
            return None
        policy.assign(
            spec.id,
            assignment_entry(
                spec, choice.node_id, central=self.central.central_id, epoch=epoch,
                replacement=replacement, score=choice.score, at=now, reason=choice.reason,
            ),
        )  # fmt: skip
        self._event("placed", f"{spec.id} on {choice.node_id}: {choice.reason}",
                    node=choice.node_id, task=spec.id)  # fmt: skip
        return choice.node_id

    def _pending(self, spec: TaskSpec, pin: str | None, epoch: int, reason: str) -> None:
        entry = assignment_entry(
            spec, pin or "", central=self.central.central_id, epoch=epoch,
            replacement=False, score=0.0, at=self.clock(), reason=reason,
            state=AssignmentState.PENDING, pin=pin,
        )  # fmt: skip
        _need(self.policy).assign(spec.id, entry)

    async def migrate(self, task_id: str, target: str) -> dict[str, Any]:
        """Move an active task to ``target``: a new placement epoch there, and a stop order
        for the copy where it runs now (the node stops it when it hears; a cut-off node on
        heal). The target must be online and able to take it."""
        policy = _need(self.policy)
        async with self._lock:
            entry = policy.assignment(task_id)
            if entry is None:
                raise TaskRefused(404, "id", f"no task {task_id!r}")
            if not entry.active:
                raise TaskRefused(409, "id", f"task {task_id!r} is {entry.state}")
            source = entry.node
            if target == source:
                raise TaskRefused(409, "node", f"task {task_id!r} already runs on {target}")
            spec = entry.task_spec
            choice = place(spec, self._view(), self._policy_config(), pin=target)
            if choice.node_id is None:
                raise TaskRefused(422, "node", choice.reason)
            now = self.clock()
            epoch = entry.epoch
            policy.assign(
                task_id,
                assignment_entry(
                    spec, target, central=self.central.central_id, epoch=epoch + 1,
                    replacement=False, score=choice.score, at=now,
                    reason=f"migrated from {source} by the operator: {choice.reason}",
                ),
            )  # fmt: skip
            policy.order_stop(
                task_id,
                source,
                StopOrder(epoch=epoch, winner=target, at=now, reason=f"migrated to {target}"),
            )
            self._event("migrated", f"{task_id}: {source} -> {target}", node=target, task=task_id)
        await _need(self._journal).flushed()
        moved = policy.assignment(task_id)
        assert moved is not None
        return self.task_view(task_id, moved)

    async def cancel(self, task_id: str) -> dict[str, Any]:
        policy = _need(self.policy)
        async with self._lock:
            entry = policy.assignment(task_id)
            if entry is None:
                raise TaskRefused(404, "id", f"no task {task_id!r}")
            if entry.state is not AssignmentState.CANCELLED:
                policy.assign(
                    task_id, replace(entry, state=AssignmentState.CANCELLED, at=self.clock())
                )
                self._event("cancelled", f"{task_id} cancelled", task=task_id)
        await _need(self._journal).flushed()
        entry = policy.assignment(task_id)
        assert entry is not None
        return self.task_view(task_id, entry)

    def task_view(self, task_id: str, entry: AssignmentEntry) -> dict[str, Any]:
        """An assignment with what the nodes report of it (the copies, by node)."""
        copies: dict[str, TaskReport] = {}
        for node_id, replica in self.replicas.replicas.items():
            held = replica.doc.task(task_id)
            if held is not None and held.assignment is not None:
                copies[node_id] = held
        return {
            "id": task_id,
            "state": entry.state.value,
            "node": entry.node or None,
            "epoch": entry.epoch,
            "replacement": entry.replacement,
            "score": entry.score,
            "reason": entry.reason,
            "at": entry.at,
            "spec": entry.spec,
            "copies": {
                n: {
                    "state": c.state.value,
                    "epoch": c.assignment.epoch if c.assignment else None,
                    "updated_at": c.updated_at,
                }
                for n, c in copies.items()
            },
            "running_on": sorted(n for n, c in copies.items() if c.active),
        }

    # --- the control loop -----------------------------------------------------------------

    async def _control_loop(self) -> None:
        while True:
            await wait_event(self._wake, self.central.cycle_s)
            self._wake.clear()
            async with self._lock:
                self.control_step()

    def control_step(self) -> None:
        """Place waiting tasks, fail services over, settle tasks placed twice: the leading
        central replica only. Synchronous: every write lands in the policy document
        (journaled by its own task) at once."""
        leader = self.peers.is_leader()
        if leader != self._was_leader:
            self._was_leader = leader
            self._event("leader", f"{self.peers.leader()} leads the central replicas")
        if not leader:
            return
        policy = _need(self.policy)
        now = self.clock()
        view: FleetView | None = None  # built once per step (not per waiting task), then grown
        for _task_id, entry in sorted(policy.assignments().items()):
            if entry.state is not AssignmentState.PENDING:
                continue
            spec = entry.task_spec
            view = self._view() if view is None else view
            node = self._place(spec, pin=entry.pin or None, epoch=entry.epoch,
                               replacement=False, view=view)  # fmt: skip
            if node is not None:
                placed = Placement(spec.to_task(view.now), node, view.now)
                view = replace(view, placements=(*view.placements, placed))
        offline_since = {n: s.since for n, s in self.liveness.nodes.items() if s.state == "offline"}
        assignments = policy.assignments()
        for task_id in failovers(assignments, offline_since, now, self.central.failover_after_s):
            entry = assignments[task_id]
            spec = entry.task_spec
            old = entry.node
            choice = place(spec, self._view(), self._policy_config(), exclude=[old])
            if choice.node_id is None:
                continue  # nowhere to go: it stays with its node, which may come back
            epoch = entry.epoch + 1
            policy.assign(
                task_id,
                assignment_entry(
                    spec, choice.node_id, central=self.central.central_id, epoch=epoch,
                    replacement=True, score=choice.score, at=now,
                    reason=f"failed over from {old} (offline): {choice.reason}",
                ),
            )  # fmt: skip
            self._event("failover", f"{task_id}: {old} -> {choice.node_id} (epoch {epoch})",
                        node=choice.node_id, task=task_id)  # fmt: skip
        self._reconcile(now)
        if self.central.park_nodes:
            self._power_step()
        else:
            self._wake_parked(now)
        self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget assignments finished (or cancelled) longer than the retention ago."""
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        policy = _need(self.policy)
        docs = self.replicas.views()
        done = prunable(policy.assignments(), docs, now, self.central.assignment_retention_s)
        for task_id in done:
            policy.drop_assignment(task_id)
        if done:
            self._event("pruned", f"{len(done)} finished assignments forgotten")

    def _orders(self) -> dict[str, PowerOrder]:
        return _need(self.policy).power() if self.policy is not None else {}

    def _wake_parked(self, now: float) -> None:
        """Parking is off (or was turned off): wake any node still parked, once."""
        policy = _need(self.policy)
        orders = policy.power()
        for node_id, replica in self.replicas.replicas.items():
            report = reported(replica.doc.typed())
            standing = orders.get(node_id)
            if report.state == PARKED and (standing is None or standing.state != "active"):
                policy.set_power(
                    node_id, PowerOrder(state="active", reason="parking is off", at=now)
                )
                self._event("wake", f"{node_id}: parking is off", node=node_id)

    def _power_step(self) -> None:
        """Park idle nodes beyond what the forecast needs, wake nodes ahead of a peak or for
        waiting work (the core's power stage over the fleet; energy and learned modes)."""
        policy = _need(self.policy)
        docs = self.replicas.views()
        reports = {n: reported(c) for n, c in docs.items()}
        orders = policy.power()
        view = self._view()
        waiting = [
            entry.task_spec.to_task(view.now)
            for entry in policy.assignments().values()
            if entry.state is AssignmentState.PENDING
        ]
        config = self._policy_config()
        for order in power_orders(view, waiting, self.forecast_cpu, config, orders, reports):
            policy.set_power(order.node_id, order.to_order())
            verb = "park" if order.state == PARKED else "wake"
            self._event(verb, f"{order.node_id}: {order.reason}", node=order.node_id)

    def _reconcile(self, now: float) -> None:
        policy = _need(self.policy)
        docs = self.replicas.views()
        assignments = policy.assignments()
        stops = policy.stops()
        fresh = self.fresh_nodes()
        for settled in reconcile(assignments, docs, stops, self.reconcile_policy, fresh):
            best = settled.winner
            entry = assignments[settled.task_id]
            if entry.node != best.node_id:
                policy.assign(
                    settled.task_id,
                    replace(entry, node=best.node_id, epoch=entry.epoch + 1,
                            replacement=best.replacement, at=now,
                            reason=f"kept on {best.node_id} by {settled.policy.value}"),
                )  # fmt: skip
            for loser in settled.losers:
                policy.order_stop(
                    settled.task_id,
                    loser.node_id,
                    StopOrder(epoch=loser.epoch, winner=best.node_id, at=now,
                              reason=f"{best.node_id} keeps it ({settled.policy.value})"),
                )  # fmt: skip
            self._event(
                "reconciled",
                f"{settled.task_id} placed on {[c.node_id for c in (best, *settled.losers)]}: "
                f"{best.node_id} keeps it, "
                f"{', '.join(c.node_id for c in settled.losers)} stop ({settled.policy.value})",
                node=best.node_id,
                task=settled.task_id,
            )
        # Stop orders are done once the loser reports its copy no longer active.
        for key in stops:
            task_id, _, node_id = key.rpartition("@")
            node = docs.get(node_id)
            report = None if node is None else node.tasks.get(task_id)
            if node is not None and (report is None or not report.active):
                policy.drop_stop(task_id, node_id)

    # --- the 15-minute forecast and the models --------------------------------------------

    def _policy_config(self) -> PolicyConfig:
        """The fleet policy, with the placement model injected when in ``learned`` mode."""
        models: ActiveModels = _need(self.models)
        return models.policy(self.config.policy)

    async def _seed_demand(self) -> None:
        saved = await self.store.get_meta("class_demand")
        if saved:
            try:
                self.demand = ClassDemand.from_json(json.loads(saved))
            except ValueError as exc:
                log.error("dropping the saved demand history: %s", exc)

    async def _forecast_loop(self) -> None:
        while True:
            await asyncio.sleep(DEMAND_SAMPLE_S)
            async with self._lock:
                try:
                    closed = self.observe_demand()
                except ValueError as exc:  # a forecast is advice: never let it stop central
                    log.error("demand forecast skipped: %s", exc)
                    continue
            if closed:
                with contextlib.suppress(StoreError):
                    await self.store.set_meta("class_demand", json.dumps(self.demand.to_json()))

    def observe_demand(self) -> bool:
        """Sample what each workload class asks of the fleet now (CPU of its placed and
        waiting tasks); on each closed 5-minute bin, forecast the fleet's next 15 minutes with
        the per-class model. True when a bin closed."""
        view = self._view()
        asked: dict[str, float] = {}
        for p in view.placements:
            asked[p.task.workload] = asked.get(p.task.workload, 0.0) + p.task.demand.cpu
        for entry in _need(self.policy).assignments().values():
            if entry.state is AssignmentState.PENDING:
                spec = entry.task_spec
                asked[spec.workload] = asked.get(spec.workload, 0.0) + spec.cpu
        if not self.demand.observe(view.now, asked):
            return False
        capacity = sum(n.capacity.cpu for n in view.nodes)
        self.forecast_cpu = _need(self.models).peak(self.demand, capacity)
        if self.forecast_cpu is None:
            return True
        self.metrics.forecast.set(self.forecast_cpu)
        if self.forecast_cpu > capacity:
            self._event(
                "forecast",
                f"the next 15 minutes may ask {self.forecast_cpu:.1f} cores; "
                f"{capacity:.1f} are online",
            )
        return True

    def models_view(self) -> dict[str, Any]:
        """What central runs, what it published, and what each node reports running."""
        published = {
            kind: {k: v for k, v in entry.to_entry().items() if k != "data"}
            for kind, entry in _need(self.policy).models().items()
        }
        nodes: dict[str, Any] = {}
        for node_id, replica in sorted(self.replicas.replicas.items()):
            reports = replica.doc.model_reports()
            nodes[node_id] = {k: r.to_entry() for k, r in reports.items()} or None
        return {
            "central": _need(self.models).status(),
            "published": published,
            "nodes": nodes,
            "forecast": {
                "peak_cpu_next_15min": self.forecast_cpu,
                "classes": sorted(self.demand.bins),
            },
        }

    async def set_model(self, kind: str, data: bytes, name: str = "") -> dict[str, Any]:
        """Check an uploaded model against its contract, then publish it in the policy
        document: central swaps it in now, every node when it hears (cut-off ones on heal)."""
        models = _need(self.models)
        try:
            blob = ModelBlob.of(kind, data, name, self.clock())
            models.check(blob)
        except ModelLoadError as exc:
            models.on_event(kind, "swap")
            raise TaskRefused(422, "model", str(exc)) from None
        async with self._lock:
            _need(self.policy).set_model(kind, ModelEntry.from_entry(blob.to_entry()))
            models.swap(blob)
            self._event(
                "model", f"{kind} model {name or '?'} (sha256 {blob.sha256[:12]}) published"
            )
        await _need(self._journal).flushed()
        return self.models_view()

    # --- the fleet policy -----------------------------------------------------------------

    def policy_view(self) -> dict[str, Any]:
        policy = self.config.policy
        return {
            "mode": policy.mode.value,
            "tidal_profile": self._tidal_name,
            "tidal_windows": [w.name for w in policy.tidal.windows],
            "reconcile": self.reconcile_policy.value,
            "failover_after_s": self.central.failover_after_s,
        }

    async def set_policy(self, mode: str | None, tidal: str | None) -> dict[str, Any]:
        """Switch the mode and/or the tidal profile (by name) for central and every node: the
        change is written to the policy document, which cut-off nodes pick up on heal."""
        policy = self.config.policy
        if mode is not None:
            try:
                policy = replace(policy, mode=PolicyMode(mode))
            except ValueError:
                modes = ", ".join(m.value for m in PolicyMode)
                raise TaskRefused(422, "mode", f"must be one of {modes}") from None
        profiles = builtin_profiles()
        if tidal is not None:
            if tidal not in profiles:
                raise TaskRefused(422, "tidal_profile", f"must be one of {', '.join(profiles)}")
            policy = replace(policy, tidal=profiles[tidal])
        async with self._lock:
            doc = _need(self.policy)
            self.config = replace(self.config, policy=policy)
            if mode is not None:
                doc.set_mode(policy.mode)
            if tidal is not None:
                self._tidal_name = tidal
                doc.set_tidal(TidalEntry(profile=tidal))
            self._event("policy", f"mode {policy.mode.value}, tidal profile {self._tidal_name}")
        await _need(self._journal).flushed()
        return self.policy_view()

    def _adopt_policy(self) -> None:
        """At start: what the policy document says (set earlier, maybe by a peer) wins over
        the config file's [policy], so a restart does not undo a switch made at run time."""
        doc = _need(self.policy)
        policy = self.config.policy
        mode = doc.mode()
        if mode is not None:
            policy = replace(policy, mode=mode)
        tidal_entry = doc.tidal()
        tidal = None if tidal_entry is None else tidal_entry.profile
        if tidal is not None and tidal in builtin_profiles():
            policy = replace(policy, tidal=builtin_profiles()[tidal])
            self._tidal_name = tidal
        self.config = replace(self.config, policy=policy)
        if self.models is not None:  # a peer may have published a model
            self.models.follow({k: e.to_entry() for k, e in doc.models().items()})

    # --- the fleet for the Kubernetes extender --------------------------------------------

    def fleet_nodes(self) -> dict[str, Node]:
        return {n.id: n for n in self._view().nodes}

    def fleet_placements(self) -> tuple[Placement, ...]:
        return self._view().placements

    def node_state(self, node_id: str) -> str:
        """connected, suspect (offline less than failover_after_s), partitioned, dead (offline
        past dead_after_s), or unknown (no status heard yet)."""
        status = self.liveness.nodes.get(node_id)
        if status is None:
            return "unknown"
        if status.state == "online":
            return "connected"
        away = self.clock() - status.since
        if away < self.central.failover_after_s:
            return "suspect"
        return "partitioned" if away < self.central.dead_after_s else "dead"

    # --- views for the API ----------------------------------------------------------------

    def node_summary(self, node_id: str) -> dict[str, Any]:
        replica = self.replicas.replicas[node_id]
        doc = replica.doc
        tasks = doc.tasks()
        states: dict[str, int] = {}
        for report in tasks.values():
            states[report.state.value] = states.get(report.state.value, 0) + 1
        status = self.liveness.nodes.get(node_id)
        latest = self.telemetry.latest(node_id)
        heard = replica.peer.heard_at.get(node_id)
        return {
            "id": node_id,
            "status": self.liveness.state(node_id),
            "state": self.node_state(node_id),
            "status_since": None if status is None else status.since,
            "registration": None if (reg := doc.registration()) is None else reg.to_entry(),
            "document": {
                "epoch": doc.epoch,
                "content_hash": doc.content_hash(),
                "changed_at": replica.changed_at or None,
            },
            "tasks": states,
            "telemetry": None if latest is None else latest.to_json(),
            "sync": {
                "last_update_s_ago": None if heard is None else round(self.clock() - heard, 3),
                "fresh": self.is_fresh(node_id),
            },
        }

    def status(self) -> dict[str, Any]:
        peers = [r.peer.stats for r in self.replicas.replicas.values()]
        rejected = {
            key: sum(p[key] for p in peers)
            for key in ("rejected_frames", "rejected_payloads", "rejected_updates")
        }
        rejected["rejected_senders"] = sum(p["rejected_senders"] for p in peers)
        rejected["unknown_documents"] = self.replicas.stats["refused_unknown"]
        rejected["status_messages"] = self.liveness.rejected
        rejected["telemetry"] = self.telemetry.rejected
        refused: Counter[str] = Counter()
        docs = [r.doc for r in self.replicas.replicas.values()]
        for doc in [*docs, *([] if self.policy is None else [self.policy])]:
            refused.update(doc.refusals.by_kind())
        rejected["schema_entries"] = sum(refused.values())
        return {
            "central": self.central.central_id,
            "uptime_s": round(self.clock() - self.started_at, 3),
            "broker_connected": self.session.connected,
            "nodes": len(self.replicas.replicas),
            "online": sum(1 for s in self.liveness.nodes.values() if s.state == "online"),
            "heartbeats_sent": self.heartbeat.sent,
            "leader": self.peers.leader(),
            "centrals_alive": self.peers.alive(),
            "policy_hash": None if self.policy is None else self.policy.content_hash(),
            "updates_in": sum(p["updates_in"] + p["step2_in"] for p in peers),
            "rejected": rejected,
            "refused_entries": dict(sorted(refused.items())),
        }

    def refresh_metrics(self) -> None:
        status = self.status()
        self.metrics.nodes.set(status["nodes"])
        self.metrics.online.set(status["online"])
        self.metrics.broker_connected.set(1 if status["broker_connected"] else 0)
        for kind, count in status["rejected"].items():
            self.metrics.rejected.labels(kind).set(count)


def _need(value: Any) -> Any:
    if value is None:
        raise RuntimeError("central engine not started")
    return value
