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
settles tasks placed twice by the pure rule of :mod:`edgesched.central.placement`. It is
incremental: a :class:`~edgesched.central.fleetindex.FleetIndex` is told what each applied
update changed (the node documents' and the policy document's changed keys, liveness,
freshness) and a step does work for what changed and the timers due, never a walk over the
fleet (the walks stay in :mod:`edgesched.central.placement` as the tests' oracle). The
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
import gc
import heapq
import itertools
import json
import logging
import math
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from edgesched.central.desired import DesiredDocs
from edgesched.central.fleetindex import FleetIndex
from edgesched.central.fleetseries import FleetSample, FleetSeries
from edgesched.central.heartbeat import CentralPeers, Heartbeat
from edgesched.central.leases import ShardLeases, shard_of
from edgesched.central.liveness import Hearing, Liveness, NodeStatus
from edgesched.central.metrics import CentralMetrics, node_state_counts
from edgesched.central.placement import Choice, assignment_entry, place_all, place_pinned
from edgesched.central.power import PARKED, Move, power_plan
from edgesched.central.replicas import NODE_DOC_PREFIX, NodeReplicas
from edgesched.central.services import ServiceController, ServiceRefused
from edgesched.central.sites import SiteIndex
from edgesched.central.telemetry import TelemetryCollector
from edgesched.config import EdgeschedConfig, builtin_profiles
from edgesched.core.classdemand import MAX_DEMAND, ClassDemand
from edgesched.core.forecast import Forecaster
from edgesched.core.lifecycle import Assigned, Copy, Lifecycle, Phase, Reach, lifecycle
from edgesched.core.model import Node, Placement
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView
from edgesched.core.service import ServiceSpec, parse_replica_id
from edgesched.core.task import TaskSpec, TaskState
from edgesched.policies.models import ActiveModels, ModelBlob
from edgesched.policies.ortsession import ModelLoadError
from edgesched.rest.server import ApiStarter
from edgesched.sync import heap
from edgesched.sync.doc import (
    NodeDoc,
    PolicyDoc,
    SoleFleetDoc,
    SyncedDoc,
    client_id_for,
    normalise,
    unpacked,
)
from edgesched.sync.freezer import Freezer, Sweep
from edgesched.sync.journal import DocJournal
from edgesched.sync.pacer import ResyncPacer
from edgesched.sync.peer import DocPeer, refusals
from edgesched.sync.reconcile import ReconcilePolicy
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentState,
    ModelEntry,
    NodeView,
    PowerOrder,
    StopOrder,
    TaskReport,
    TidalEntry,
)
from edgesched.sync.session import MqttSession, presence_topic, wait_event
from edgesched.sync.signing import VerifyThread
from edgesched.sync.stall import StallWatch
from edgesched.sync.statelock import StateLock
from edgesched.sync.store import Store, StoreError
from edgesched.sync.topics import node_of_topic

POLICY_DOC = "policy"
FLEET_DOC = "fleet"
_E = TypeVar("_E")
MAX_EVENTS = 1000
#: Events that come by the thousand on a busy fleet: kept only in the ring of every event.
#: The rest (failovers, reconciles, nodes going away, tasks not taken up, policy...) are
#: also kept in a ring of their own, so routine ones never push them out.
ROUTINE_EVENTS = frozenset({"placed", "pruned"})
#: How often central samples what each workload class asks of the fleet (5-minute bins).
DEMAND_SAMPLE_S = 5.0
#: A node's telemetry older than this does not count in the fleet's utilization and power.
TELEMETRY_FRESH_S = 60.0
#: How often the power stage runs when nothing changed (idle timers must still come due).
POWER_EVERY_S = 5.0
#: Every this many freezer sweeps, one full garbage collection (see settle_heap).
FULL_COLLECTION_SWEEPS = 60
#: The interpreter's thread switch interval in central's process (Python's default 5 ms).
SWITCH_INTERVAL_S = 0.0005
#: How often the control loop freezes what survived the young collections (settle_young).
YOUNG_SETTLE_S = 5.0
#: The cyclic garbage collector's young-generation threshold in central's process (Python's
#: 700 allocations): at 10,000 nodes central ran ~47 young collections a second, each one
#: walking the young containers a step or a merge had just made and mostly freed again.
GC_YOUNG_THRESHOLD = 10_000
#: Young collections between two of the middle generation (Python's 10). A middle collection
#: walks what survived the young ones since the last (up to ten thresholds' worth at 10): at
#: 10,000 nodes each took ~65 ms, inside whatever ran then; every third, a third of that.
GC_MIDDLE_THRESHOLD = 3
#: A replica acts on its shards only while its lease stays valid this much longer (a step
#: never outlives the lease that allowed it: see docs/scaling.md).
LEASE_GUARD_S = 0.5
#: A shard gained is acted on once the fleet document has had a full answer from every other
#: live replica since the gain (what the former owner wrote before it let go); past this
#: long without one (a replica that reaches etcd but not the broker), it is acted on anyway.
HANDOVER_MAX_S = 5.0
#: Tasks settled, and forgetting times scheduled, per step while a recheck of the whole fleet
#: (leadership or a shard gained) is worked through: ~0.2 s of a step each at 20,000. The
#: first step at 10,000 nodes x 70 assignments looked at all 700,000 in one go (~15 s), long
#: past the broker's keepalive.
RECHECK_PER_STEP = 20_000
#: The status hashes the fleet document up to this many entries (~0.2 s of the loop).
STATUS_HASH_MAX_ENTRIES = 20_000
#: A gap between control steps this much longer than ``cycle_s`` means the event loop was
#: held (a step wakes at least every ``cycle_s``): the nodes' messages of the gap wait unread.
HELD_GAP_S = 2.0


def held_between(previous: float | None, now: float, cycle_s: float) -> bool:
    """Whether the loop was held between two control steps begun at ``previous`` and ``now``
    (``time.monotonic``; None: no step before)."""
    return previous is not None and now - previous > cycle_s + HELD_GAP_S


#: The policy document's maps the fleet index follows by key.
POLICY_ROOTS = ("assignments", "stops", "power")


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
        #: logs where the event loop was held, when it is held past 2 s (sync/stall.py)
        self.stall_watch = StallWatch()
        self._endpoint = self.central.mqtt.endpoint(self.central.central_id)  # files read now
        #: our document messages signed, the peers' checked (None: not configured); the
        #: checks on a thread of their own, so on another core than the loop's
        self.signing = self.central.mqtt.frame_signing(self.central.central_id)
        if self.signing is not None:
            self.signing.verifier = VerifyThread()
        self.session = MqttSession(
            self._endpoint,
            backoff_initial_s=min(0.5, self.central.mqtt.reconnect_max_s),
            backoff_max_s=self.central.mqtt.reconnect_max_s,
            presence=presence_topic(self.central.central_id, "central"),  # a second one stops
        )
        self.heartbeat = Heartbeat(self.central.central_id, self.central.heartbeat_s, clock)
        self.peers = CentralPeers(self.central.central_id, 3 * self.central.heartbeat_s, clock)
        self._was_leader: bool | None = None
        #: Shard ownership by etcd leases ([central] etcd_endpoints); None: the peers' rule
        #: (the smallest live id acts for the whole fleet).
        self.leases: ShardLeases | None = None
        self._owned: frozenset[int] = frozenset()
        #: whether the last control step acted (a recheck's backlog is worked through then)
        self._acted = False
        #: shards held but not yet acted on: gained at (the fleet peer's clock), waiting for
        #: a full answer from every other live replica (see _handed_over)
        self._handover: dict[int, float] = {}
        self._fleet_peer: DocPeer | None = None
        #: the policy's and the fleet document's peers, by document name
        self._central_peers: dict[str, DocPeer] = {}
        #: task -> a migration whose target has not run it yet (in memory: after a restart
        #: the reconcile rule settles the two copies)
        self._migrations: dict[str, _Migration] = {}
        #: tasks changed since the history last looked (record_history), and where a sweep
        #: of every task the index knows has got to (None: no sweep): past
        #: HISTORY_DUE_UP_TO due at once (a restart marks every restored task), the set
        #: gives way to the sweep (a set of a million ids held 34 MB for half an hour)
        self._history_due: set[str] = set()
        self._history_sweep: str | None = None
        #: (when, task, node, epoch): placements to check were taken up (a heap)
        self._take_up: list[tuple[float, str, str, int]] = []
        self.liveness = Liveness(
            clock, site_of=self._site_of, silent_after_s=self.central.silent_after_s
        )
        self.telemetry = TelemetryCollector()
        #: Freezes the replicas and desired documents unused for ``cold_after_s``.
        self.freezer = Freezer(on_unsettled=self._ask_full_answer)
        # the freezer that watches the replicas and desired documents (None: all kept live)
        cold = self.freezer if self.central.cold_after_s > 0 else None
        self._thaws_counted = 0
        self._sweeps = 0
        #: The step 1s central's document peers send on their own, paced (two per node on
        #: every connect): a channel of the session, so a lost connection voids its line.
        self.resync_pacer = ResyncPacer(self.central.resync_per_s)
        self.session.add(self.resync_pacer)
        self.replicas = NodeReplicas(
            self.central.central_id,
            self.session,
            nodes=self.central.nodes,
            centrals=self.central.peers,
            clock=clock,
            freezer=cold,
            pacer=self.resync_pacer,
            signing=self.signing,
        )
        self.session.fallback = self.replicas
        self.session.add(self.heartbeat)
        self.session.add(self.peers)
        self.session.add(self.liveness)
        # Every telemetry message is a sign of life (last wills can be lost: a broker member
        # that dies takes its clients' wills with it).
        self.session.add(
            Hearing(self.telemetry, self.liveness, lambda t: node_of_topic(t, "telemetry"))
        )
        self.reconcile_policy = ReconcilePolicy(self.central.reconcile)
        self.policy: PolicyDoc | None = None  # fleet-wide: mode, tidal profile, models
        self.fleet: PolicyDoc | None = None  # assignments, stops, power: centrals only
        self.desired: DesiredDocs | None = None  # each node's shard of the fleet document
        self._fleet_journal: DocJournal | None = None
        self._tidal_name = "config"  # the [policy] tidal of the config file until switched
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self.notable: deque[Event] = deque(maxlen=MAX_EVENTS)  # not ROUTINE_EVENTS
        self.api_port: int | None = None
        self.started_at = clock()
        self._journal: DocJournal | None = None
        self._store: Store | None = None
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one control step or submission at a time
        #: Turns of the control loop completed: what the systemd watchdog watches
        #: (edgesched.sdnotify)
        self.loop_turns = 0
        self.liveness.on_change = self._node_status_changed
        self.replicas.on_change = self._replica_changed
        self.index = FleetIndex(
            grace_s=self.central.failover_after_s,
            retention_s=self.central.assignment_retention_s,
        )
        self.sites = SiteIndex()  # each site's members and decisions (GET /v1/sites)
        self._dirty_nodes: set[str] = set()  # replicas changed since the index last looked
        self._placed_version = -1  # the index version waiting work was last tried at
        self._power_at = (-1, 0.0)  # (index version, time) of the last power stage
        self.models: ActiveModels | None = None  # loaded in run(): onnxruntime is slow to import
        self.demand = ClassDemand()  # what each workload class asks of the fleet, 5-min bins
        self.forecast_cpu: float | None = None
        self.fleet_series = FleetSeries()  # the day, a point a minute (GET /v1/fleet)
        #: per spread key: (the table it was read from, node -> domain, how many domains)
        self._domains: dict[str, tuple[object, dict[str, str], int]] = {}
        self.services = ServiceController(  # replicas kept at their count
            self, self.clock, config.central.autoscale_time_scale
        )

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("central engine not started")
        return self._store

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def stop(self) -> None:
        self._stop.set()

    @property
    def loop_period_s(self) -> float:
        return self.central.cycle_s

    def service_status(self) -> str:
        """One line for ``systemctl status`` (sent with every watchdog ping)."""
        online = sum(1 for s in self.liveness.nodes.values() if s.state == "online")
        broker = "connected" if self.session.connected else "not connected"
        return (
            f"central {self.central.central_id}: broker {broker}; "
            f"{online}/{len(self.replicas.replicas)} nodes online; API on port {self.api_port}; "
            f"{self.loop_turns} control steps"
        )

    async def run(self) -> None:
        """Restore the replicas from SQLite, then serve until :meth:`stop`."""
        # SQLite runs in the store's thread (each write one job there), which gives up the
        # GIL around every statement and row and then waits for it while this loop
        # computes: up to the switch interval (5 ms) each time. A snapshot batch of 72
        # replicas held the store 0.6-3 s at 10,000 nodes (the fleet journal, and each
        # submission, waiting behind it); at 0.5 ms, 0.2 s, and 60-80 ms once a write was
        # one job (bench/bench_store_contention.py: 300-640 ms at 5 ms even then).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        _young, _middle, old = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, GC_MIDDLE_THRESHOLD, old)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = StateLock.acquire(self.state_dir, f"central {self.central.central_id}")
        try:
            await self._run_locked()
        finally:
            lock.release()

    async def _run_locked(self) -> None:
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
            restored = await self.replicas.load(learned=self._restored)
            log.info("central %s: %d node replicas restored", self.central.central_id, restored)
            await self._open_policy()
            await self._open_fleet()
            async with contextlib.AsyncExitStack() as stack:
                if self.central.etcd_endpoints:
                    self.leases = await stack.enter_async_context(
                        ShardLeases(
                            self.central.central_id,
                            self.central.etcd_endpoints,
                            shards=self.central.shards,
                            ttl_s=self.central.lease_ttl_s,
                            on_change=self._leases_changed,
                        )
                    )
                await self._serve()
            await self.replicas.persist_changed()
        finally:
            if self.signing is not None and self.signing.verifier is not None:
                self.signing.verifier.close()
            await self.store.close()
            log.info("central %s stopped", self.central.central_id)

    async def _serve(self) -> None:
        """The loops, in one task group, until :meth:`stop`."""
        async with asyncio.TaskGroup() as group:
            runner = None if self._api is None else await self._api(self)
            loops: list[asyncio.Task[None]] = []
            try:
                loops = [
                    group.create_task(_need(self._journal).run(), name="policy-log"),
                    group.create_task(_need(self._fleet_journal).run(), name="fleet-log"),
                    group.create_task(_need(self.desired).journals.run(), name="desired-log"),
                    group.create_task(self.session.run(), name="mqtt"),
                    group.create_task(self._snapshot_loop(), name="snapshots"),
                    group.create_task(self._cold_loop(), name="cold-documents"),
                    group.create_task(self._control_loop(), name="control"),
                    group.create_task(self._forecast_loop(), name="forecast"),
                    group.create_task(self.stall_watch.run(), name="stall-watch"),
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
                        await _need(self._fleet_journal).flushed()
                        await _need(self.desired).journals.flush()
            finally:
                for task in loops:
                    task.cancel()
                if runner is not None:
                    await runner.cleanup()

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.central.snapshot_s)
            written = await self.replicas.persist_changed()
            if written:
                self.metrics.snapshots.inc(written)
            await self.record_history()

    async def record_history(self) -> int:
        """Store in central's history (SQLite ``finished_tasks``) every task that changed
        since the last call and whose lifecycle is final: kept past the documents' retention,
        queryable at ``GET /v1/history``. Returns how many were written."""
        if self.fleet is None:
            return 0
        self.sync_index()
        batch = self._history_batch()
        # Only tasks that may be final; of those, only what the history does not hold
        # already as it is now (a restart marks every restored task due: at 10,000 nodes
        # that rewrote 600,000 unchanged rows, 3,000 every pass, for a quarter of an hour).
        maybe = [task_id for task_id in batch if self._may_be_final(task_id)]
        held = await self.store.finished_marks(maybe) if maybe else {}
        rows = []
        for i, task_id in enumerate(maybe):
            if i and i % HISTORY_PER_TURN == 0:
                # (a view is ~0.1 ms: a pass of thousands held central's loop, every
                # submission waiting behind it, so the loop gets a turn between slices)
                await asyncio.sleep(0)
            if not self._may_be_final(task_id):
                continue  # (started again, or forgotten, meanwhile)
            entry = self.index.assignments.get(task_id)
            reports = self.index.copies_of(task_id)
            life = self.lifecycle_of(task_id, entry, reports)  # (the view only if final)
            if life.phase.value not in _FINAL or life.finished_at is None:
                continue
            row = life  # (what the row will say: a view of central's reads its own copies)
            if entry is not None:
                ours = {n: c for n, c in reports.items() if c.assignment is not None}
                row = self.lifecycle_of(task_id, entry, ours)
            if held.get(task_id) == (row.phase.value, row.finished_at):
                continue  # (recorded as it is)
            view = (
                self.task_view(task_id, entry)
                if entry is not None
                else self.local_task_view(task_id)
            )
            held_copy = reports.get(view["node"]) if view["node"] else None
            spec = view.get("spec")
            view["workload"] = (
                spec["workload"]
                if spec
                else held_copy.workload
                if held_copy is not None
                else "default"
            )
            rows.append(view)
        if rows:
            await self.store.record_finished(rows)
        return len(rows)

    def _history_mark(self, task_ids: Iterable[str]) -> None:
        """Mark tasks due a look by :meth:`record_history`."""
        due = self._history_due
        due.update(task_ids)
        if len(due) > HISTORY_DUE_UP_TO:  # every task known, a slice a pass, from the first
            self._history_due = set()
            self._history_sweep = ""

    def history_backlog(self) -> bool:
        """Whether tasks wait for a look by :meth:`record_history`."""
        return bool(self._history_due) or self._history_sweep is not None

    def _history_batch(self) -> list[str]:
        """The tasks one pass of :meth:`record_history` looks at, in id order: the sweep's
        next slice first (it covers whatever was due when it began), then those due."""
        batch: list[str] = []
        if self._history_sweep is not None:
            ids = self.index.task_ids.irange(self._history_sweep, inclusive=(False, True))
            batch = list(itertools.islice(ids, HISTORY_PER_PASS))
            self._history_sweep = batch[-1] if len(batch) == HISTORY_PER_PASS else None
        due = self._history_due
        room = HISTORY_PER_PASS - len(batch)
        if len(due) > room:
            taken = list(itertools.islice(due, room))
            due.difference_update(taken)
        else:
            taken, self._history_due = list(due), set()
        return sorted({*batch, *taken})

    def _may_be_final(self, task_id: str) -> bool:
        """Whether a task's lifecycle may have ended: central cancelled it, or some node
        reports a copy of it finished (what :meth:`record_history` looks at further)."""
        entry = self.index.assignments.get(task_id)
        if entry is not None and entry.state is AssignmentState.CANCELLED:
            return True
        return any(c.state.terminal for c in self.index.copies_of(task_id).values())

    async def _cold_loop(self) -> None:
        """Freeze the documents unused since the last sweep: every ``cold_after_s`` all of
        them, and every ``replica_cold_after_s`` (when shorter) the node replicas."""
        full_s = self.central.cold_after_s
        if full_s <= 0:
            return
        fast_s = self.central.replica_cold_after_s
        step_s = fast_s if 0 < fast_s < full_s else full_s
        since_full = 0.0
        while True:
            await asyncio.sleep(step_s)
            since_full += step_s
            full = since_full >= full_s - 1e-6
            if full:
                since_full = 0.0
            if self.fleet is not None:
                self.sync_index()  # (a frozen replica is one the index has read)
            only = None if full else _is_replica
            self._swept(await self.freezer.sweep_in_turns(only), full=full)
            if full:  # what the frozen documents freed, back to the system
                await asyncio.to_thread(heap.trim)

    def sweep_cold(self, *, replicas_only: bool = False) -> None:
        """One sweep of the freezer (see :mod:`edgesched.sync.freezer`), counted in metrics:
        of every document, or (``replicas_only``) of the node replicas alone, in one go (the
        running engine's loop sweeps in turns). The index reads every pending change first:
        a frozen replica is one it has read."""
        if self.fleet is not None:
            self.sync_index()
        sweep = self.freezer.sweep(only=_is_replica if replicas_only else None)
        self._swept(sweep, full=not replicas_only)

    def _swept(self, sweep: Sweep, *, full: bool) -> None:
        """A sweep done: the heap settled (after a full one), the metrics."""
        thaws = self.freezer.thaws
        if full:
            self._sweeps += 1
            self.settle_heap(full=self._sweeps % FULL_COLLECTION_SWEEPS == 0)
        self.metrics.docs_frozen.set(sweep.frozen_total)
        self.metrics.docs_frozen_bytes.set(sweep.frozen_bytes)
        self.metrics.docs_live.set(sweep.live)
        self.metrics.doc_thaws.inc(thaws - self._thaws_counted)
        self._thaws_counted = thaws
        if sweep.frozen:
            log.debug(
                "froze %d unused documents (%d frozen, %d bytes; %d live)",
                sweep.frozen,
                sweep.frozen_total,
                sweep.frozen_bytes,
                sweep.live,
            )

    async def _open_policy(self) -> None:
        """Central's policy document, rebuilt from SQLite; journaled; synced as a channel."""
        client_id = client_id_for(self.central.central_id)
        self.policy = await PolicyDoc.load_from(self.store, POLICY_DOC, client_id)
        self._adopt_policy()
        self.policy.on_remote_change(lambda _sender: self._adopt_policy())  # a peer switched
        self._journal = DocJournal(self.policy, self.store)
        self._sync_central_doc(self.policy, self._journal)
        self.policy.announce_packed()  # (journaled and sent: nodes pack their entries)

    def _sync_central_doc(self, doc: PolicyDoc, journal: DocJournal) -> DocPeer:
        """Sync a document the central replicas co-write (and only they author) as a channel,
        each local update on disk before it leaves."""
        centrals = (self.central.central_id, *self.central.peers)
        peer = DocPeer(
            doc,
            self.central.central_id,
            before_publish=journal.flushed,
            writers=frozenset(client_id_for(c) for c in centrals),
            relays=centrals,  # a node's step 1 on the policy's topics is heard, its content never
            signing=self.signing,
            subscribe=False,  # the replicas' wildcard subscription carries it
        )
        self.session.add(peer)
        self._central_peers[doc.name] = peer
        return peer

    async def _open_fleet(self) -> None:
        """Central's fleet document (every assignment, stop and power order; only central
        replicas replicate it) and the nodes' desired-state documents, rebuilt from SQLite;
        journaled; synced. The fleet index learns all of it, and each desired document is
        made to hold exactly its node's share."""
        client_id = client_id_for(self.central.central_id)
        if self.central.peers:  # co-written by the central replicas: no epochs of its own
            fleet = await PolicyDoc.load_from(self.store, FLEET_DOC, client_id)
        else:  # its one writer: it rotates away the tombstones of forgotten tasks
            fleet = await SoleFleetDoc.load_from(self.store, FLEET_DOC, client_id)
            fleet.sole_writer = self.central.central_id
        fleet.packed = True  # centrals only read it: entries as JSON text (a quarter of the memory)
        self.fleet = fleet
        fleet.track_changes(*POLICY_ROOTS)
        self._fleet_journal = DocJournal(fleet, self.store)  # before the move: it logs it
        moved = _move_desired_state(_need(self.policy), fleet)
        if moved:
            log.warning("moved %d entries of the policy document into the fleet document", moved)
        self._fleet_peer = self._sync_central_doc(fleet, self._fleet_journal)
        self._fleet_peer.on_synced = lambda _sender: self._wake.set()  # a hand-over may end
        self.desired = DesiredDocs(
            self.central.central_id,
            self.session,
            self.store,
            centrals=self.central.peers,
            clock=self.clock,
            freezer=self.replicas.freezer,  # (the same rule as the replicas')
            reads_packed=self.index.reads_packed,
            pacer=self.resync_pacer,
            source=self._fleet_journal,  # the fleet on disk first, as far as projected
            signing=self.signing,
        )
        restored = await self.desired.load()
        self.sync_index(project=False)  # the index learns the restored fleet at once
        written = self.desired.match(self.index.assignments, self.index.stops, self.index.orders)
        log.info("desired-state documents: %d restored, %d entries brought up to date",
                 restored, written)  # fmt: skip
        self.settle_heap(full=True)
        await asyncio.to_thread(heap.trim)  # (restoring thawed and froze every document)

    def settle_heap(self, *, full: bool = False) -> None:
        """Move what central holds now out of the garbage collector's sight (``gc.freeze``).

        Central keeps millions of long-lived objects (the index, the decoded entries); each
        full collection of the cyclic garbage collector walks all of them (0.5 s at 1,000
        nodes before the cold documents), inside whichever control step allocates at that
        moment; it grows with the fleet. Frozen objects are still freed by reference
        counting when dropped; only a reference cycle that was alive when frozen is kept once
        it turns to garbage,
        so ``full`` (at start, and every ``FULL_COLLECTION_SWEEPS`` sweeps) unfreezes,
        collects once, and freezes again."""
        if full:
            gc.unfreeze()
            gc.collect()
        gc.freeze()

    def settle_young(self) -> None:
        """Collect the young generations, then freeze what survived them (``gc.freeze`` moves
        lists: O(1)), every ``YOUNG_SETTLE_S``. CPython starts a full collection once the
        objects that survived young ones reach a quarter of the last full collection's
        survivors, which after a freeze are few: at 10,000 nodes, with a freeze a minute
        (each sweep), central ran a full collection every ~8 s, walking all it had made since
        the sweep (~220 ms each, up to 387 ms, inside whatever was running). Frozen this
        often, a full collection walks seconds' worth."""
        gc.collect(1)
        gc.freeze()

    def _event(
        self, kind: str, detail: str, *, node: str | None = None, task: str | None = None
    ) -> None:
        event = Event(self.clock(), kind, detail, node, task)
        self.events.append(event)
        if kind not in ROUTINE_EVENTS:
            self.notable.append(event)
        self.metrics.events.labels(kind).inc()
        log.info("%s: %s", kind, detail)

    def _ask_full_answer(self, doc: SyncedDoc) -> None:
        """A quiet replica that may hold updates pycrdt keeps pending: ask its node for a full
        answer (our state vector again), which settles it; it freezes at a later sweep."""
        if doc.name.startswith(NODE_DOC_PREFIX):
            replica = self.replicas.replicas.get(doc.name[len(NODE_DOC_PREFIX) :])
            if replica is not None and replica.doc is doc:
                replica.peer.request_resync()

    def _restored(self, node_id: str) -> None:
        """A replica restored from SQLite: the index learns it now, and it is frozen until a
        node speaks (restoring all of them live first would hold the fleet's peak at once)."""
        self._learn_node(node_id)
        if self.replicas.freezer is not None:
            self.replicas.replicas[node_id].doc.freeze()

    def _replica_changed(self, node_id: str) -> None:
        replica = self.replicas.replicas.get(node_id)
        at = None if replica is None else replica.peer.heard_at.get(node_id)
        if at is not None:  # the node's own message (a relaying central's does not count)
            self.liveness.heard(node_id, at)
        self._dirty_nodes.add(node_id)
        self._wake.set()

    def _node_status_changed(self, node_id: str, status: NodeStatus) -> None:
        self._event(f"node-{status.state}", f"{node_id} is {status.state}", node=node_id)
        self.index.set_status(node_id, status.state, status.since)
        self._dirty_nodes.add(node_id)  # (its freshness moved)
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

    def sync_index(self, *, project: bool = True) -> None:
        """Tell the fleet index what changed since it last looked: the fleet document's
        changed keys, and each changed replica's changed tasks, registration, power report
        and freshness; and mirror each fleet change into the desired-state documents of the
        nodes it concerns (``project``; at start :meth:`DesiredDocs.match` does it once).
        O(what changed)."""
        fleet = _need(self.fleet)
        index = self.index
        desired = self.desired if project else None
        # one transaction per desired document for all this call projects
        with contextlib.nullcontext() if desired is None else desired.batch():
            keys = fleet.drain_changes("assignments")
            every = partial(fleet.each, "assignments", AssignmentEntry)
            for key, entry in _changed(keys, every, fleet.assignment, index.assignments):
                old = index.assignments.get(key)
                if entry != old:
                    self._history_mark((key,))
                    index.set_assignment(key, entry)
                    if desired is not None:
                        desired.assignment(key, old, entry)
            keys = fleet.drain_changes("stops")
            for key, stop in _changed(keys, partial(fleet.each, "stops", StopOrder), fleet.stop,
                                      index.stops):  # fmt: skip
                if stop != index.stops.get(key):
                    index.set_stop(key, stop)
                    if desired is not None:
                        desired.stop(key, stop)
            keys = fleet.drain_changes("power")
            every_order = partial(fleet.each, "power", PowerOrder)
            for key, order in _changed(keys, every_order, fleet.power_order, index.orders):
                if order != index.orders.get(key):
                    index.set_order(key, order)
                    if desired is not None:
                        desired.power(key, order)
        dirty, self._dirty_nodes = self._dirty_nodes, set()
        for node_id in sorted(dirty):
            self._learn_node(node_id)
            if desired is not None:
                desired.doc(node_id)  # a channel for its step 1, before anything is assigned

    def _learn_node(self, node_id: str) -> None:
        """Tell the index what changed in ``node_id``'s replica, and its freshness."""
        replica = self.replicas.replicas.get(node_id)
        if replica is None:
            return
        doc = replica.doc
        changed = doc.drain_changes("tasks")
        # A frozen replica changed nothing since the index last read it (a change thaws it,
        # and the freezer runs only after the index has read every change): no thaw.
        if not (doc.frozen and changed == set()):
            # Only what changed is decoded: the changed tasks one by one (the whole map only
            # when it may all have changed), the registration and the power report.
            tasks: Mapping[str, TaskReport] = doc.tasks() if changed is None else _Tasks(doc)
            self.index.update_node(
                node_id, NodeView(doc.registration(), tasks, doc.power_report()), changed
            )
            self._history_mark(tasks.keys() if changed is None else changed)
        member = self.index.members.get(node_id)
        if member is not None:  # O(1) + O(changed tasks): the index's reports, no thaw
            self.sites.learn(node_id, doc, member.registration, member.reports, changed)
        self.index.set_fresh(node_id, self.is_fresh(node_id))

    async def submit(self, spec: TaskSpec, pin: str | None = None) -> dict[str, Any]:
        """Accept a task: placed now if a node can take it, else waiting (state ``pending``).
        Journaled to SQLite before this returns."""
        fleet = _need(self.fleet)
        if parse_replica_id(spec.id) is not None:
            raise TaskRefused(
                422, "id", f"{spec.id!r} has the form of a service replica's id "
                "(<service>.<slot>.<revision>.<incarnation>): services start their own",
            )  # fmt: skip
        async with self._lock:
            if fleet.assignment(spec.id) is not None:
                raise TaskRefused(409, "id", f"task {spec.id!r} already exists")
            if pin is not None and pin not in self.replicas.replicas:
                raise TaskRefused(422, "node", f"no node {pin!r} is known to central")
            acting, mine = self._acting()
            if acting and (mine is None or mine(spec.id)):
                self.sync_index()
                self._place(spec, pin=pin, epoch=1, replacement=False)
                # projected into the node's desired document now, not at the next step: its
                # journal's write overlaps the fleet's, and its publish waits for both
                self.sync_index()
            elif self.leases is not None:  # the owner of its shard places it
                shard = shard_of(spec.id, self.leases.shards)
                self._pending(
                    spec, pin, 1,
                    f"accepted by {self.central.central_id}; shard {shard} places it",
                )  # fmt: skip
            else:  # the leading central replica places it
                leader = self.peers.leader()
                self._pending(
                    spec, pin, 1, f"accepted by {self.central.central_id}; {leader} leads"
                )
        await _need(self._fleet_journal).flushed()  # the assignment on disk
        self._wake.set()
        entry = fleet.assignment(spec.id)
        assert entry is not None
        return self.task_view(spec.id, entry)

    def _place(self, spec: TaskSpec, *, pin: str | None, epoch: int, replacement: bool) -> None:
        """Place one task now (a submission): over the fleet index's table."""
        self._decided(spec, self._choose([spec], {spec.id: pin})[spec.id], pin=pin,
                      epoch=epoch, replacement=replacement)  # fmt: skip

    def _choose(self, specs: list[TaskSpec], pins: Mapping[str, str | None]) -> dict[str, Choice]:
        """Where the core puts each of ``specs`` (one batch for the unpinned ones)."""
        table = self.index.table()
        now = self.clock()
        config = self._policy_config()
        groups = self.services.groups_for(specs) or None  # replicas spread as their service asks
        free = [s for s in specs if not pins.get(s.id)]
        choices = place_all(free, table, now, config, groups)
        unusable: Mapping[str, str] | None = None
        for spec in specs:
            pin = pins.get(spec.id)
            if pin:
                unusable = self.index.unusable() if unusable is None else unusable
                choices[spec.id] = place_pinned(spec, table, now, config, pin, unusable, groups)
        return choices

    def admit_replicas(self, specs: Sequence[TaskSpec]) -> None:
        """New replicas of a service (the service controller's, inside the control step):
        placed now, in one batch of the core with their service's spread, if this central
        acts on their shards; else waiting for their shard's owner, as a submission."""
        acting, mine = self._acting()
        if not acting:
            return
        own = [s for s in specs if mine is None or mine(s.id)]
        self.sync_index()
        choices = self._choose(own, {})
        for spec in own:
            self._decided(spec, choices[spec.id], pin=None, epoch=1, replacement=False)
        for spec in specs:
            if mine is not None and not mine(spec.id):
                shard = shard_of(spec.id, mine.count)
                self._pending(spec, None, 1, f"started by {self.central.central_id}; "
                              f"shard {shard} places it")  # fmt: skip

    @property
    def central_id(self) -> str:
        return self.central.central_id

    def domains(self, key: str) -> tuple[Callable[[str], str | None], int]:
        """For a spread key (``node``, ``site``, ``arch``): each usable node's domain (None:
        not a usable node) and how many domains the usable nodes make."""
        table = self.index.table()
        cached = self._domains.get(key)
        if cached is None or cached[0] is not table:
            if key == "node":
                values = [n.id for n in table.nodes]
            elif key == "site":
                values = [n.site for n in table.nodes]
            else:
                values = [n.arch.value for n in table.nodes]
            cached = (table, {n.id: v for n, v in zip(table.nodes, values, strict=True)},
                      len(set(values)))  # fmt: skip
            self._domains[key] = cached
        _, of, count = cached
        return of.get, count

    def rebalance_replica(
        self, task_id: str, reason: str, accept: Callable[[str], bool]
    ) -> str | None:
        """Migrate a service's replica (make before break) to where the core places it now
        with its service's spread, if ``accept``s that node; the node, or None."""
        entry = self.index.assignments.get(task_id)
        if entry is None or not entry.active or task_id in self._migrations:
            return None
        spec = entry.task_spec
        choice = self._choose([spec], {})[spec.id]
        if choice.node_id is None or choice.node_id == entry.node or not accept(choice.node_id):
            return None
        self._move(task_id, entry, choice, f"{reason}: {choice.reason}", self.clock())
        return choice.node_id

    def record_event(
        self, kind: str, detail: str, *, node: str | None = None, task: str | None = None
    ) -> None:
        """Add an event to the fleet's timeline (``GET /v1/events``, the dashboard)."""
        self._event(kind, detail, node=node, task=task)

    def forecaster_for(self) -> Callable[[str], Forecaster] | None:
        """The forecaster per workload class (the ONNX model for the classes it knows), or
        None before the models are loaded."""
        if self.models is None:
            return None
        table = self.index.table()
        capacity = float(table.capacity[:, 0].sum()) if len(table) else 0.0
        return self.models.forecaster_for(capacity)

    def _decided(
        self, spec: TaskSpec, choice: Choice, *, pin: str | None, epoch: int, replacement: bool
    ) -> str | None:
        """Write a placement (or the reason it waits) into the policy document."""
        now = self.clock()
        fleet = _need(self.fleet)
        if choice.node_id is None:
            self._pending(spec, pin, epoch, choice.reason)
            return None
        fleet.assign(
            spec.id,
            assignment_entry(
                spec, choice.node_id, central=self.central.central_id, epoch=epoch,
                replacement=replacement, score=choice.score, at=now, reason=choice.reason,
                lease=self._lease_of(spec.id),
            ),
        )  # fmt: skip
        self._event("placed", f"{spec.id} on {choice.node_id}: {choice.reason}",
                    node=choice.node_id, task=spec.id)  # fmt: skip
        self._await_take_up(spec.id, choice.node_id, epoch, now)
        return choice.node_id

    def _await_take_up(self, task_id: str, node_id: str, epoch: int, now: float) -> None:
        """Look, ``take_up_s`` after, whether ``node_id`` took up the task at ``epoch``."""
        if self.central.take_up_s > 0:
            heapq.heappush(self._take_up, (now + self.central.take_up_s, task_id, node_id, epoch))

    def _check_take_up(self, now: float, mine: Shards | None) -> None:
        """Assignments due a look (:meth:`_await_take_up`): one its node, connected and
        fresh, has not taken up (no copy of its epoch there) is placed again, at the next
        epoch, with the reason; one whose node is away is left to the failover; one whose
        node is still resyncing is looked at again later."""
        due = self._take_up
        while due and due[0][0] <= now:
            _, task_id, node_id, epoch = heapq.heappop(due)
            entry = self.index.assignments.get(task_id)
            if entry is None or not entry.active or (entry.node, entry.epoch) != (node_id, epoch):
                continue  # moved, cancelled, finished and forgotten
            if mine is not None and not mine(task_id):
                continue
            copy = self.index.copies_of(task_id).get(node_id)
            if copy is not None and copy.assignment is not None and copy.assignment.epoch >= epoch:
                continue  # taken up
            if self.node_state(node_id) != "connected":
                continue  # away: the failover's to handle
            if not self.is_fresh(node_id):
                self._await_take_up(task_id, node_id, epoch, now)  # resyncing: later
                continue
            reason = (
                f"{node_id} did not take it up within {self.central.take_up_s:g} s (epoch {epoch})"
            )
            self._pending(entry.task_spec, entry.pin or None, epoch + 1, reason)
            self._event("not-taken-up", f"{task_id}: {reason}", node=node_id, task=task_id)

    def _pending(self, spec: TaskSpec, pin: str | None, epoch: int, reason: str) -> None:
        current = _need(self.fleet).assignment(spec.id)
        if (
            current is not None
            and current.state is AssignmentState.PENDING
            and current.reason == reason
            and current.epoch == epoch
        ):
            return  # still waiting for the same reason: no write, no update to the fleet
        entry = assignment_entry(
            spec, pin or "", central=self.central.central_id, epoch=epoch,
            replacement=False, score=0.0, at=self.clock(), reason=reason,
            state=AssignmentState.PENDING, pin=pin, lease=self._lease_of(spec.id),
        )  # fmt: skip
        _need(self.fleet).assign(spec.id, entry)

    # --- services (central/services.py) ---------------------------------------------------

    async def apply_service(self, spec: ServiceSpec) -> dict[str, Any]:
        """Create or change a service; journaled before this returns."""
        async with self._lock:
            self.sync_index()
            self.services.apply(spec)
            self._wake.set()
        return await self._service_answer(spec.name)

    async def scale_service(self, name: str, replicas: int) -> dict[str, Any]:
        async with self._lock:
            self.sync_index()
            self.services.scale(name, replicas)
            self._wake.set()
        return await self._service_answer(name)

    async def delete_service(self, name: str) -> dict[str, Any]:
        async with self._lock:
            self.sync_index()
            self.services.delete(name)
            self._wake.set()
        return await self._service_answer(name)

    async def report_service_load(
        self, name: str, load: float, at: float | None = None
    ) -> dict[str, Any]:
        async with self._lock:
            report = self.services.report_load(name, load, at)
        await _need(self._fleet_journal).flushed()
        return {"name": name, "load": report.load, "at": report.at}

    async def _service_answer(self, name: str) -> dict[str, Any]:
        await _need(self._fleet_journal).flushed()  # the service on disk
        self.sync_index()
        view = self.services.view(name)
        if view is None:  # (deleted and gone already)
            raise ServiceRefused(404, "name", f"no service {name!r}")
        return view

    async def migrate(self, task_id: str, target: str) -> dict[str, Any]:
        """Move an active task to ``target``: a new placement epoch there now, and, once the
        target runs it, a stop order for the copy where it ran (make before break: the node
        stops it when it hears; a cut-off node on heal). If the target cannot run it, the task
        is placed back where it runs, with the reason. The target must be online and able to
        take it."""
        fleet = _need(self.fleet)
        async with self._lock:
            entry = fleet.assignment(task_id)
            if entry is None:
                raise TaskRefused(404, "id", f"no task {task_id!r}")
            if not entry.active:
                raise TaskRefused(409, "id", f"task {task_id!r} is {entry.state}")
            source = entry.node
            if target == source:
                raise TaskRefused(409, "node", f"task {task_id!r} already runs on {target}")
            spec = entry.task_spec
            self.sync_index()
            choice = self._choose([spec], {spec.id: target})[spec.id]
            if choice.node_id is None:
                raise TaskRefused(422, "node", choice.reason)
            reason = f"migrated from {source} by the operator: {choice.reason}"
            self._move(task_id, entry, choice, reason, self.clock())
            self._event("migrated", f"{task_id}: {source} -> {target}", node=target, task=task_id)
            self.sync_index()  # projected now (see submit)
        await _need(self._fleet_journal).flushed()  # the assignment on disk
        moved = fleet.assignment(task_id)
        assert moved is not None
        return self.task_view(task_id, moved)

    async def cancel(self, task_id: str) -> dict[str, Any]:
        fleet = _need(self.fleet)
        async with self._lock:
            entry = fleet.assignment(task_id)
            if entry is None:
                self.sync_index()
                if task_id in self.index.holders:
                    life = self.lifecycle_of(task_id, None)
                    raise TaskRefused(
                        409,
                        "id",
                        f"{task_id} was decided by node {life.node}, not placed by central: "
                        "cancel it at that node (DELETE /v1/tasks/{id} on its API)",
                    )
                raise TaskRefused(404, "id", f"no task {task_id!r}")
            life = self.lifecycle_of(task_id, entry)
            if life.phase in (Phase.EXITED, Phase.FAILED):
                code = "" if life.exit_code is None else f", exit code {life.exit_code}"
                raise TaskRefused(
                    409, "id", f"{task_id} has already finished ({life.phase.value}{code})"
                )
            if entry.state is not AssignmentState.CANCELLED:
                fleet.assign(
                    task_id, replace(entry, state=AssignmentState.CANCELLED, at=self.clock())
                )
                self._event("cancelled", f"{task_id} cancelled", task=task_id)
                self.sync_index()  # projected now (see submit)
        await _need(self._fleet_journal).flushed()  # the assignment on disk
        entry = fleet.assignment(task_id)
        assert entry is not None
        return self.task_view(task_id, entry)

    def reach(self, node_id: str) -> Reach:
        """A node's link as the lifecycle reads it (:func:`edgesched.core.lifecycle.lifecycle`)."""
        status = self.liveness.nodes.get(node_id)
        return Reach(self.node_state(node_id), None if status is None else status.since)

    def lifecycle_of(
        self,
        task_id: str,
        entry: AssignmentEntry | None,
        reports: Mapping[str, TaskReport] | None = None,
    ) -> Lifecycle:
        """The task's one record, from central's assignment (None: a node decided it) and
        every node's copy (``reports``: the index's, when the caller has read them)."""
        assigned = (
            None
            if entry is None
            else Assigned(
                node=entry.node or None,
                epoch=entry.epoch,
                cancelled=entry.state is AssignmentState.CANCELLED,
                at=entry.at,
                decided_by=entry.central,
                reason=entry.reason,
            )
        )
        copies = [
            Copy(
                node=node_id,
                state=report.state,
                updated_at=report.updated_at,
                epoch=None if report.assignment is None else report.assignment.epoch,
                exit_code=report.exit_code,
                restarts=report.restarts,
                decided_by=report.decided_by,
                accepted_at=report.accepted_at,
                started_at=report.started_at,
            )
            for node_id, report in (
                self.index.copies_of(task_id) if reports is None else reports
            ).items()
            if (report.assignment is None) == (entry is None)
        ]
        return lifecycle(assigned, copies, self.reach)

    def task_ids(self) -> Sequence[str]:
        """Every task central knows, in id order: those it placed and those the nodes decided
        (the index keeps them sorted)."""
        return self.index.task_ids

    def node_task_ids(self, node_id: str) -> list[str]:
        """The tasks central assigns ``node_id`` and those it reports (any state), unsorted:
        ``GET /v1/tasks?node=`` looks at these, not at every task."""
        own = set(self.index.assigned.get(node_id, ()))
        member = self.index.members.get(node_id)
        if member is not None:
            own.update(member.reports)
        return list(own)

    def recent_events(
        self, limit: int, kinds: frozenset[str] | None = None, *, notable: bool = False
    ) -> list[Event]:
        """The last ``limit`` events (oldest first) of ``kinds`` (None: any), from the ring of
        notable events or of every event; both rings, merged, when ``kinds`` names any
        notable kind, so a filter never misses one a burst of placements pushed out."""

        def wanted(event: Event) -> bool:
            return kinds is None or event.kind in kinds

        if notable:
            out = [e for e in self.notable if wanted(e)]
        else:
            out = [e for e in self.events if wanted(e)]
            if kinds is None or kinds - ROUTINE_EVENTS:  # the notable ones pushed out before
                held = {id(e) for e in self.events}
                older = itertools.takewhile(lambda e: id(e) not in held, self.notable)
                out = [e for e in older if wanted(e)] + out
        return out[-limit:] if limit else []

    def any_task_view(self, task_id: str) -> dict[str, Any] | None:
        """:meth:`task_view` of a task central placed, :meth:`local_task_view` of one a node
        decided, or None if central knows no such task."""
        entry = self.index.assignments.get(task_id)
        if entry is not None:
            return self.task_view(task_id, entry)
        if task_id in self.index.holders:
            return self.local_task_view(task_id)
        return None

    def local_task_view(self, task_id: str) -> dict[str, Any]:
        """A task a node decided (submitted at its API, or placed by it while cut off): its
        lifecycle and its copies; no assignment of central's."""
        copies = self.index.copies_of(task_id)
        life = self.lifecycle_of(task_id, None, copies)
        return {
            "id": task_id,
            "state": None,
            "node": life.node,
            "epoch": None,
            "replacement": None,
            "score": None,
            "reason": None,
            "decided_by": life.decided_by,  # edge-connected or edge-autonomous
            "lease": None,
            "at": None,
            "spec": None,  # (central holds no spec of a task a node decided)
            **_lifecycle_fields(life),
            "copies": {
                n: {"state": c.state.value, "epoch": None, "updated_at": c.updated_at}
                for n, c in copies.items()
                if c.assignment is None
            },
            "running_on": sorted(n for n, c in copies.items() if c.assignment is None and c.active),
        }

    def task_view(self, task_id: str, entry: AssignmentEntry) -> dict[str, Any]:
        """An assignment with what the nodes report of it (the copies, by node), and the
        task's lifecycle (``phase`` and the rest: :func:`lifecycle`)."""
        copies: dict[str, TaskReport] = {
            node_id: held
            for node_id, held in self.index.copies_of(task_id).items()
            if held.assignment is not None
        }
        return {
            "id": task_id,
            "state": entry.state.value,
            **_lifecycle_fields(self.lifecycle_of(task_id, entry, copies)),
            "node": entry.node or None,
            "epoch": entry.epoch,
            "replacement": entry.replacement,
            "score": entry.score,
            "reason": entry.reason,
            "decided_by": entry.central,
            "lease": entry.lease,
            "at": entry.at,
            "spec": entry.spec.to_json(),
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
        swept_at: float | None = None  # (time.monotonic) when the last step began
        settled_at = time.monotonic()
        while True:
            await wait_event(self._wake, self.central.cycle_s)
            self._wake.clear()
            async with self._lock:
                began = time.monotonic()
                if held_between(swept_at, began, self.central.cycle_s):
                    # the loop was held (a stall of ours, not the nodes'): what they sent
                    # meanwhile is still unread, so nobody's silence counts it
                    assert swept_at is not None
                    log.warning(
                        "no control step for %.1f s (central's event loop was held): every "
                        "node's silence starts over",
                        began - swept_at,
                    )
                    self.liveness.start_over(self.clock())
                swept_at = began
                self.control_step()
            if time.monotonic() - settled_at >= YOUNG_SETTLE_S:
                settled_at = time.monotonic()
                self.settle_young()
            if self._acted and self.index.backlog:  # a recheck of the whole fleet, a slice
                self._wake.set()  # a step: the next at once, once the loop has served what
                await asyncio.sleep(0)  # is waiting (not while another replica acts)
            self.loop_turns += 1

    def control_step(self) -> None:
        """Place waiting tasks, fail services over, settle tasks placed twice, forget finished
        assignments, park and wake: the leading central replica only. Incremental: each
        stage asks the fleet index for what is due. Synchronous: every write lands in the
        policy document (journaled by its own task) at once."""
        self.liveness.sweep(self.clock())  # nodes silent too long: offline, even with no will
        self.sync_index()
        acting, mine = self._acting()
        self._acted = acting
        if not acting:
            self.services.take_changes()  # (the acting replica reconciles them)
            return
        now = self.clock()
        self.services.step(now, mine)  # replicas started and stopped; placed below if waiting
        self._place_waiting(now, mine)
        self.sync_index()
        if self._migrations:
            self._finish_migrations(now)
            self.sync_index()
        if self._take_up and self._take_up[0][0] <= now:
            self._check_take_up(now, mine)
            self.sync_index()
        self._reconcile(now, mine)
        self.sync_index()
        if mine is None or mine.fleet_wide:
            if self.central.park_nodes:
                self._power_step(now)
            else:
                self._wake_parked(now)
        self._prune(now, mine)
        self.sync_index()
        self.index.sum_footprints()  # O(changed nodes); moved rows wait for a placement

    def _finish_migrations(self, now: float) -> None:
        """Migrations whose target has answered: the source's copy ordered stopped once the
        target's runs; the task placed back on the source if the target's failed (it kept
        running there all along); waiting otherwise."""
        fleet = _need(self.fleet)
        for task_id, move in list(self._migrations.items()):
            entry = self.index.assignments.get(task_id)
            if (
                entry is None
                or not entry.active
                or (entry.node, entry.epoch)
                != (
                    move.target,
                    move.epoch,
                )
            ):
                del self._migrations[task_id]  # cancelled, failed over, moved again
                continue
            copy = self.index.copies_of(task_id).get(move.target)
            if copy is None or copy.assignment is None or copy.assignment.epoch != move.epoch:
                continue  # not taken up yet
            if copy.state is TaskState.RUNNING:
                fleet.order_stop(
                    task_id,
                    move.source,
                    StopOrder(epoch=move.source_epoch, winner=move.target, at=now,
                              reason=f"migrated to {move.target}",
                              lease=self._lease_of(task_id)),
                )  # fmt: skip
                del self._migrations[task_id]
            elif copy.state.terminal:
                spec = entry.task_spec
                fleet.assign(
                    task_id,
                    assignment_entry(
                        spec, move.source, central=self.central.central_id,
                        epoch=move.epoch + 1, replacement=False, score=entry.score, at=now,
                        reason=f"migration to {move.target} failed ({copy.state.value}): "
                        f"kept on {move.source}",
                        lease=self._lease_of(task_id),
                    ),
                )  # fmt: skip
                self._event("migration-failed", f"{task_id}: stays on {move.source}",
                            node=move.source, task=task_id)  # fmt: skip
                del self._migrations[task_id]

    def _leases_changed(self, owned: Mapping[int, int]) -> None:
        """What the leases allow changed (a shard gained or lost, the local deadline passed,
        a keepalive answered after it): wake the control loop, and log one structured line
        with both clocks, so a test (or an operator) can rebuild who could act on which shard
        with which token when. The engine acts on a subset of these intervals (``_acting``:
        only at a step, and only while the lease stays valid ``LEASE_GUARD_S`` longer)."""
        self._wake.set()
        record = {
            "replica": self.central.central_id,
            "mono": time.monotonic(),
            "wall": self.clock(),  # the clock decisions are stamped with (`at`)
            "tokens": {str(s): t for s, t in sorted(owned.items())},
        }
        log.info("shards held %s", json.dumps(record, separators=(",", ":")))

    def _lease_of(self, task_id: str) -> int:
        """The fencing token a decision about ``task_id`` is written under (0: no leases)."""
        if self.leases is None:
            return 0
        return self.leases.owned().get(shard_of(task_id, self.leases.shards), 0)

    def _handed_over(self, held: frozenset[int]) -> frozenset[int]:
        """Of the shards ``held``, those this replica may act on: a shard just gained waits
        until the fleet document has had a full answer (y-sync step 2, asked for at the
        gain) from every other live replica, so it holds what the former owner wrote before
        it let go. Without that, a replica back from a partition acts on its stale copy:
        work the other placed meanwhile looks pending to it and is placed twice. After
        :data:`HANDOVER_MAX_S` without every answer it acts anyway (a replica reaching
        etcd but not the broker must not stall its shards); a shard lost drops out."""
        peer = self._fleet_peer
        assert self.leases is not None
        if peer is None:
            return held
        now = peer.clock()
        for shard in list(self._handover):
            if shard not in held:
                del self._handover[shard]
        gained = held - self._owned - self._handover.keys()
        if gained:
            self._handover.update(dict.fromkeys(gained, now))
            peer.request_resync()
        others = set(self.leases.members) - {self.central.central_id}
        for shard, since in list(self._handover.items()):
            if all(peer.synced_at.get(o, -math.inf) > since for o in others):
                del self._handover[shard]
            elif now - since > HANDOVER_MAX_S:
                log.warning("shard %d: no full answer from %s in %gs; acting anyway",
                            shard, ", ".join(sorted(others)), HANDOVER_MAX_S)  # fmt: skip
                del self._handover[shard]
        return held - self._handover.keys()

    def _acting(self) -> tuple[bool, Shards | None]:
        """Whether this replica acts now, and on which tasks (None: the whole fleet).

        Without etcd, the leading replica (smallest live id) acts for everything. With
        etcd, a replica acts on the tasks of the shards it holds a lease on (a task's
        shard: :func:`~edgesched.central.leases.shard_of` its id), and the holder of shard
        0 also runs the fleet-wide power stage; it acts only while its lease stays valid
        for :data:`LEASE_GUARD_S` more, so no step outlives the lease that allowed it. A
        replica that gains a shard looks again at everything (what the former owner left)."""
        if self.leases is None:
            leader = self.peers.is_leader()
            if leader != self._was_leader:
                self._was_leader = leader
                self._event("leader", f"{self.peers.leader()} leads the central replicas")
                if leader:
                    self.index.recheck_all()  # what the former leader settled may have moved
                    self._placed_version = -1
            return leader, None
        owned = frozenset(self.leases.owned())
        if self.leases.valid_for() < LEASE_GUARD_S:
            owned = frozenset()
        owned = self._handed_over(owned)
        if owned != self._owned:
            gained = owned - self._owned
            self._event(
                "shards",
                f"{self.central.central_id} acts on {len(owned)} of {self.leases.shards} shards"
                + (f" (gained {len(gained)})" if gained else ""),
            )
            self._owned = owned
            if gained:
                self.index.recheck_all()
                self._placed_version = -1
        if not owned:
            return False, None
        return True, Shards(owned, self.leases.shards)

    def _place_waiting(self, now: float, mine: Shards | None = None) -> None:
        """Waiting tasks and services to fail over (of this replica's shards), placed in one
        batch of the core; tried again only when what a placement sees has changed."""
        index = self.index
        failover = [t for t in index.failover_candidates(now) if not self._runs_elsewhere(t)]
        if index.version == self._placed_version and not failover:
            return
        fleet = _need(self.fleet)
        entries = {t: index.assignments[t] for t in sorted(index.pending)}
        entries |= {t: index.assignments[t] for t in failover}
        if mine is not None:
            entries = {t: e for t, e in entries.items() if mine(t)}
        if not entries:
            self._placed_version = index.version
            return
        specs = [e.task_spec for e in entries.values()]
        pins = {t: (e.pin or None) if t in index.pending else None for t, e in entries.items()}
        choices = self._choose(specs, pins)
        with fleet.doc.transaction():  # the batch's decisions: one update of the fleet
            self._write_placements(now, specs, entries, choices)
        self.sync_index()
        self._placed_version = index.version

    def _runs_elsewhere(self, task_id: str) -> bool:
        """Whether a fresh node runs ``task_id`` at a later placement epoch than central's
        assignment (a cut-off site's coordinator failed it over): the reconcile step adopts
        that copy, so central does not fail the task over a second time."""
        entry = self.index.assignments.get(task_id)
        if entry is None:
            return False
        for node_id, report in self.index.copies_of(task_id).items():
            a = report.assignment
            if (
                node_id in self.index.fresh
                and a is not None
                and a.epoch > entry.epoch
                and report.state in (TaskState.RUNNING, TaskState.PLACED)
            ):
                return True
        return False

    def _write_placements(
        self,
        now: float,
        specs: list[TaskSpec],
        entries: Mapping[str, AssignmentEntry],
        choices: Mapping[str, Choice],
    ) -> None:
        fleet = _need(self.fleet)
        index = self.index
        for spec in specs:
            entry = entries[spec.id]
            choice = choices[spec.id]
            if spec.id in index.pending:
                self._decided(spec, choice, pin=entry.pin or None, epoch=entry.epoch,
                              replacement=False)  # fmt: skip
                continue
            if choice.node_id is None:
                continue  # nowhere to go: it stays with its node, which may come back
            old = entry.node
            epoch = entry.epoch + 1
            fleet.assign(
                spec.id,
                assignment_entry(
                    spec, choice.node_id, central=self.central.central_id, epoch=epoch,
                    replacement=True, score=choice.score, at=now,
                    reason=f"failed over from {old} (offline): {choice.reason}",
                    lease=self._lease_of(spec.id),
                ),
            )  # fmt: skip
            self._event("failover", f"{spec.id}: {old} -> {choice.node_id} (epoch {epoch})",
                        node=choice.node_id, task=spec.id)  # fmt: skip
            self._await_take_up(spec.id, choice.node_id, epoch, now)

    def _prune(self, now: float, mine: Shards | None = None) -> None:
        """Forget assignments finished (or cancelled) longer than the retention ago."""
        fleet = _need(self.fleet)
        self.index.recheck_some(RECHECK_PER_STEP)
        done = [t for t in self.index.forgettable(now) if mine is None or mine(t)]
        with fleet.doc.transaction():
            for task_id in done:
                fleet.drop_assignment(task_id)
        if done:
            self._event("pruned", f"{len(done)} finished assignments forgotten")

    def _wake_parked(self, now: float) -> None:
        """Parking is off (or was turned off): wake any node still parked, once."""
        fleet = _need(self.fleet)
        for node_id in sorted(self.index.parked):
            standing = self.index.orders.get(node_id)
            if standing is None or standing.state != "active":
                fleet.set_power(
                    node_id, PowerOrder(state="active", reason="parking is off", at=now)
                )
                self._event("wake", f"{node_id}: parking is off", node=node_id)

    def _power_step(self, now: float) -> None:
        """Park idle nodes beyond what the forecast needs, wake nodes ahead of a peak or for
        waiting work (the core's power stage over the fleet; energy and learned modes). Runs
        when what it sees changed, and every POWER_EVERY_S for the idle timers."""
        index = self.index
        version, at = self._power_at
        if version == index.version and now - at < POWER_EVERY_S:
            return
        fleet = _need(self.fleet)
        table = index.table()
        waiting = [index.assignments[t].task_spec.to_task(now) for t in sorted(index.pending)]
        cluster = ClusterView(table.nodes, (), now, forecast_cpu=self.forecast_cpu, table=table)
        busy = {table.nodes[row].id for row, placed in enumerate(table.on_node) if placed}
        reports = {n: m.power for n, m in index.members.items()}
        config = self._policy_config()
        orders, moves = power_plan(cluster, busy, waiting, config, index.orders, reports)
        with fleet.doc.transaction():
            for order in orders:
                fleet.set_power(order.node_id, order.to_order())
                verb = "park" if order.state == PARKED else "wake"
                self._event(verb, f"{order.node_id}: {order.reason}", node=order.node_id)
            by_source: dict[str, list[Move]] = {}
            for move in moves:
                by_source.setdefault(move.source, []).append(move)
            for source_moves in by_source.values():
                self._consolidate(source_moves, now)
        self.sync_index()
        self._power_at = (index.version, now)

    def _consolidate(self, moves: Sequence[Move], now: float) -> None:
        """Carry out the core's consolidation moves off one node: each a service's replica
        migrated make-before-break (its target runs it, then its source stops it). All or
        none: the moves empty the node for parking, and one that cannot be made (the target
        no longer takes it; a replica of a service spread across domains, which the operator
        asked to keep apart) leaves the node busy anyway."""
        planned: list[tuple[Move, AssignmentEntry, Choice]] = []
        entries = self.services.entries()
        for move in moves:
            entry = self.index.assignments.get(move.task_id)
            ref = parse_replica_id(move.task_id)
            service = None if ref is None else entries.get(ref.service)
            if (
                entry is None
                or not entry.active
                or entry.node != move.source
                or move.task_id in self._migrations
                or service is None
                or service.service.spread.across
            ):
                return
            spec = entry.task_spec
            choice = self._choose([spec], {spec.id: move.target})[spec.id]
            if choice.node_id is None:
                return
            planned.append((move, entry, choice))
        for move, entry, choice in planned:
            self._move(move.task_id, entry, choice, f"{move.reason}: {choice.reason}", now)
            self._event(
                "migrated", f"{move.task_id}: {move.source} -> {move.target} ({move.reason})",
                node=move.target, task=move.task_id,
            )  # fmt: skip

    def _move(
        self, task_id: str, entry: AssignmentEntry, choice: Choice, reason: str, now: float
    ) -> None:
        """Place an active task on ``choice``'s node under a new epoch, and stop its copy on
        the node it leaves once the new one runs (:meth:`_finish_migrations`)."""
        assert choice.node_id is not None
        source, epoch = entry.node, entry.epoch
        _need(self.fleet).assign(
            task_id,
            assignment_entry(
                entry.task_spec, choice.node_id, central=self.central.central_id,
                epoch=epoch + 1, replacement=False, score=choice.score, at=now, reason=reason,
                lease=self._lease_of(task_id),
            ),
        )  # fmt: skip
        if source:
            self._migrations[task_id] = _Migration(source, epoch, choice.node_id, epoch + 1)
        self._await_take_up(task_id, choice.node_id, epoch + 1, now)

    def _reconcile(self, now: float, mine: Shards | None = None) -> None:
        with _need(self.fleet).doc.transaction():  # one update of the fleet for the step
            self._settle(now, mine)

    def _settle(self, now: float, mine: Shards | None) -> None:
        fleet = _need(self.fleet)
        index = self.index
        for settled in index.settlements(self.reconcile_policy, limit=RECHECK_PER_STEP):
            if mine is not None and not mine(settled.task_id):
                continue
            if settled.task_id in self._migrations:
                # the operator's move: its target's copy is not running yet; once it is, the
                # source is ordered stopped (_finish_migrations) and there is nothing to settle
                continue
            best = settled.winner
            if best is None:  # cancelled at central: its copies elsewhere stop
                for loser in settled.losers:
                    fleet.order_stop(
                        settled.task_id,
                        loser.node_id,
                        StopOrder(epoch=loser.epoch, winner="", at=now,
                                  reason="cancelled at central",
                                  lease=self._lease_of(settled.task_id)),
                    )  # fmt: skip
                self._event(
                    "reconciled",
                    f"{settled.task_id} was cancelled: "
                    f"{', '.join(c.node_id for c in settled.losers)} stop their copies",
                    task=settled.task_id,
                )
                continue
            entry = index.assignments[settled.task_id]
            if entry.node != best.node_id:
                fleet.assign(
                    settled.task_id,
                    replace(entry, node=best.node_id, epoch=max(entry.epoch, best.epoch) + 1,
                            replacement=best.replacement, at=now,
                            reason=f"kept on {best.node_id} by {settled.policy.value}",
                            central=self.central.central_id,
                            lease=self._lease_of(settled.task_id)),
                )  # fmt: skip
            for loser in settled.losers:
                fleet.order_stop(
                    settled.task_id,
                    loser.node_id,
                    StopOrder(epoch=loser.epoch, winner=best.node_id, at=now,
                              reason=f"{best.node_id} keeps it ({settled.policy.value})",
                              lease=self._lease_of(settled.task_id)),
                )  # fmt: skip
            if not settled.losers:
                self._event(
                    "reconciled",
                    f"{settled.task_id} runs on {best.node_id}, placed there by "
                    f"{best.decided_by} (epoch {best.epoch}) while central could not reach "
                    f"it: central's assignment follows it",
                    node=best.node_id,
                    task=settled.task_id,
                )
                continue
            self._event(
                "reconciled",
                f"{settled.task_id} placed on {[c.node_id for c in (best, *settled.losers)]}: "
                f"{best.node_id} keeps it, "
                f"{', '.join(c.node_id for c in settled.losers)} stop ({settled.policy.value})",
                node=best.node_id,
                task=settled.task_id,
            )
        # Stop orders are done once the loser reports its copy no longer active.
        for key in index.stops_done():
            task_id, _, node_id = key.rpartition("@")
            if mine is None or mine(task_id):
                fleet.drop_stop(task_id, node_id)

    # --- the 15-minute forecast and the models --------------------------------------------

    def _policy_config(self) -> PolicyConfig:
        """The fleet policy, with the placement model injected when in ``learned`` mode."""
        models: ActiveModels = _need(self.models)
        return models.policy(self.config.policy)

    async def _seed_demand(self) -> None:
        """The demand history a previous run saved, and the forecast from it at once: a
        restarted central's prior, so the power stage does not plan on an empty forecast
        (and park what the next minutes need) until its first 5-minute bin closes. The
        heuristic forecasts every class here (the fleet's capacity is not known yet); the
        first closed bin replaces it."""
        saved = await self.store.get_meta("class_demand")
        if saved:
            try:
                self.demand = ClassDemand.from_json(json.loads(saved))
            except ValueError as exc:
                log.error("dropping the saved demand history: %s", exc)
                return
            self.forecast_cpu = _need(self.models).peak(self.demand, 0.0)

    async def _forecast_loop(self) -> None:
        while True:
            await asyncio.sleep(DEMAND_SAMPLE_S)
            async with self._lock:
                try:
                    closed = self.observe_demand()
                except ValueError as exc:  # a forecast is advice: never let it stop central
                    log.error("demand forecast skipped: %s", exc)
                    continue
                try:
                    self.fleet_series.observe(self.fleet_sample())
                except ValueError as exc:  # (as the forecast: a view, never a stop)
                    log.error("fleet sample skipped: %s", exc)

            if closed:
                with contextlib.suppress(StoreError):
                    await self.store.set_meta("class_demand", json.dumps(self.demand.to_json()))

    def observe_demand(self) -> bool:
        """Sample what each workload class asks of the fleet now (CPU of its placed and
        waiting tasks); on each closed 5-minute bin, forecast the fleet's next 15 minutes with
        the per-class model. True when a bin closed."""
        self.sync_index()
        index = self.index
        table = index.table()
        now = self.clock()
        asked = self._asked_by_class()
        if not self.demand.observe(now, asked):
            return False
        capacity = float(table.capacity[:, 0].sum()) if len(table) else 0.0
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

    def _asked_by_class(self) -> dict[str, float]:
        """CPU each workload class asks of the fleet now: its placed and running tasks' (the
        table's usage) and its waiting ones'. The index is brought up to date by the caller."""
        index = self.index
        asked = {w: cpu for w, cpu in index.table().usage.items() if cpu > 1e-9}
        for task_id in index.pending:
            spec = index.assignments[task_id].task_spec
            asked[spec.workload] = asked.get(spec.workload, 0.0) + spec.cpu
        # each capped (a spec's cpu is only checked finite: a few of 1e308 summed to infinity,
        # which the fleet series then served as JSON's non-standard Infinity)
        return {w: min(cpu, MAX_DEMAND) for w, cpu in asked.items()}

    def fleet_sample(self) -> FleetSample:
        """The fleet now (:class:`FleetSample`): the nodes' latest telemetry (heard within
        ``TELEMETRY_FRESH_S``), the index's demand and capacity, the tidal window. O(nodes)."""
        self.sync_index()
        index = self.index
        table = index.table()
        now = self.clock()
        capacity = float(table.capacity[:, 0].sum()) if len(table) else 0.0
        demand = sum(self._asked_by_class().values())
        weighted = cores = power = 0.0
        measured = 0
        for node_id, member in index.members.items():
            latest = self.telemetry.latest(node_id)
            if latest is None or now - latest.at > TELEMETRY_FRESH_S:
                continue
            measured += 1
            power += latest.power_w
            if member.registration is not None:
                weighted += latest.cpu_util * member.registration.cpu
                cores += member.registration.cpu
        tidal = self.config.policy.tidal
        window = tidal.window_at(now)
        return FleetSample(
            at=now,
            util=weighted / cores if cores > 0 else None,
            power_w=power,
            demand_cpu=demand,
            capacity_cpu=capacity,
            forecast_cpu=self.forecast_cpu,
            window=None if window is None else window.name,
            shares=tidal.shares_at(now),
            used={w: cpu / capacity for w, cpu in table.usage.items() if capacity > 0 and cpu},
            nodes_measured=measured,
        )

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
        self.sync_index()
        return self.index.usable()

    def fleet_placements(self) -> tuple[Placement, ...]:
        self.sync_index()
        return self.index.placements()

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

    def node_summaries(self) -> list[dict[str, Any]]:
        """:meth:`node_summary` of every node, in id order (the index brought up to date
        once, not per node)."""
        self.sync_index()
        return [self._node_summary(n) for n in sorted(self.replicas.replicas)]

    def node_summary(self, node_id: str) -> dict[str, Any]:
        self.sync_index()
        return self._node_summary(node_id)

    def _node_summary(self, node_id: str) -> dict[str, Any]:
        replica = self.replicas.replicas[node_id]
        doc = replica.doc
        member = self.index.members.get(node_id)  # the index's copy: no thaw of a cold replica
        if member is not None:  # (kept by the index as reports change)
            states = {state: n for state, n in sorted(member.states.items()) if n}
        else:
            states = {}
            for report in doc.tasks().values():
                states[report.state.value] = states.get(report.state.value, 0) + 1
        status = self.liveness.nodes.get(node_id)
        latest = self.telemetry.latest(node_id)
        heard = replica.peer.heard_at.get(node_id)
        registration = member.registration if member is not None else doc.registration()
        return {
            "id": node_id,
            "status": self.liveness.state(node_id),
            "state": self.node_state(node_id),
            "status_since": None if status is None else status.since,
            "status_cause": None if status is None else status.cause,
            "registration": None if (reg := registration) is None else reg.to_entry(),
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

    def _fleet_hash(self) -> str | None:
        """The fleet document's content hash for the status, None past
        :data:`STATUS_HASH_MAX_ENTRIES` entries (it hashes the whole document: ~14 s of
        central's loop at 10,000 nodes, 700,000 assignments, on every change)."""
        if self.fleet is None:
            return None
        index = self.index
        entries = len(index.assignments) + len(index.stops) + len(index.orders)
        return None if entries > STATUS_HASH_MAX_ENTRIES else self.fleet.content_hash()

    def refused_by_channel(self) -> dict[str, dict[str, int]]:
        """Channel → reason → input refused since start: the sync channels (``node``: the
        nodes' documents, ``policy``, ``fleet``, ``desired``: the nodes' desired-state
        documents) by :data:`~edgesched.sync.peer.REFUSAL_REASONS` and ``schema`` (entries
        their schema refused), ``status`` and ``telemetry`` messages."""
        replicas = self.replicas.replicas.values()
        desired = {} if self.desired is None else self.desired.docs
        channels: dict[str, tuple[list[dict[str, int]], list[SyncedDoc]]] = {
            "node": ([r.peer.stats for r in replicas], [r.doc for r in replicas]),
            "policy": ([], [] if self.policy is None else [self.policy]),
            "fleet": ([], [] if self.fleet is None else [self.fleet]),
            "desired": (
                [] if self.desired is None else [p.stats for p in self.desired.peers.values()],
                list(desired.values()),
            ),
        }
        for name, peer in self._central_peers.items():
            channels["policy" if name == POLICY_DOC else "fleet"][0].append(peer.stats)
        out: dict[str, dict[str, int]] = {}
        for channel, (stats, docs) in channels.items():
            out[channel] = refusals(stats)
            out[channel]["schema"] = sum(sum(d.refusals.by_kind().values()) for d in docs)
        out["node"]["unknown_document"] = self.replicas.stats["refused_unknown"]
        out["status"] = {"malformed": self.liveness.rejected}
        out["telemetry"] = {"malformed": self.telemetry.rejected}
        return out

    def status(self) -> dict[str, Any]:
        peers = [r.peer.stats for r in self.replicas.replicas.values()]
        by_channel = self.refused_by_channel()
        sync_channels = ("node", "policy", "fleet", "desired")
        rejected = {
            f"rejected_{plural}": sum(by_channel[c][reason] for c in sync_channels)
            for reason, plural in (
                ("frame", "frames"),
                ("payload", "payloads"),
                ("update", "updates"),
                ("sender", "senders"),
            )
        }
        rejected["rejected_authorship"] = sum(by_channel[c]["authorship"] for c in sync_channels)
        rejected["unknown_documents"] = self.replicas.stats["refused_unknown"]
        rejected["status_messages"] = self.liveness.rejected
        rejected["telemetry"] = self.telemetry.rejected
        refused: Counter[str] = Counter()
        docs: list[SyncedDoc] = [r.doc for r in self.replicas.replicas.values()]
        docs += [d for d in (self.policy, self.fleet) if d is not None]
        docs += [] if self.desired is None else list(self.desired.docs.values())
        for doc in docs:
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
            "shards": None
            if self.leases is None
            else {
                "count": self.leases.shards,
                "owned": sorted(self._owned),
                "handing_over": sorted(self._handover),
                "tokens": {str(s): t for s, t in sorted(self.leases.owned().items())},
                "members": sorted(self.leases.members),
                "lease_valid_for_s": round(self.leases.valid_for(), 3),
                "etcd_connected": self.leases.connected,
            },
            "centrals_alive": self.peers.alive(),
            "policy_hash": None if self.policy is None else self.policy.content_hash(),
            "fleet_hash": self._fleet_hash(),
            "desired_documents": 0 if self.desired is None else len(self.desired.docs),
            "index": dict(self.index.stats()),
            "updates_in": sum(p["updates_in"] + p["step2_in"] for p in peers),
            "rejected": rejected,
            "refused": by_channel,
            "refused_entries": dict(sorted(refused.items())),
        }

    def refresh_metrics(self) -> None:
        """Hand the metrics what is read at scrape time (``GET /metrics``)."""
        status = self.status()
        self.metrics.scrape(
            nodes=node_state_counts(
                self.replicas.replicas,
                self.liveness.nodes,
                self.clock(),
                self.central.failover_after_s,
                self.central.dead_after_s,
            ),
            online=status["online"],
            broker_connected=status["broker_connected"],
            rejected=status["rejected"],
            refused=status["refused"],
        )


#: How many changed tasks one pass of :meth:`CentralEngine.record_history` looks at (the
#: rest wait for the next pass, one snapshot interval later): at a start every task is due.
HISTORY_PER_PASS = 5_000
#: Tasks due for :meth:`CentralEngine.record_history` past which it sweeps every task the
#: index knows instead (a slice a pass), holding no set of them.
HISTORY_DUE_UP_TO = 50_000
#: Tasks :meth:`CentralEngine.record_history` looks at between two turns of the event loop.
HISTORY_PER_TURN = 250
#: Final phases: a task in one of them goes into central's history.
_FINAL = frozenset({Phase.EXITED.value, Phase.FAILED.value, Phase.CANCELLED.value})


@dataclass(frozen=True, slots=True)
class _Migration:
    source: str
    source_epoch: int
    target: str
    epoch: int


def _lifecycle_fields(life: Lifecycle) -> dict[str, Any]:
    """A task view's lifecycle fields (``phase`` is the task's state, fleet-wide)."""
    return {
        "phase": life.phase.value,
        "exit_code": life.exit_code,
        "restarts": life.restarts,
        "submitted_at": life.submitted_at,
        "started_at": life.started_at,
        "finished_at": life.finished_at,
        "origin": life.origin,
        "unknown_since": life.unknown_since,
    }


class _Tasks(Mapping[str, TaskReport]):
    """A node document's tasks, each decoded when asked for (the index asks only for the
    changed ones)."""

    def __init__(self, doc: NodeDoc) -> None:
        self.doc = doc

    def __getitem__(self, task_id: str) -> TaskReport:
        report = self.doc.task(task_id)
        if report is None:
            raise KeyError(task_id)
        return report

    def __iter__(self) -> Iterator[str]:
        return iter(self.doc.tasks())

    def __len__(self) -> int:
        return len(self.doc.tasks())


@dataclass(frozen=True)
class Shards:
    """The shards a replica holds leases on: which tasks are its to act on."""

    owned: frozenset[int]
    count: int

    def __call__(self, task_id: str) -> bool:
        return shard_of(task_id, self.count) in self.owned

    @property
    def fleet_wide(self) -> bool:
        """Whether this replica also runs the fleet-wide stages (the power stage)."""
        return 0 in self.owned


def _changed(
    keys: set[str] | None,
    every: Callable[[], Iterable[tuple[str, _E]]],
    read_one: Callable[[str], _E | None],
    held: Mapping[str, object],
) -> Iterator[tuple[str, _E | None]]:
    """The entries to tell the index of: those whose keys were drained, each decoded alone;
    or (``keys`` None: the whole map may have changed) every entry of the map, decoded one
    by one, then None for each key the index holds that the map no longer has."""
    if keys is not None:
        for key in sorted(keys):
            yield key, read_one(key)
        return
    seen = set()
    for key, entry in every():
        seen.add(key)
        yield key, entry
    for key in sorted(set(held) - seen):
        yield key, None


def _move_desired_state(policy: PolicyDoc, fleet: PolicyDoc) -> int:
    """Move the assignments, stops and power orders an older central kept in the policy
    document (which every node replicates) into the fleet document; returns how many."""
    moved = 0
    for root in POLICY_ROOTS:
        source = policy.root(root)
        keys = sorted(map(str, source.keys()))
        if not keys:
            continue
        target = fleet.root(root)
        with fleet.doc.transaction():
            for key in keys:
                if key not in target:
                    value = normalise(unpacked(source.get(key)))
                    kind = fleet.entry_kinds[root]
                    target[key] = (
                        fleet.pack_entry(value, kind) if isinstance(value, dict) else value
                    )
                    moved += 1
        with policy.doc.transaction():
            for key in keys:
                del source[key]
    return moved


def _is_replica(name: str) -> bool:
    """Whether document ``name`` is a node's document (central's replica of it)."""
    return name.startswith(NODE_DOC_PREFIX)


def _need(value: Any) -> Any:
    if value is None:
        raise RuntimeError("central engine not started")
    return value
