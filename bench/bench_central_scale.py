"""Central at fleet scale: the real engine against thousands of simulated nodes over Mosquitto.

Central is the real :class:`~edgesched.central.engine.CentralEngine` (no API), in a process of
its own per size (the harness's measuring code runs there too). The nodes are simulated in
separate processes (``--procs``), each multiplexing its share of the fleet over one MQTT
connection, speaking the real protocol with the project's own classes: each node holds its
own :class:`~edgesched.sync.doc.NodeDoc` (registration, power and model reports, 100 task
entries, ~70% carrying central's assignment) synced by its own
:class:`~edgesched.sync.peer.DocPeer` on ``edgesched/v1/doc/node-<id>/sync/<id>``, announces
itself with the retained status of :class:`~edgesched.edge.link.CentralLink` (and, when it is
cut off, the retained ``offline`` its last will would make the broker publish), publishes
telemetry, hears central's heartbeat, and follows central's assignments, which it reads from
its own replica of ``desired-<id>`` (central's projection of its ``fleet`` document for that
node), synced by the node's own DocPeer as a real node's (:class:`AssignmentFeed`): a new
assignment is started (a running ``TaskReport`` with its assignment) and exits ``--run-s``
later. The fleet-wide policy document (mode, tidal profile, models) is held once per simulator
process (every node holds the same replica of it; one copy stands for all of them), and each
node sends its own step 1 of it when it connects, marked as a real node's (``replies=True``).
As a real node's peers of central's documents (``DocPeer(..., listen_to=centrals)``), a
simulated node hears ``policy`` and its own ``desired-<id>`` from the centrals only: their
sender topics (``.../sync/<central>``: live updates, heard by every node) and its own reply
topics (``.../reply/<id>/<central>``: central's answers to its step 1s, heard by it alone). No
other node's frames of either reach it, and none are counted as received
(:func:`node_subscriptions`), so a node's policy bytes do not grow with the fleet. A simulator
whose loop dies (an exception while dispatching, say) exits at once and the size stops with
its name, not as a fleet that never comes up (:meth:`Simulator.ended`).

Per size: a seeder process writes central's SQLite as a central that ran this fleet before
leaves it (the ``fleet`` document with every assignment, each node's ``desired-<node>`` and
central's replica of each node's document, packed: the nodes register ``reads_packed``) and each
node's own document, which its simulated node restores as a restarted node does
(:func:`seed_state`); central starts through its real restart path (replicas, desired documents,
the index learning the fleet, ``DesiredDocs.match``) before it connects; then the fleet comes up
(every node fresh at central, every node's desired document answered by central, within
``--up-s``), then the measured window: submissions at central (``engine.submit``) at ``--rate``
per second for ``--steady-s``, then a heal of 10% of the fleet at once (offline ``--offline-s``,
then back, resyncing), then a drain. Printed, for each size and as a ratio of the largest size
to the smallest (100 nodes by default): control-step p50/p99 (the engine instance's
``control_step`` wrapped and timed), submit -> assignment seen by its node, heal -> converged
(central's replica fresh and byte-equal to the node's document, and the node's desired document
byte-equal to central's), node updates merged per second at central and how many the simulators
published that central never applied, central's RSS and CPU, the simulators' RSS and CPU, the
machine's load, payload bytes to and from each node scaled to an hour (by document both ways:
the policy apart), and what central logged at warning and error level. Each size has a
wall-clock budget; a size that overruns it is killed and printed as "did not finish within
budget" with what it measured so far.

    .venv/bin/python bench/bench_central_scale.py [--nodes 100,1000,10000] [--budget-s 900]
        [--rate 2] [--steady-s 30] [--offline-s 10] [--up-s 300] [--procs N]
        [--broker-log FILE] [--memory-breakdown] [--replica-cold-after-s S] [--pin-central]

``--memory-breakdown`` walks central's objects at the end and prints what holds them (each
object counted once, for the first holder walked; the index field by field, the documents'
Python side, each task of the loop), one node's two documents attribute by attribute, how
many string objects each task id is held as, and sizes pycrdt's side of the fleet document
and of a live replica by rebuilding them from their encoded states: ~1 minute at 10,000
nodes, and its own bookkeeping raises the RSS measured after it (the resident size printed
before the walk is the run's). ``--replica-cold-after-s`` sets central's
``[central] replica_cold_after_s`` (default: central's own). ``--pin-central`` gives
central's process the first CPU alone and every other process of the run the others: the
simulated fleet stands for thousands of gateways on machines of their own, and on a small
machine they otherwise take central's CPU in a heal.

``make bench`` runs the defaults. Run it from a scratch directory (``cd /tmp``): each size
works in a temporary directory of its own. :func:`memory_needed_gb` estimates what a size
needs and skips one that cannot fit (``--force``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import fcntl
import functools
import gc
import heapq
import json
import logging
import multiprocessing as mp
import os
import pickle
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiomqtt
import psutil
import pycrdt
from paho.mqtt.subscribeoptions import SubscribeOptions
from pycrdt import Map, YSyncMessageType

from edgesched.central.engine import CentralEngine
from edgesched.central.placement import assignment_entry
from edgesched.config import CentralConfig, EdgeschedConfig, MqttConfig
from edgesched.core.model import Arch, ServerClass
from edgesched.core.task import TaskSpec, TaskState
from edgesched.edge.link import CentralLink
from edgesched.localbroker import mosquitto_path
from edgesched.ports import free_port, wait_for_port
from edgesched.sync import peer as peer_module
from edgesched.sync import wire
from edgesched.sync.doc import (
    DESIRED_PREFIX,
    NodeDoc,
    PolicyDoc,
    client_id_for,
    desired_doc_name,
)
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentRef,
    ModelReport,
    PowerModel,
    PowerReport,
    Registration,
    TaskReport,
)
from edgesched.sync.security import queue_settings
from edgesched.sync.telemetry import Telemetry, telemetry_topic
from edgesched.sync.topics import HEARTBEAT_TOPIC

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pcap_mqtt  # (the bench directory's own module)
from loop_holds import HoldSampler  # (the bench directory's own module)

log = logging.getLogger("bench.central_scale")

CENTRAL_ID = "central"
#: The centrals a node follows (``EdgeConfig.centrals``): the only senders it hears of
#: central's documents (``policy``, its ``desired-<id>``).
CENTRALS: tuple[str, ...] = (CENTRAL_ID,)
SUBMISSION_PREFIX = "sub"
#: Mosquitto publishes its $SYS counters every this many seconds (the dropped-message count).
SYS_DROPPED = "$SYS/broker/publish/messages/dropped"
#: Submissions awaiting engine.submit at once; beyond it the schedule's tick is skipped.
MAX_SUBMITS_IN_FLIGHT = 50


@dataclass(frozen=True)
class Scale:
    """One size's workload and limits."""

    nodes: int
    tasks_per_node: int = 100
    assigned_share: float = 0.7  # task entries carrying central's assignment
    running_share: float = 0.4  # task entries still running (the rest exited)
    rate: float = 2.0  # submissions per second at central
    run_s: float = 5.0  # a task central assigned runs this long on its node, then exits
    churn_s: float = 30.0  # mean seconds between two exits of a node's own running tasks
    telemetry_s: float = 5.0  # the edge's default sample_s
    steady_s: float = 30.0
    heal_share: float = 0.1
    offline_s: float = 10.0
    converge_s: float = 120.0  # longest wait for the healed nodes to converge
    drain_s: float = 15.0  # longest wait, after the last submission, for it to be seen
    up_s: float = 600.0  # longest wait for the whole fleet to be fresh at central
    budget_s: float = 900.0
    procs: int = 1
    memory_breakdown: bool = False  # walk central's objects at the end (slow: ~1 min at 10k)
    #: central's ``[central] replica_cold_after_s`` (None: its default)
    replica_cold_after_s: float | None = None
    broker_queue: int | None = None  # max_queued_messages of the bench broker (None: deployed)
    broker_log: str | None = None  # a file the bench broker appends its log to (None: no log)
    seed: int = 1
    #: nodes connecting per second, the whole fleet (0: all at once, 100 at a time per
    #: simulator; a burst that loses messages queued for central past 1,000 nodes)
    connect_rate: float = 50.0
    #: a directory to record central's broker connection in (tcpdump), from the steady
    #: window on, and to split each submission's PUBACK wait by (bench/pcap_mqtt.py)
    capture: str | None = None
    #: ``--pin-central``: central's process on these CPUs, and every other process of the run
    #: (the simulated fleet, the broker, the seeder) on the others (None: nothing pinned)
    central_cpus: tuple[int, ...] | None = None
    other_cpus: tuple[int, ...] | None = None
    #: ``--nice-fleet``: the niceness of the simulated fleet's and the seeder's processes
    #: (0: as central's). Central then has the CPU whenever it can run, on every core, as
    #: on a machine of its own, and the fleet takes what it leaves; the broker stays at 0.
    fleet_nice: int = 0
    #: ``--hold-sample``: sample central's loop thread while its loop is late, and note what
    #: held it (bench/loop_holds.py; a 5 ms beat on the loop and a sampling thread)
    hold_sample: bool = False


def pin(cpus: tuple[int, ...] | None) -> None:
    """Run this process (and what it starts from now on) on ``cpus`` (None: leave it)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def place_fleet_process(scale: Scale) -> None:
    """Where a process of the simulated side (a simulator, the seeder) runs: on the CPUs
    ``--pin-central`` left it, at the niceness ``--nice-fleet`` asked."""
    pin(scale.other_cpus)
    if scale.fleet_nice:
        os.nice(scale.fleet_nice)


def split_cpus() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``--pin-central``: the first CPU this process may use for central, the rest for the
    others. ValueError with one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise ValueError(f"--pin-central needs two CPUs or more, this process has {cpus}")
    return (cpus[0],), tuple(cpus[1:])


# --- the fleet: ids, node documents and the assignments central holds of them ---------------


def node_ids(n: int) -> list[str]:
    return [f"sim{i:05d}" for i in range(n)]


def why_not_fresh(engine: CentralEngine, ids: Iterable[str]) -> str:
    """Why the nodes central does not hold fresh are not, counted: what a run that never
    comes up needs to say."""
    why: dict[str, int] = {}
    step1_out = step2_in = 0
    for node_id in ids:
        if engine.is_fresh(node_id):
            continue
        replica = engine.replicas.replicas.get(node_id)
        status = engine.liveness.nodes.get(node_id)
        if replica is None:
            reason = "no replica"
        elif status is None or status.state != "online":
            reason = f"not online ({'no status' if status is None else status.cause})"
        else:
            synced = replica.peer.synced_at.get(node_id)
            reason = "never answered" if synced is None else "answered before it came online"
            step1_out += replica.peer.stats["step1_out"]
            step2_in += replica.peer.stats["step2_in"]
            if replica.peer._want_step1:
                reason += ", a step 1 waiting"
        why[reason] = why.get(reason, 0) + 1
    pacer = engine.resync_pacer
    return (
        "not fresh: "
        + ", ".join(f"{n} {reason}" for reason, n in sorted(why.items()))
        + f"; their replicas sent {step1_out} step 1s, got {step2_in} step 2s; pacer "
        f"{pacer.reserved} slots, line {pacer.backlog_s():.1f} s"
    )


def healed_nodes(ids: list[str], share: float) -> list[str]:
    """Every 1/share-th node: spread over the simulator processes and over central's order."""
    step = max(1, round(1 / share)) if share > 0 else len(ids) + 1
    return ids[::step]


def seeded_spec(task_id: str) -> TaskSpec:
    return TaskSpec(id=task_id, command=("sleep", "3600"), cpu=0.25, mem_gib=0.25)


def seeded_tasks(node_id: str, scale: Scale, now: float) -> list[tuple[str, TaskReport]]:
    """The task entries a node already holds: ``assigned_share`` of them central's."""
    out = []
    assigned = round(scale.assigned_share * scale.tasks_per_node)
    running_per_10 = round(scale.running_share * 10)
    for i in range(scale.tasks_per_node):
        task_id = f"{node_id}-t{i:03d}"
        spec = seeded_spec(task_id)
        running = i % 10 < running_per_10
        report = TaskReport(
            state=TaskState.RUNNING if running else TaskState.EXITED,
            updated_at=now - 600 + i,
            node=node_id,
            decided_by="central" if i < assigned else "local",
            workload=spec.workload,
            priority=spec.priority,
            cpu=spec.cpu,
            mem_gib=spec.mem_gib,
            exit_code=None if running else 0,
            accepted_at=now - 900,
            started_at=now - 890,
            assignment=AssignmentRef(CENTRAL_ID, 1) if i < assigned else None,
        )
        out.append((task_id, report))
    return out


#: The registration fields every simulated node shares (one object per arch and site).
_POWER = PowerModel(idle_w=120.0, peak_w=400.0, parked_w=10.0, wake_latency_s=60.0)
_MODELS = {k: ModelReport(sha256="0" * 64, source="shipped") for k in ("forecast", "placement")}


def node_registration(node_id: str) -> Registration:
    """What a simulated node registers: as a node of this version, it reads packed entries
    (``reads_packed``: central then writes its desired document packed)."""
    number = int(node_id[3:])
    return Registration(
        arch=Arch.X86_64 if number % 2 else Arch.ARM64, server_class=ServerClass.GENERAL,
        cpu=32.0, mem_gib=128.0, perf=1.0, site=f"site{number % 10}", cpu_model="simulated",
        power=_POWER, reads_packed=True,
    )  # fmt: skip


#: The node whose entries are packed once with the project's classes (:class:`SeedTexts`).
TEMPLATE_NODE = "sim00000"


class SeedTexts:
    """The packed text of every seeded entry, packed once with the project's own classes
    (``NodeDoc.packed_form`` of :func:`seeded_tasks`' reports, ``PolicyDoc.packed_form`` of
    :func:`seeded_assignments`) for :data:`TEMPLATE_NODE`; any other node's are the same
    text with its id in place of the template's (every id is as long, and no other field
    differs from node to node: ``tests/test_bench_central_scale.py`` checks them against the
    classes' own). Packing 240 entries per node through the schema took ~25 ms a node, four
    minutes for 10,000; this is what the packed documents hold, written in a fraction of it."""

    def __init__(self, scale: Scale, now: float) -> None:
        node = NodeDoc(f"node-{TEMPLATE_NODE}", client_id_for(TEMPLATE_NODE))
        node.packed = True
        fleet = PolicyDoc("fleet", client_id_for(CENTRAL_ID))
        fleet.packed = True
        self.tasks = [
            (task_id, node.packed_form(report))
            for task_id, report in seeded_tasks(TEMPLATE_NODE, scale, now)
        ]
        self.assignments = [
            (task_id, fleet.packed_form(entry))
            for task_id, entry in seeded_assignments(TEMPLATE_NODE, scale, now)
        ]
        self.now = now

    @staticmethod
    def of(node_id: str, texts: list[tuple[str, Any]]) -> list[tuple[str, str]]:
        """``texts`` (the template node's) for ``node_id``."""
        if len(node_id) != len(TEMPLATE_NODE):
            raise ValueError(f"node id {node_id!r} is not as long as {TEMPLATE_NODE!r}")
        return [(k.replace(TEMPLATE_NODE, node_id), v.replace(TEMPLATE_NODE, node_id))
                for k, v in texts]  # fmt: skip

    def tasks_of(self, node_id: str) -> list[tuple[str, str]]:
        return self.of(node_id, self.tasks)

    def assignments_of(self, node_id: str) -> list[tuple[str, str]]:
        return self.of(node_id, self.assignments)


def build_node_doc(node_id: str, texts: SeedTexts) -> NodeDoc:
    """Node ``node_id``'s own document as the node wrote it (its client id): registration,
    power and model reports, its task entries; packed, as a node of this version writes once
    central's policy says central reads packed entries (:meth:`PolicyDoc.packed_entries`),
    the entries' text written into its ``tasks`` map as ``NodeDoc.put_task`` writes it."""
    doc = NodeDoc(f"node-{node_id}", client_id_for(node_id))
    doc.packed = True
    with doc.doc.transaction():
        doc.set_registration(node_registration(node_id))
        doc.set_power_report(PowerReport(state="active", since=texts.now - 900))
        doc.set_model_reports(_MODELS)
        tasks = doc.root("tasks")
        for task_id, text in texts.tasks_of(node_id):
            tasks[task_id] = text
    return doc


def running_tasks(node_id: str, scale: Scale) -> list[str]:
    """The ids of the seeded task entries a node holds as running (:func:`seeded_tasks`)."""
    running_per_10 = round(scale.running_share * 10)
    return [f"{node_id}-t{i:03d}" for i in range(scale.tasks_per_node) if i % 10 < running_per_10]


def seeded_assignments(
    node_id: str, scale: Scale, now: float
) -> Iterable[tuple[str, AssignmentEntry]]:
    """Central's assignments of the tasks node ``node_id`` reports as central's."""
    for task_id, report in seeded_tasks(node_id, scale, now):
        if report.assignment is not None:
            yield task_id, assignment_entry(
                seeded_spec(task_id), node_id, central=CENTRAL_ID, epoch=1, replacement=False,
                score=0.0, at=now - 900, reason="seeded",
            )  # fmt: skip


@dataclass(frozen=True)
class SeedPlan:
    """What the seeder writes: central's state directory, one file of node documents per
    simulator process (the nodes' own stores), for ``ids`` split as the simulators are."""

    scale: Scale
    ids: tuple[str, ...]
    state_dir: str
    node_files: tuple[str, ...]
    now: float


async def seed_state(plan: SeedPlan) -> dict[str, Any]:
    """Central's SQLite as a central that ran this fleet before leaves it, and each node's
    own document as the node holds it: the restart path, not a projection of 700,000
    assignments on the running central's loop.

    Central's store gets its ``fleet`` document (every assignment, packed, as the engine
    writes it), each node's ``desired-<node>`` (that node's share, packed: the node reads
    packed entries) and central's replica of each node's document (the node's own bytes).
    On start the engine restores them (``ReplicaSet.load``, ``DesiredDocs.load``), the index
    learns the fleet and ``DesiredDocs.match`` checks each desired document against it,
    before it connects to the broker. The nodes' documents go to ``node_files`` (pickled
    ``{node id: document bytes}``, simulator k's nodes ``ids[k::procs]``), from which each
    simulated node restores its document as a restarted node does from its store."""
    from edgesched.central.engine import FLEET_DOC
    from edgesched.sync.store import Store

    started = time.perf_counter()
    scale, ids = plan.scale, list(plan.ids)
    procs = len(plan.node_files)
    central = client_id_for(CENTRAL_ID)
    fleet = PolicyDoc(FLEET_DOC, central)
    fleet.packed = True  # as the engine's own
    Path(plan.state_dir).mkdir(parents=True, exist_ok=True)
    store = await Store.open(Path(plan.state_dir) / "central.db")
    node_bytes: list[dict[str, bytes]] = [{} for _ in range(procs)]
    texts = SeedTexts(scale, plan.now)
    count = 0
    assignments = fleet.root("assignments")
    try:
        for start in range(0, len(ids), 500):
            async with store.transaction():
                with fleet.doc.transaction():
                    for k, node_id in enumerate(ids[start : start + 500], start):
                        doc = build_node_doc(node_id, texts)
                        snapshot = doc.snapshot()
                        node_bytes[k % procs][node_id] = snapshot
                        # central's replica of it: the node's bytes (a fresh store: one call)
                        await store.compact(doc.name, snapshot, 0)
                        desired = PolicyDoc(desired_doc_name(node_id), central)
                        desired.packed = True
                        held = desired.root("assignments")
                        with desired.doc.transaction():
                            for task_id, text in texts.assignments_of(node_id):
                                assignments[task_id] = text  # as PolicyDoc.assign writes
                                held[task_id] = text
                                count += 1
                        await store.compact(desired.name, desired.snapshot(), 0)
        await fleet.persist_to(store)
    finally:
        await store.close()
    for path, nodes in zip(plan.node_files, node_bytes, strict=True):
        Path(path).write_bytes(pickle.dumps(nodes, protocol=pickle.HIGHEST_PROTOCOL))
    return {"assignments": count, "seconds": time.perf_counter() - started,
            "rss_mb": psutil.Process().memory_info().rss / 1e6}  # fmt: skip


def seeder_main(plan: SeedPlan, conn: Connection) -> None:
    """Entry point of the seeder process (spawned: its memory is not central's)."""
    place_fleet_process(plan.scale)
    quiet_logs()
    conn.send(asyncio.run(seed_state(plan)))
    conn.close()


async def run_seeder(plan: SeedPlan) -> dict[str, Any]:
    """:func:`seed_state` in a process of its own; its result."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=seeder_main, args=(plan, theirs), daemon=True)
    proc.start()
    theirs.close()
    try:
        while not ours.poll():
            if not proc.is_alive() and not ours.poll():
                raise RuntimeError(f"seeder exited {proc.exitcode}")
            await asyncio.sleep(0.2)
        result: dict[str, Any] = ours.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return result


def projected_assignments(engine: CentralEngine, ids: Iterable[str]) -> int:
    """How many assignments central's fleet index holds for the nodes ``ids`` (what its
    desired-state documents of them must hold: ``DesiredDocs.match`` made them so at start;
    counted in the index, since reading the documents would thaw every frozen one; what the
    nodes' replicas received of them is :attr:`Measure.desired_held`)."""
    wanted = set(ids)
    return sum(1 for e in engine.index.assignments.values() if e.node in wanted)


class AssignmentFeed:
    """Where a simulated node reads its assignments: the one place that knows where they are.

    Central's assignments (and stop and power orders) to a node are entries of that node's own
    desired-state document, ``desired-<node>`` (:func:`~edgesched.sync.doc.desired_doc_name`;
    the same ``assignments`` map as any :class:`~edgesched.sync.doc.PolicyDoc`), central's
    projection of its ``fleet`` document. Each simulated node holds its own replica of it,
    starting empty like a fresh node's, synced by its own :class:`DocPeer` as a real node's
    (its step 1 on ``.../desired-<node>/sync/<node>`` on every connect, central's step 2 and
    live updates on ``.../sync/<central>``); the feed watches the replica's changed keys and
    decodes only those (``PolicyDoc.assignment``). As a real node's, the peer hears the
    centrals only (``listen_to``); :attr:`routes` are the topics its replica is fed from. If
    assignments move again, this class and :func:`seed_state` are what
    change."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        # a real node's replicas all carry its client id (edge/engine.py)
        self.doc = PolicyDoc(self.node_doc(node_id), client_id_for(node_id))
        self._changed: set[str] = set()
        root: Map[Any] = self.doc.doc.get("assignments", type=Map)
        self._subscription = root.observe(self._on_change)
        self.routes = self.peer_routes(node_id)

    @staticmethod
    def node_doc(node_id: str) -> str:
        """The document node ``node_id`` reads its assignments from."""
        return desired_doc_name(node_id)

    @staticmethod
    def node_of(doc: str) -> str | None:
        """The node whose assignments document ``doc`` is (None: not one)."""
        return doc[len(DESIRED_PREFIX) :] if doc.startswith(DESIRED_PREFIX) else None

    @staticmethod
    def peer_routes(node_id: str) -> tuple[str, ...]:
        """The topics node ``node_id``'s desired replica is fed from: the centrals' sender
        topics of its desired document and their answers to its step 1 on its reply topics
        (what a real node's peer subscribes)."""
        doc = desired_doc_name(node_id)
        return tuple(wire.sync_topic(doc, c) for c in sorted(CENTRALS)) + tuple(
            wire.reply_filter(doc, node_id, c) for c in sorted(CENTRALS)
        )

    def peer(self) -> DocPeer:
        """The node's peer of its replica: read only, only centrals author it, and it hears
        only them (edge/engine.py builds a real node's so)."""
        peer = DocPeer(
            self.doc,
            self.node_id,
            writers=frozenset(client_id_for(c) for c in CENTRALS),
            listen_to=CENTRALS,
            subscribe=False,  # the simulator's connection subscribes for it
        )
        assert peer.routes == self.routes, (peer.routes, self.routes)
        return peer

    def _on_change(self, event: Any) -> None:  # a pycrdt MapEvent: its changed keys
        self._changed.update(str(k) for k in event.keys)

    def changed(self) -> list[tuple[str, AssignmentEntry]]:
        """(task id, assignment) of every assignment new or changed since the last call."""
        keys, self._changed = self._changed, set()
        out = []
        for task_id in sorted(keys):
            entry = self.doc.assignment(task_id)
            if entry is not None:
                out.append((task_id, entry))
        return out

    def held(self) -> int:
        """Assignments the replica holds."""
        return len(self.doc.root("assignments"))


#: What a node receives, by source: central's frames of its own document and of its desired
#: document, central's frames of the fleet-wide policy document, and central's heartbeat.
RECEIVED_KINDS = ("node_doc", "desired", "policy", "heartbeat")

#: What a node sends, by document or kind: its own document's frames, its desired document's
#: (step 1s), the policy (step 1s, answers to central's), its status, its telemetry.
SENT_KINDS = ("node_doc", "desired", "policy", "status", "telemetry")

#: The fleet-wide documents every node replicates (mode, tidal profile, models); one replica
#: per simulator process stands for all of its nodes'. A node hears them from the centrals only.
SHARED_DOCS: tuple[str, ...] = ("policy",)


def node_subscriptions(ids: Iterable[str]) -> list[tuple[str, SubscribeOptions]]:
    """What a simulator's connection subscribes for its nodes ``ids``: what real nodes'
    sessions subscribe. The shared documents and each node's desired document from the
    centrals only (their sender topics, as ``DocPeer(..., listen_to=centrals)``), each node's
    own document from every peer (``.../sync/+``: central's replicas), the heartbeat, and
    each node's reply topics of those documents from the centrals (their answers to its
    marked step 1s, which it alone hears)."""
    qos1 = SubscribeOptions(qos=1, noLocal=True)
    subs = [(wire.sync_topic(d, c), qos1) for d in SHARED_DOCS for c in sorted(CENTRALS)]
    subs.append((HEARTBEAT_TOPIC, SubscribeOptions(qos=0)))
    for node_id in ids:
        subs.append((wire.sync_filter(f"node-{node_id}"), qos1))
        subs += [(route, qos1) for route in AssignmentFeed.peer_routes(node_id)]
        subs += [  # the centrals' answers to its policy step 1: addressed to it alone
            (wire.reply_filter(d, node_id, c), qos1) for d in SHARED_DOCS for c in sorted(CENTRALS)
        ]
    return subs


# --- the broker -------------------------------------------------------------------------------


@dataclass
class BenchBroker:
    port: int
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


#: What ``--broker-log`` has Mosquitto log: connections and disconnections with their reasons.
BROKER_LOG = (
    "log_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n"
    "log_type information\nconnection_messages true\nlog_timestamp true\n"
    "log_timestamp_format %Y-%m-%dT%H:%M:%S\n"
)


def start_broker(workdir: Path, queue: int | None = None, log: str | None = None) -> BenchBroker:
    """Mosquitto on 127.0.0.1 on a free port, anonymous, no persistence, with the queue
    limits the project's ``broker_config`` deploys (``queue_settings``: 100,000 messages or
    256 MiB per client: central is one subscriber for the whole fleet, and Mosquitto's
    default of 1,000 drops most of a fleet's burst) unless ``queue`` sets
    ``max_queued_messages`` (0: no limit; ``--broker-queue``); in-flight at Mosquitto's 20;
    ``$SYS`` every second for the dropped count. ``log`` (``--broker-log``): append the
    broker's log there (connections, and why each ended), else it logs nothing."""
    exe = mosquitto_path()
    if exe is None:
        raise SystemExit("Mosquitto is not installed: run `make setup`")
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        + ("log_dest none\n" if log is None else BROKER_LOG)
        + "sys_interval 1\n"
        + "\n".join(
            queue_settings() if queue is None else queue_settings(max_queued_messages=queue)
        )
        + "\n"
    )
    # (its stderr: Mosquitto drops root's privileges before it would open a log file)
    with contextlib.ExitStack() as stack:
        err = subprocess.DEVNULL if log is None else stack.enter_context(open(log, "ab"))
        proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=err)
    wait_for_port(port)
    return BenchBroker(port, proc)


# --- the simulated nodes (one process multiplexes many) ---------------------------------------


def status_payload(node_id: str, state: str) -> bytes:
    """What :class:`CentralLink` publishes (for counting the bytes it sends)."""
    return json.dumps({"node": node_id, "state": state}).encode()


#: One MQTT configuration for every simulated node's link (only its defaults are read).
_MQTT = MqttConfig()


class SimNode:
    """One simulated edge node: its own document and peer, its desired-state replica and
    peer, its link's status messages. Its document is restored from the bytes the seeder
    wrote (as a restarted node restores its own from its store), packed as it was written."""

    def __init__(self, node_id: str, scale: Scale, snapshot: bytes) -> None:
        self.id = node_id
        self.doc = NodeDoc.restore(f"node-{node_id}", client_id_for(node_id), snapshot, [])
        self.doc.packed = True  # (set again from the policy, as a real node does)
        self.running = running_tasks(node_id, scale)  # its own running tasks, for churn
        self.following = 0  # central's assignments it started and that still run
        self.peer = DocPeer(self.doc, node_id, subscribe=False)
        self.feed = AssignmentFeed(node_id)  # our desired-state replica: our assignments
        self.desired_peer = self.feed.peer()
        self.link = CentralLink(node_id, _MQTT)
        self.online = False
        self.serving: list[asyncio.Task[None]] = []  # the peers' send loops while online
        self.bytes_in = 0  # central's frames on our two documents' topics
        self.bytes_out = 0  # status, telemetry, our policy step 1s and answers (to central)
        self.shared_in = 0  # broadcast bytes (central's policy frames, heartbeat) while online
        self.shared_mark = 0
        self.online_s = 0.0
        self.online_since = 0.0

    def totals(self, shared_now: int, now: float) -> tuple[int, int, float]:
        """(bytes in, bytes out, seconds online) so far."""
        shared = self.shared_in + (shared_now - self.shared_mark if self.online else 0)
        online = self.online_s + (now - self.online_since if self.online else 0.0)
        out = self.bytes_out + self.peer.stats["bytes_out"] + self.desired_peer.stats["bytes_out"]
        return self.bytes_in + shared, out, online


@dataclass(frozen=True)
class SimPlan:
    index: int
    ids: tuple[str, ...]
    port: int
    policy_snapshot: str
    scale: Scale
    nodes_file: str  # {node id: its document's bytes}, from the seeder


class SimulatorDied(RuntimeError):
    """A simulator's loop ended before the harness stopped it."""


class Simulator:
    """The nodes of one process over one MQTT connection, driven by the harness's pipe."""

    def __init__(self, plan: SimPlan, conn: Connection) -> None:
        self.plan = plan
        self.scale = plan.scale
        self.conn = conn
        self.rng = random.Random(plan.scale.seed * 1000 + plan.index)
        snapshot = Path(plan.policy_snapshot).read_bytes()
        # Every node holds this same replica of central's fleet-wide policy document (mode,
        # tidal profile, models: one stands for all); each its own desired-state document.
        self.policy = PolicyDoc.restore(
            "policy", client_id_for(f"bench-sim-{plan.index}"), snapshot, []
        )
        stored: dict[str, bytes] = pickle.loads(Path(plan.nodes_file).read_bytes())
        self.nodes = {i: SimNode(i, plan.scale, stored.pop(i)) for i in plan.ids}
        packed = self.policy.packed_entries()  # as a real node follows central's policy
        for node in self.nodes.values():
            node.doc.packed = packed
        self.reassembler = wire.Reassembler()
        self.shared = 0  # bytes every online node receives (central's policy frames, heartbeats)
        #: bytes our nodes received, by document (summed over the nodes that got them)
        self.received: dict[str, int] = dict.fromkeys(RECEIVED_KINDS, 0)
        self.received_mark: dict[str, int] = dict(self.received)
        self.online_count = 0
        self.exits: list[tuple[float, str, str]] = []  # (when, node, task): a heap
        self.seen: list[tuple[str, str, float]] = []
        self.client: aiomqtt.Client | None = None
        self.stop = asyncio.Event()
        #: (loop name, its exception) of a loop that ended before we were stopped
        self.died: tuple[str, BaseException | None] | None = None
        self.policy_resync_at = 0.0
        self.frozen = False
        self.counts: dict[str, int] = dict.fromkeys(
            ("policy_step1_sent", "policy_step1_heard", "policy_answers",
             "policy_frames_from_central", "policy_replies_from_central", "frames_from_central",
             "desired_frames_from_central", "frames_not_from_central", "dropped_while_offline",
             "telemetry", "bad_policy_frames"),
            0,
        )  # fmt: skip
        self.broker_dropped = 0
        self.marks: dict[str, tuple[int, int, float]] = {}
        self.doc_marks: dict[str, int] = {}
        #: bytes our nodes sent, by document or kind (summed over the nodes)
        self.sent: dict[str, int] = dict.fromkeys(SENT_KINDS, 0)
        self.sent_mark: dict[str, int] = dict(self.sent)
        self.cpu_mark = 0.0
        self.marked_at = 0.0

    # -- pipe --------------------------------------------------------------------------------

    def send(self, *message: object) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(message)

    async def control(self) -> None:
        while not self.stop.is_set():
            try:
                while self.conn.poll():
                    await self.command(self.conn.recv())
            except (EOFError, OSError):  # the harness is gone
                self.stop.set()
                return
            if self.seen:
                seen, self.seen = self.seen, []
                self.send("seen", seen)
            await asyncio.sleep(0.05)

    async def command(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "mark":
            now = time.time()
            self.marks = {i: n.totals(self.shared, now) for i, n in self.nodes.items()}
            self.received_mark = dict(self.received)
            self.doc_marks = self.doc_counts()
            self.sent_mark = self.sent_now()
            self.cpu_mark = sum(psutil.Process().cpu_times()[:2])
            self.marked_at = now
            self.send("marked")
        elif kind == "heal_start":  # the healed share's link dies at once
            ids = [node_id for node_id in message[1] if node_id in self.nodes]
            await asyncio.gather(*(self.go_offline(self.nodes[n]) for n in ids))
            self.send("offline", time.time())
        elif kind == "heal_end":
            # Every healed node reconnects at once, as when a site's link returns: not one
            # after another behind each one's PUBACKs (that took ~10 s for 500 nodes, counted
            # against central, and held this loop, so no convergence was checked meanwhile).
            ids = [node_id for node_id in message[1] if node_id in self.nodes]
            started = await asyncio.gather(*(self.go_online(self.nodes[n]) for n in ids))
            self.send("healed", dict(zip(ids, started, strict=True)))
        elif kind == "vectors":  # cheap: what to compare next
            vectors = {}
            for node_id in message[1]:
                node = self.nodes.get(node_id)
                if node is not None:
                    feed = node.feed.doc
                    vectors[node_id] = (
                        node.doc.epoch, node.doc.state_vector(), feed.epoch, feed.state_vector()
                    )  # fmt: skip
            self.send("vectors", vectors)
        elif kind == "compare":
            # central's replica of each node's document and its desired document: the same
            # content as the node's own two? Both sides hold the same state vectors (central
            # checked), so the same operations; what is left to compare is the deletions: the
            # diff against that state vector is the delete set alone, compared as bytes
            # (small, and no document decoded here: sending and hashing both documents whole
            # took seconds a round while a thousand nodes healed, each node's convergence
            # stamped that much late)
            same = []
            for i, (node_id, epoch, sv, deleted, feed_sv, feed_deleted) in enumerate(message[1]):
                if i % HASHES_PER_TURN == 0:
                    await asyncio.sleep(0)  # (the nodes' traffic is served meanwhile)
                node = self.nodes.get(node_id)
                if (
                    node is not None
                    and node.doc.epoch == epoch
                    and node.doc.state_vector() == sv
                    and node.doc.diff(sv) == deleted
                    and node.feed.doc.state_vector() == feed_sv
                    and node.feed.doc.diff(feed_sv) == feed_deleted
                ):
                    same.append(node_id)
            self.send("compare", same)
        elif kind == "desired":  # how many nodes central answered, what they hold
            waiting = [
                i for i, n in self.nodes.items() if CENTRAL_ID not in n.desired_peer.synced_at
            ]
            held = sum(n.feed.held() for n in self.nodes.values())
            self.send("desired", len(self.nodes) - len(waiting), held, waiting[:5])
        elif kind == "freeze":  # no more changes of our own: central can catch up
            self.frozen = True
            self.send("frozen", self.doc_counts())  # since the start: central's are too
        elif kind == "stop":
            self.send("final", self.final())
            self.stop.set()

    def sent_now(self) -> dict[str, int]:
        """:attr:`sent` with what the nodes' two peers sent (their own documents' frames)."""
        out = dict(self.sent)
        out["node_doc"] = sum(n.peer.stats["bytes_out"] for n in self.nodes.values())
        out["desired"] = sum(n.desired_peer.stats["bytes_out"] for n in self.nodes.values())
        return out

    def doc_counts(self) -> dict[str, int]:
        keys = ("frames_out", "updates_out", "step2_out", "step1_out", "bytes_out")
        return {k: sum(n.peer.stats[k] for n in self.nodes.values()) for k in keys}

    def final(self) -> dict[str, Any]:
        now = time.time()
        rows = []
        for node_id, node in self.nodes.items():
            b_in, b_out, online = node.totals(self.shared, now)
            m_in, m_out, m_online = self.marks.get(node_id, (0, 0, 0.0))
            rows.append((b_in - m_in, b_out - m_out, online - m_online))
        docs = self.doc_counts()
        counts = dict(self.counts)
        desired_keys = ("step1_out", "step2_out", "step2_in", "updates_in", "resync_requests",
                        "rejected_updates", "rejected_senders", "rejected_frames")  # fmt: skip
        for key in desired_keys:
            counts[f"desired_{key}"] = sum(n.desired_peer.stats[key] for n in self.nodes.values())
        return {
            "per_node": rows,
            "doc": {k: v - self.doc_marks.get(k, 0) for k, v in docs.items()},
            "counts": counts,
            "received": {k: v - self.received_mark[k] for k, v in self.received.items()},
            "broker_dropped": self.broker_dropped,
            "sent": {k: v - self.sent_mark[k] for k, v in self.sent_now().items()},
            "cpu_s": sum(psutil.Process().cpu_times()[:2]),
            "cpu_window_s": sum(psutil.Process().cpu_times()[:2]) - self.cpu_mark,
            "window_s": now - self.marked_at,
            "rss_mb": psutil.Process().memory_info().rss / 1e6,
        }

    # -- MQTT --------------------------------------------------------------------------------

    async def run(self) -> None:
        client = aiomqtt.Client(
            "127.0.0.1", self.plan.port, identifier=f"edgesched-bench-sim-{self.plan.index}",
            protocol=aiomqtt.ProtocolVersion.V5, keepalive=60, timeout=120.0,
        )  # fmt: skip
        async with client:
            self.client = client
            subs = node_subscriptions(self.nodes)
            if self.plan.index == 0:
                subs.append((SYS_DROPPED, SubscribeOptions(qos=0)))
            for start in range(0, len(subs), 500):
                await client.subscribe(subs[start : start + 500])
            loops = [
                asyncio.create_task(self.dispatch(client), name="dispatch"),
                asyncio.create_task(self.control(), name="control"),
                asyncio.create_task(self.exit_loop(), name="exit_loop"),
                asyncio.create_task(self.telemetry_loop(client), name="telemetry_loop"),
                asyncio.create_task(self.come_up(), name="connect_all"),
            ]
            for task in loops:
                task.add_done_callback(self.ended)
            await self.stop.wait()
            for task in loops:
                task.cancel()
            for node in self.nodes.values():
                for serving in node.serving:
                    serving.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
        if self.died is not None:
            name, exc = self.died
            raise SimulatorDied(f"simulator {self.plan.index}: its {name} ended") from exc

    def ended(self, task: asyncio.Task[None]) -> None:
        """A loop of ours ended. Before the harness stopped us, that is this simulator's end
        (its nodes would go deaf or silent while the harness waits for them): stop, and
        :meth:`run` raises, so the process exits non-zero with the traceback on stderr and the
        harness names it (:meth:`Sims.check`). The first try of the marked policy step 1 lost
        its dispatch loop this way (a KeyError: a count never declared, on central's first
        answer on a reply topic), silently, and looked like a fleet that never came up."""
        if task.cancelled() or self.stop.is_set() or self.died is not None:
            return
        exc = task.exception()
        if exc is None and task.get_name() == "connect_all":
            return  # every node connected: its job is done
        self.died = (task.get_name(), exc)
        self.stop.set()

    async def come_up(self) -> None:
        await self.connect_all()
        self.send("ready", len(self.nodes))

    async def connect_all(self) -> None:
        """Every node connects: paced at ``connect_rate`` (this simulator's share of it), in
        batches of up to 100 connecting at once."""
        nodes = list(self.nodes.values())
        rate = self.scale.connect_rate * len(nodes) / max(1, self.scale.nodes)  # our share
        size = 100 if rate <= 0 else max(1, min(100, round(rate / 10)))  # ~10 batches a second
        started = time.monotonic()
        for start in range(0, len(nodes), size):
            if rate > 0:
                due = started + start / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            batch = nodes[start : start + size]
            await asyncio.gather(*(self.go_online(node) for node in batch))
            for node in batch:
                self.schedule_churn(node.id, time.time())

    async def go_online(self, node: SimNode) -> float:
        """What a node does on (re)connect: it hears its topics (as a real node, subscribed
        before it speaks), then its retained online status, its document peer's step 1 and
        queued updates, its desired-state peer's step 1 (central's step 2 brings what it
        missed while away), its policy step 1. (Marked online only after the status's
        PUBACK, a node dropped central's step 1 that the status itself prompted whenever it
        arrived first: one node of 10,000 never fresh.)"""
        assert self.client is not None
        now = time.time()
        node.online = True
        self.online_count += 1
        node.online_since = now
        node.shared_mark = self.shared
        node.serving = [
            asyncio.create_task(node.peer.serve(self.client)),
            asyncio.create_task(node.desired_peer.serve(self.client)),
        ]
        await node.link.serve(self.client)
        node.bytes_out += len(status_payload(node.id, "online"))
        self.sent["status"] += len(status_payload(node.id, "online"))
        await self.policy_step1(node)
        return now

    async def go_offline(self, node: SimNode) -> None:
        """Cut off: the peer stops (local changes queue in it), and the broker publishes the
        node's last will (retained offline), as when its connection dies."""
        assert self.client is not None
        for serving in node.serving:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        node.serving = []
        node.peer.disconnected()
        node.desired_peer.disconnected()
        now = time.time()
        node.shared_in += self.shared - node.shared_mark
        node.online_s += now - node.online_since
        node.online = False
        self.online_count -= 1
        will = node.link.will()
        await self.client.publish(will.topic, will.payload, qos=1, retain=True)

    async def policy_step1(self, node: SimNode) -> None:
        """The node's policy peer's step 1 (on every connect), marked as a real node's
        (``wire.step1_payload(sv, replies=True)``: its peer listens to the centrals only), on
        its own sender topic, which only the centrals hear. Central answers on the node's reply
        topic ``.../policy/reply/<node>/<central>``, which only that node hears: its step 2,
        and its own step 1 back when the node holds what it lacks (never here: the simulator's
        replica writes nothing). :meth:`dispatch` counts such an answer as the asker's bytes
        alone and :meth:`on_policy` answers central's step 1 as the asker alone, so a node's
        reconnect costs no other node anything, and the policy bytes per node stay flat as
        the fleet grows. The one policy replica per simulator stands for all its nodes':
        central's answer to any of them is applied to it once."""
        for name in SHARED_DOCS:
            sv = self.policy.state_vector()
            step1 = wire.step1_payload(sv, replies=True)
            await self.publish_as(node, name, wire.Kind.SYNC, step1)
            self.counts["policy_step1_sent"] += 1

    async def publish_as(self, node: SimNode, doc: str, kind: wire.Kind, payload: bytes) -> None:
        """A frame of a shared document (the policy) as ``node`` sends it, to the centrals:
        no other node hears it, so it is counted as sent only."""
        assert self.client is not None
        for frame in wire.encode(kind, doc, node.doc.client_id, payload, epoch=0):
            await self.client.publish(wire.sync_topic(doc, node.id), frame, qos=1)
            node.bytes_out += len(frame)
            self.sent["policy"] += len(frame)

    async def dispatch(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = message.topic.value
            payload = bytes(message.payload)
            if topic == HEARTBEAT_TOPIC:
                self.shared += len(payload)
                self.received["heartbeat"] += len(payload) * self.online_count
                continue
            if topic == SYS_DROPPED:
                with contextlib.suppress(ValueError):
                    self.broker_dropped = int(payload)
                continue
            parts = topic.split("/")
            if len(parts) == 6 and parts[4] == "sync":
                doc, sender, asker = parts[3], parts[5], None
            elif len(parts) == 7 and parts[4] == "reply":  # an answer to one node's step 1
                doc, sender, asker = parts[3], parts[6], parts[5]
            else:
                continue
            owner = AssignmentFeed.node_of(doc)
            if (doc in SHARED_DOCS or owner is not None) and sender not in CENTRALS:
                self.counts["frames_not_from_central"] += 1  # not subscribed: never happens
                continue
            if doc in SHARED_DOCS:  # central's: to every online node, or its answer to one
                asked = None if asker is None else self.nodes.get(asker)
                if asked is None:
                    self.shared += len(payload)  # (every online node's)
                    self.received["policy"] += len(payload) * self.online_count
                else:
                    self.received["policy"] += len(payload)
                    asked.bytes_in += len(payload)
                    self.counts["policy_replies_from_central"] += 1
                self.counts["policy_frames_from_central"] += 1
                await self.on_policy(sender, payload, asked)
                continue
            if owner is not None:
                target = self.nodes.get(owner)
            else:
                target = self.nodes.get(doc[len("node-") :]) if doc.startswith("node-") else None
            if target is None:
                continue
            if not target.online:  # a real node's broker session would queue it; step 1 heals
                self.counts["dropped_while_offline"] += 1
                continue
            target.bytes_in += len(payload)
            self.received["node_doc" if owner is None else "desired"] += len(payload)
            if owner is None:
                self.counts["frames_from_central"] += 1
                target.peer.handle(topic, payload)
                continue
            self.counts["desired_frames_from_central"] += 1
            target.desired_peer.handle(topic, payload)
            for task_id, entry in target.feed.changed():
                if entry.node == target.id:
                    self.follow(target, task_id, entry)

    async def on_policy(self, sender: str, payload: bytes, asker: SimNode | None = None) -> None:
        """Central's frame of the policy: on its sender topic, to every online node (a live
        update, or its own step 1 on connect, which every node's peer answers), or on
        ``asker``'s reply topic, its answer to that node's marked step 1 (its step 2, or its
        step 1 back, which that node alone answers)."""
        try:
            message = self.reassembler.feed(payload)
            if message is None:
                return
            sync = wire.decode_sync(message.kind, message.payload)
        except wire.FrameError:
            self.counts["bad_policy_frames"] += 1
            return
        online = [n for n in self.nodes.values() if n.online and n.id != sender]
        if asker is not None:
            online = [asker] if asker.online else []
        if sync.step == YSyncMessageType.SYNC_STEP1:  # central's: every node's peer answers
            self.counts["policy_step1_heard"] += 1
            answer = wire.step2_payload(self.policy.diff(sync.data))
            for node in online:
                await self.publish_as(node, "policy", wire.Kind.SYNC, answer)
                self.counts["policy_answers"] += 1
            return
        if sync.data != b"\x00\x00":
            self.policy.apply_remote(sync.data, sender=sender)
        if sync.state_vector is not None and self.policy.missing_from(sync.state_vector):
            now = time.monotonic()
            if now - self.policy_resync_at > 0.2 and online:
                self.policy_resync_at = now
                await self.policy_step1(online[0])

    def follow(self, node: SimNode, task_id: str, entry: AssignmentEntry) -> None:
        """A new assignment of ours: start it (a running report with the assignment)."""
        if not entry.active:
            return
        held = node.doc.task(task_id)
        if (
            held is not None
            and held.assignment is not None
            and held.assignment.epoch >= entry.epoch
        ):
            return
        now = time.time()
        spec = entry.task_spec
        node.doc.put_task(
            task_id,
            TaskReport(
                state=TaskState.RUNNING, updated_at=now, node=node.id, decided_by="central",
                workload=spec.workload, priority=spec.priority, cpu=spec.cpu,
                mem_gib=spec.mem_gib, accel=spec.accel, accepted_at=now, started_at=now,
                assignment=AssignmentRef.of(entry.to_assignment()),
            ),
        )  # fmt: skip
        if task_id.startswith(SUBMISSION_PREFIX):
            self.seen.append((task_id, node.id, now))
        node.following += 1
        heapq.heappush(self.exits, (now + self.scale.run_s, node.id, task_id))

    def schedule_churn(self, node_id: str, now: float) -> None:
        when = now + self.rng.expovariate(1 / self.scale.churn_s)
        heapq.heappush(self.exits, (when, node_id, ""))  # "": one of its own tasks

    async def exit_loop(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.time()
            while self.exits and self.exits[0][0] <= now and not self.frozen:
                _, node_id, task_id = heapq.heappop(self.exits)
                node = self.nodes[node_id]
                if not task_id:
                    self.schedule_churn(node_id, now)
                    if not node.running:
                        continue
                    task_id = node.running.pop(self.rng.randrange(len(node.running)))
                else:
                    node.following = max(0, node.following - 1)
                report = node.doc.task(task_id)
                if report is not None and report.active:
                    done = replace(report, state=TaskState.EXITED, exit_code=0, updated_at=now)
                    node.doc.put_task(task_id, done)

    async def telemetry_loop(self, client: aiomqtt.Client) -> None:
        """Each online node publishes a sample every ``telemetry_s`` (QoS 0), spread out."""
        ids = list(self.nodes)
        slices = max(1, round(self.scale.telemetry_s / 0.1))
        per = max(1, -(-len(ids) // slices))
        while True:
            for start in range(0, len(ids), per):
                for node_id in ids[start : start + per]:
                    node = self.nodes[node_id]
                    if not node.online or self.frozen:
                        continue
                    running = len(node.running) + node.following  # (its runtime knows)
                    sample = Telemetry(time.time(), 0.3, 0.4, 180.0, running)
                    payload = json.dumps(sample.to_json()).encode()
                    await client.publish(telemetry_topic(node_id), payload, qos=0)
                    node.bytes_out += len(payload)
                    self.sent["telemetry"] += len(payload)
                    self.counts["telemetry"] += 1
                await asyncio.sleep(self.scale.telemetry_s / slices)


def quiet_logs() -> None:
    """Errors only (aiomqtt warns of every backlog of pending publishes on its own logger)."""
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("mqtt").setLevel(logging.ERROR)


def simulator_main(plan: SimPlan, conn: Connection) -> None:
    """Entry point of a simulator process (spawned)."""
    place_fleet_process(plan.scale)
    quiet_logs()
    sim = Simulator(plan, conn)
    asyncio.run(sim.run())


# --- central's side: the engine, the measurements ---------------------------------------------


def pct(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (nearest rank); None without values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


class CentralLog(logging.Handler):
    """Central's own warnings and errors (the ``edgesched`` loggers in its process): counted
    by level, the first few kept with their traceback's last line, for the summary."""

    KEEP = 20

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}
        self.first: list[str] = []
        self.warnings: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname] = self.counts.get(record.levelname, 0) + 1
        if record.levelno < logging.ERROR:  # warnings: how many of each kind (its format)
            kind = f"{record.name}: {str(record.msg)[:80]}"
            if kind in self.warnings or len(self.warnings) < self.KEEP:
                self.warnings[kind] = self.warnings.get(kind, 0) + 1
        if len(self.first) < self.KEEP and record.levelno >= logging.ERROR:
            text = f"{record.name}: {record.getMessage()}"
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            self.first.append(text[:300])

    def attach(self) -> None:
        logger = logging.getLogger("edgesched")
        logger.addHandler(self)
        if logger.getEffectiveLevel() > logging.WARNING:
            logger.setLevel(logging.WARNING)

    def detach(self) -> None:
        logging.getLogger("edgesched").removeHandler(self)


async def loop_lag(lags: list[float], period_s: float = 0.05) -> None:
    """Forever: how late central's event loop wakes a sleeper (``period_s`` asked), in
    seconds, appended to ``lags``: what every await in the process waits on top of its own
    work (a journal's SQLite round trip included)."""
    while True:
        asked = time.monotonic()
        await asyncio.sleep(period_s)
        lags.append(time.monotonic() - asked - period_s)


async def publish_queue(samples: dict[str, list[tuple[int, ...]]], measure: Any) -> None:
    """Forever, every 50 ms: central's outgoing publishes by the phase of the run: pending
    (of ``session.MAX_PENDING_PUBLISHES``), waiting for a turn at that gate (urgent ones and
    the others), in flight in paho (its window is 20 QoS 1 publishes by default) and queued in
    paho. Read from the session's gates and paho's private counters: a diagnostic, not an
    API."""
    from edgesched.sync import session as sess

    while True:
        await asyncio.sleep(0.05)
        for client, gate in list(sess._publish_gates.items()):
            paho = client._client
            unread, unsent = socket_queues(getattr(paho, "_sock", None))
            samples.setdefault(measure.phase, []).append((
                gate.pending,
                sum(gate.waiting),
                paho._inflight_messages,
                len(paho._out_messages),
                gate.waiting[0],
                unread,
                unsent,
            ))  # fmt: skip


@dataclass
class Capture:
    """tcpdump recording central's connection to the broker (``--capture``)."""

    proc: subprocess.Popen[bytes]
    path: Path
    central_port: int


def start_capture(directory: Path, broker_port: int) -> Capture | None:
    """Record central's one connection to the broker (its local port, from paho's socket)
    into ``directory``/central.pcap; None (and a log line) if tcpdump or the port is missing."""
    from edgesched.sync import session as sess

    tcpdump = shutil.which("tcpdump")
    ports = [
        sock.getsockname()[1]
        for client in list(sess._publish_gates)
        if (sock := getattr(client._client, "_sock", None)) is not None
    ]
    if tcpdump is None or not ports:
        log.warning("no capture: tcpdump %s, central's socket %s", tcpdump, ports)
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "central.pcap"
    command = pcap_mqtt.tcpdump_command(tcpdump, path)
    proc = subprocess.Popen(
        [*command, f"tcp port {ports[0]} and tcp port {broker_port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return Capture(proc, path, ports[0])


def finish_capture(capture: Capture, measure: Any) -> list[str]:
    """Stop the capture and split each submission's wait for its PUBACK (the notes)."""
    capture.proc.send_signal(signal.SIGINT)
    try:
        capture.proc.wait(30)
    except subprocess.TimeoutExpired:
        capture.proc.kill()
    try:
        splits = pcap_mqtt.puback_split(
            capture.path, capture.central_port, dict(measure.handed), dict(measure.published)
        )
    except (OSError, ValueError) as exc:
        return [f"capture {capture.path}: not read: {exc}"]
    if not splits:
        return [f"capture {capture.path}: no submission's PUBLISH and PUBACK found"]
    notes = [
        f"capture {capture.path} ({capture.path.stat().st_size / 1e6:.0f} MB): "
        f"{len(splits)} submissions' PUBACK waits split, p50 / p99 / max in ms: "
        + "; ".join(
            f"{name} {pct(vals, 50):.0f} / {pct(vals, 99):.0f} / {max(vals):.0f}"
            for name, vals in (
                ("handed to the wire", [x.to_wire_ms for x in splits]),
                ("broker (PUBLISH to PUBACK on the wire)", [x.broker_ms for x in splits]),
                ("of it, the PUBLISH's first byte to its last", [x.spread_ms for x in splits]),
                ("PUBACK on the wire to central's return", [x.back_ms for x in splits]),
            )
        )
    ]
    slow = sorted(splits, key=lambda x: -(x.to_wire_ms + x.broker_ms + x.back_ms))[:5]
    notes.append(
        "slowest: "
        + "; ".join(
            f"{x.task_id} {x.to_wire_ms:.0f}+{x.broker_ms:.0f}+{x.back_ms:.0f} ms" for x in slow
        )
    )
    return notes


def socket_queues(sock: Any) -> tuple[int, int]:
    """The kernel's queues of a TCP socket: bytes received and not yet read by its owner
    (``FIONREAD``), and bytes written and not yet acknowledged by the peer (``TIOCOUTQ``,
    Linux). (0, 0) when they cannot be read."""
    if sock is None or not hasattr(sock, "fileno"):
        return 0, 0
    try:
        fd = sock.fileno()
        if fd < 0:
            return 0, 0
        unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        unsent = struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, AttributeError, ValueError):
        return 0, 0
    return int(unread), int(unsent)


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine (the broker), if it can be read."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    except psutil.Error:
        return None
    return None


async def cpu_by_phase(
    samples: dict[str, list[tuple[float, float, float]]], broker_pid: int | None, measure: Any
) -> None:
    """Forever, every 0.5 s: by the phase of the run, the broker's CPU share of one core and
    the whole machine's busy share of its cores over the last half second (the harness's
    simulators, the broker and central share this machine)."""
    broker = None
    if broker_pid is not None:
        with contextlib.suppress(psutil.Error):
            broker = psutil.Process(broker_pid)

    def read() -> tuple[float, float, float]:
        cpus = psutil.cpu_times()
        used = 0.0 if broker is None else sum(broker.cpu_times()[:2])
        return time.monotonic(), used, cpus.idle + getattr(cpus, "iowait", 0.0)

    cores = psutil.cpu_count() or 1
    before = read()
    while True:
        await asyncio.sleep(0.5)
        try:
            now = read()
        except psutil.Error:
            return
        wall = now[0] - before[0]
        if wall > 0:
            samples.setdefault(measure.phase, []).append(
                ((now[1] - before[1]) / wall, 1 - (now[2] - before[2]) / wall / cores, wall)
            )
        before = now


def cpu_by_phase_note(samples: dict[str, list[tuple[float, float, float]]]) -> str:
    parts = []
    for phase, rows in samples.items():
        wall = sum(r[2] for r in rows)
        mean = sum(r[0] * r[2] for r in rows) / wall if wall else 0.0
        parts.append(
            f"{phase}: broker {mean:.0%} of a core (max {max(r[0] for r in rows):.0%}), "
            f"machine busy max {max(r[1] for r in rows):.0%}"
        )
    return "CPU by phase (0.5 s samples): " + "; ".join(parts)


def publish_queue_note(samples: dict[str, list[tuple[int, ...]]]) -> str:
    parts = []
    for phase, rows in samples.items():
        waited = sum(1 for r in rows if r[1]) / len(rows)
        unread = sorted(r[5] for r in rows)
        parts.append(
            f"{phase}: pending max {max(r[0] for r in rows)}, waiting max "
            f"{max(r[1] for r in rows)} ({waited:.0%} of samples), paho in flight max "
            f"{max(r[2] for r in rows)}, queued in paho max {max(r[3] for r in rows)}, "
            f"urgent waiting max {max(r[4] for r in rows)}, unread on central's socket p50 / "
            f"max {unread[len(unread) // 2] / 1e3:.0f} / {unread[-1] / 1e3:.0f} kB, unsent max "
            f"{max(r[6] for r in rows) / 1e3:.0f} kB"
        )
    return "central's publishes (every 50 ms): " + "; ".join(parts)


#: A submission published later than this (ms) is in the published tail's note.
SLOW_PUBLISH_MS = 200.0


def published_tail_note(
    placed: dict[str, tuple[float, float, str | None]],
    published: dict[str, float],
    handed: dict[str, float],
    healed: set[str],
) -> str | None:
    """Where the slow submissions' time went: how many were published past
    :data:`SLOW_PUBLISH_MS`, how many of those were placed on a node of the heal (whose
    desired-state document was answering its node's step 1 then), and their time in
    ``engine.submit``, from its return to the frame's hand-over to publish (the journals'
    writes, the document's send loop), and from there to the broker's PUBACK (the publish
    gate, paho's queue, the broker). None when none was slow."""
    slow = [
        (t, s) for t, s in placed.items()
        if t in published and (published[t] - s[0]) * 1e3 > SLOW_PUBLISH_MS
    ]  # fmt: skip
    if not slow:
        return None
    on_healed = sum(1 for _, s in slow if s[2] in healed)
    in_submit = [(s[1] - s[0]) * 1e3 for _, s in slow]
    parts = [f"in engine.submit max {max(in_submit):.0f} ms"]
    split = [
        ((s[1] - s[0]) * 1e3, (handed[t] - s[1]) * 1e3, (published[t] - handed[t]) * 1e3)
        for t, s in slow if t in handed
    ]  # fmt: skip
    if split:
        each = ", ".join(f"{a:.0f}+{b:.0f}+{c:.0f}" for a, b, c in split)
        parts.append(
            f"then to publish max {max(r[1] for r in split):.0f} ms, then to its PUBACK max "
            f"{max(r[2] for r in split):.0f} ms (each, submit+to publish+to PUBACK: {each} ms)"
        )
    return (
        f"published past {SLOW_PUBLISH_MS:.0f} ms: {len(slow)} of {len(published)}, "
        f"{on_healed} of them on a node of the heal; " + "; ".join(parts)
    )


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc 2.33 and later)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def mallinfo2() -> _MallInfo2 | None:
    """glibc's ``mallinfo2()`` of this process, all arenas (None off glibc 2.33+)."""
    try:
        call = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    call.restype = _MallInfo2
    info: _MallInfo2 = call()
    return info


def heap_note() -> str | None:
    """glibc's heap in this (central's) process, all arenas (``mallinfo2``): bytes in use,
    bytes free inside its arenas (resident until ``malloc_trim`` gives them back) and bytes in
    mmapped blocks. Python's small objects live in pymalloc's own arenas, not counted here.
    None off glibc."""
    info = mallinfo2()
    if info is None:
        return None
    return (
        f"glibc heap: {info.uordblks / 1e6:.0f} MB in use, {info.fordblks / 1e6:.0f} MB free "
        f"in its arenas ({info.keepcost / 1e6:.0f} MB at their tops), {info.hblkhd / 1e6:.0f} "
        "MB in mmapped blocks"
    )


def pymalloc_stats() -> dict[str, int]:
    """CPython's small-object allocator (pymalloc) in this process, from
    ``sys._debugmallocstats`` (which prints to the C stderr, read here through a temporary
    file): arenas allocated now, the bytes they span, and the bytes of their blocks in use.
    Empty where the interpreter has no such report."""
    debug = getattr(sys, "_debugmallocstats", None)
    if debug is None:
        return {}
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            debug()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found: dict[str, int] = {}
    for line in text.splitlines():
        label, _, value = line.rpartition("=")
        number = value.strip().replace(",", "")
        if not number.isdigit():
            continue
        label = label.strip()
        if label == "# arenas allocated current":
            found["arenas"] = int(number)
        elif label.endswith("bytes/arena"):
            found["arena_bytes"] = int(number)
        elif label == "# bytes in allocated blocks":
            found["in_use"] = int(number)
    return found


def smaps_rollup() -> dict[str, int]:
    """This process's resident memory by kind from ``/proc/self/smaps_rollup`` (kB):
    anonymous and file-backed. Empty off Linux."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return {}
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Anonymous", "Shared_Clean", "Private_Clean"):
            found[key] = int(rest.split()[0])
    return found


def memory_note(engine: CentralEngine) -> str:
    """Where central's resident memory is at the end of the run: anonymous against
    file-backed pages, pymalloc's arenas against the blocks in use in them, and how many of
    central's documents are live (a live replica is ~65 KiB more than a frozen one)."""
    parts = []
    rollup = smaps_rollup()
    if rollup:
        parts.append(
            f"resident {rollup.get('Rss', 0) / 1e3:.0f} MB, of it anonymous "
            f"{rollup.get('Anonymous', 0) / 1e3:.0f} MB"
        )
    stats = pymalloc_stats()
    if "arena_bytes" in stats and "in_use" in stats:
        parts.append(
            f"pymalloc: {stats.get('arenas', 0)} arenas, {stats['arena_bytes'] / 1e6:.0f} MB, "
            f"{stats['in_use'] / 1e6:.0f} MB of blocks in use"
        )
    freezer = engine.freezer
    replicas = sum(1 for name in freezer._live if name.startswith("node-"))
    parts.append(
        f"documents live {freezer.live} ({replicas} node replicas, "
        f"{freezer.live - replicas} desired-state), frozen {freezer.frozen}"
    )
    return "central's memory: " + "; ".join(parts)


def _deep_size(root: object, seen: set[int]) -> tuple[int, int, Counter[str]]:
    """Bytes (``sys.getsizeof``) and count of the Python objects reachable from ``root`` not
    in ``seen`` (which it extends), not descending into modules, classes and functions; and
    the bytes by type."""
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    kinds: Counter[str] = Counter()
    if id(root) in seen:
        return 0, 0, kinds
    size = count = 0
    stack = [(r, type(root).__name__) for r in gc.get_referents(root)]
    seen.add(id(root))
    size += sys.getsizeof(root)
    while stack:
        obj, held_by = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        bytes_ = sys.getsizeof(obj)
        size += bytes_
        kind = type(obj).__name__
        kinds[f"{kind} in {held_by}" if kind in ("bytes", "dict", "list") else kind] += bytes_
        count += 1
        holder = getattr(obj, "__qualname__", kind) if kind == "coroutine" else kind
        stack.extend((r, holder) for r in gc.get_referents(obj))
    return size, count, kinds


def _rebuilt_bytes(engine: CentralEngine) -> str:
    """glibc heap taken by pycrdt documents rebuilt from central's: the fleet document, and
    a live node replica (times the live replicas): what their Rust side holds, roughly."""
    if mallinfo2() is None:
        return "pycrdt's side not measured (no mallinfo2)"

    def in_use() -> int:
        info = mallinfo2()
        assert info is not None
        return int(info.uordblks)

    def cost(state: bytes) -> int:
        before = in_use()
        doc: pycrdt.Doc[Any] = pycrdt.Doc()
        doc.apply_update(state)
        after = in_use()
        del doc
        return after - before

    parts = []
    if engine.fleet is not None:
        parts.append(f"the fleet document rebuilt {cost(engine.fleet.snapshot()) / 1e6:.0f} MB")
    live = [r.doc for r in engine.replicas.replicas.values() if not r.doc.frozen]
    if live:
        sample = live[: min(len(live), 20)]
        each = sum(cost(d.snapshot()) for d in sample) / len(sample)
        parts.append(
            f"a live replica rebuilt {each / 1e3:.0f} kB, x{len(live)} live "
            f"{each * len(live) / 1e6:.0f} MB"
        )
    return ", ".join(parts)


def _one_document(engine: CentralEngine) -> str:
    """What one node's two documents hold on central's Python side, attribute by attribute:
    a frozen node replica and its peer, a frozen desired document and its peer (objects the
    engine, the index, the session or the event loop reach are not counted)."""
    loop = asyncio.get_running_loop()
    base = {id(engine), id(engine.index), id(loop), id(engine.session), id(engine.replicas)}
    out = []
    frozen = [r for r in engine.replicas.replicas.values() if r.doc.frozen]
    pairs: list[tuple[str, object, object]] = []
    if frozen:
        pairs.append(("a frozen replica", frozen[0].doc, frozen[0].peer))
    desired = getattr(engine, "desired", None)
    if desired is not None:
        for node_id, doc in desired.docs.items():
            if doc.frozen:
                pairs.append(("a frozen desired document", doc, desired.peers[node_id]))
                break
    for label, *objs in pairs:
        seen = set(base)
        for obj in objs:
            seen.add(id(obj))
        parts = []
        for obj in objs:
            names = [n for k in type(obj).__mro__ for n in getattr(k, "__slots__", ())]
            names += list(getattr(obj, "__dict__", ()))
            own = sys.getsizeof(obj)
            if hasattr(obj, "__dict__"):
                own += sys.getsizeof(obj.__dict__)
            parts.append((f"{type(obj).__name__} itself", own))
            for name in names:
                held = getattr(obj, name, None)
                if callable(held) or (
                    isinstance(held, list) and held and all(callable(h) for h in held)
                ):  # (a callback reaches its owner, and through it everything: its own size)
                    size = (
                        sys.getsizeof(held) + sum(map(sys.getsizeof, held))
                        if isinstance(held, list)
                        else sys.getsizeof(held)
                    )
                else:
                    size = _deep_size(held, seen)[0]
                parts.append((f"{type(obj).__name__}.{name}", size))
        total = sum(b for _, b in parts)
        parts.sort(key=lambda p: -p[1])
        shown = ", ".join(f"{n} {b:,}" for n, b in parts if b)
        out.append(f"{label}: {total:,} B ({shown})")
    return "; ".join(out)


def memory_breakdown(engine: CentralEngine) -> str:
    """Central's Python objects by what holds them (``--memory-breakdown``): the deep size
    of each part, each object counted once, for the first part that reaches it in the order
    below (the index's fields one by one, then the documents' Python side, then the rest of
    the engine). pycrdt's own memory (Rust, glibc's heap) is not in it."""
    parts: list[tuple[str, int, int, Counter[str]]] = []
    index = engine.index
    parts_of = ("fleet", "policy", "replicas", "desired", "liveness", "services", "session")
    # the parts themselves are walked only as roots (a callback's bound method reaches the
    # engine, and through it everything)
    # (and the event loop last: an asyncio event's waiters reach it, and it reaches every task)
    loop = asyncio.get_running_loop()
    seen = {id(engine), id(index), id(loop), *(id(getattr(engine, n, None)) for n in parts_of)}
    for name in sorted(vars(index), key=lambda n: n != "members"):
        if name == "members":
            members = index.members
            for field_name in ("reports", "keys", "placements", "states", "registration"):
                size = count = 0
                kinds: Counter[str] = Counter()
                for member in members.values():
                    s, c, k = _deep_size(getattr(member, field_name), seen)
                    size += s
                    count += c
                    kinds.update(k)
                parts.append((f"index.members[*].{field_name}", size, count, kinds))
        parts.append((f"index.{name}", *_deep_size(getattr(index, name), seen)))
    for name in parts_of:
        value = getattr(engine, name, None)
        if value is None:
            continue
        fields = getattr(value, "__dict__", None)
        for i, callback in enumerate(getattr(value, "_callbacks", ())):
            owner = getattr(callback, "__self__", None)  # (a peer's, a journal's)
            names = [n for k in type(owner).__mro__ for n in getattr(k, "__slots__", ())] + list(
                getattr(owner, "__dict__", ())
            )
            for field_name, held in sorted((n, getattr(owner, n, None)) for n in names):
                parts.append(
                    (f"engine.{name}._callbacks[{i}] {type(owner).__name__}.{field_name}",
                     *_deep_size(held, seen))
                )  # fmt: skip
        for field_name, held in sorted((fields or {}).items()):
            parts.append((f"engine.{name}.{field_name}", *_deep_size(held, seen)))
        seen.discard(id(value))
        parts.append((f"engine.{name}", *_deep_size(value, seen)))
    seen.discard(id(engine))
    for name, held in sorted(vars(engine).items()):
        parts.append((f"engine.{name}", *_deep_size(held, seen)))
    parts.append(("engine (the rest)", *_deep_size(engine, seen)))
    seen.discard(id(loop))
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        where = frame.f_code.co_qualname if frame is not None else "?"
        parts.append((f"task {task.get_name()} ({where})", *_deep_size(task, seen)))
    parts.append(("the event loop (the rest)", *_deep_size(loop, seen)))
    rust = _rebuilt_bytes(engine)
    same = other = 0
    for member in index.members.values():
        reported = {k: k for k in member.reports}
        for key in member.keys:
            held = reported.get(key)
            if held is key:
                same += 1
            elif held is not None:
                other += 1
    # how many string objects each task id is held as, across the index's holders (dict
    # keys are invisible to the walk above: they are counted here)
    copies: Counter[int] = Counter()
    extra_bytes = 0
    keys_of: dict[str, dict[int, str]] = {}

    def hold(key: str) -> None:
        keys_of.setdefault(key, {})[id(key)] = key

    for key, entry in index.assignments.items():
        hold(key)
        hold(entry.spec.id)
    for key in index.holders:
        hold(key)
    for member in index.members.values():
        for key in member.reports:
            hold(key)
    for key in index.task_ids:
        hold(key)
    for objs in keys_of.values():
        copies[len(objs)] += 1
        extra_bytes += sum(sys.getsizeof(o) for o in list(objs.values())[1:])
    ids_note = (
        "task ids held as "
        + ", ".join(f"{n} string(s): {c:,}" for n, c in sorted(copies.items()))
        + f" ({extra_bytes / 1e6:.1f} MB in the copies beyond one)"
    )
    parts.sort(key=lambda p: -p[1])
    shown = [
        f"{n} {s / 1e6:.1f} MB ({c:,} objects: "
        + ", ".join(f"{kind} {b / 1e6:.1f}" for kind, b in k.most_common(4 if s < 1e8 else 12))
        + ")"
        for n, s, c, k in parts
        if s >= 1e6
    ]
    total = sum(p[1] for p in parts)
    return (
        f"central's Python objects, {total / 1e6:.0f} MB (footprint ids shared with the "
        f"reports' {same:,}, equal but not shared {other:,}; {rust}; {ids_note}): "
        + "; ".join(shown)
    )


#: Documents the heal's convergence check hashes between two turns of the event loop.
HASHES_PER_TURN = 20


class GcClock:
    """CPython's cyclic garbage collector in this (central's) process, as a ``gc.callbacks``
    entry: collections and their time by generation since :meth:`reset` (the window)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = 0.0
        self._began: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            took = time.perf_counter() - self._began
            self.counts[info["generation"]] += 1
            self.seconds[info["generation"]] += took
            self.longest = max(self.longest, took)
            self._began = None

    def reset(self) -> None:
        self.counts, self.seconds, self.longest = [0, 0, 0], [0.0, 0.0, 0.0], 0.0

    def note(self, window_s: float) -> str:
        parts = ", ".join(f"gen{g} {self.counts[g]} ({self.seconds[g]:.1f} s)" for g in range(3))
        share = sum(self.seconds) / window_s if window_s > 0 else 0.0
        return (
            f"garbage collector in the window: {parts}, longest {self.longest * 1000:.0f} ms, "
            f"{share:.0%} of the window"
        )


class Measure:
    """Everything one size measures, summarised on demand (also from a reporter thread)."""

    def __init__(self, scale: Scale) -> None:
        self.scale = scale
        self.phase = "starting"
        self.finished = False
        self.started = time.time()
        self.steps: list[tuple[float, float]] = []  # (start, seconds)
        self.lock_waits: list[float] = []  # seconds, the engine's lock (time_submission_parts)
        self.store_lock: TimedStoreLock | None = None  # (time_submission_parts)
        self.flush_waits: list[float] = []  # seconds, the fleet journal's flush
        self.step_max: tuple[float, str] = (0.0, "")  # the longest step, and in which phase
        self.gc = GcClock()
        self.submits: dict[str, tuple[float, float, str | None]] = {}  # id: (call, back, node)
        self.refused = 0
        self.skipped = 0
        self.seen: dict[str, tuple[str, float]] = {}
        #: submission id -> when central's publish of the desired-state update carrying it
        #: was acknowledged by the broker (QoS 1: its PUBACK); :func:`time_publishes`
        self.published: dict[str, float] = {}
        self.awaiting_publish: set[str] = set()
        #: task id -> when the first desired-state frame carrying it was handed to publish
        #: (past the journals' writes, before the publish gate and the broker's PUBACK)
        self.handed: dict[str, float] = {}
        self.projected_at_once = 0  # submissions in their node's desired document on return
        self.healed_at: dict[str, float] = {}
        #: the healed share's nodes and when they were cut off (a submission placed on one of
        #: them shortly before is seen only once it is back: that wait is the heal's)
        self.cut_off: tuple[frozenset[str], float] | None = None
        self.converged_at: dict[str, float] = {}
        #: seconds each round of the heal's convergence check took (a node converged during
        #: one is stamped at the next: its stamp is late by up to a round)
        self.check_rounds: list[float] = []
        self.fleet_up_s: float | None = None
        self.window: list[float] = []  # [start] or [start, end]
        self.cpu0 = 0.0
        self.cpu_s: float | None = None
        self.status0: dict[str, Any] = {}
        self.status1: dict[str, Any] = {}
        self.sims: list[dict[str, Any]] = []
        self.rss_max = 0.0
        self.notes: list[str] = []
        self.seeded = 0
        self.seed_s: float | None = None  # the seeder's time: central's store, nodes' docs
        self.seeder_rss_mb: float | None = None
        self.restart_s: float | None = None  # central's start from that store, to connected
        self.restart_writes: int | None = None  # entries DesiredDocs.match wrote at start
        self.projected = 0  # of them, in central's index after its restart
        self.fresh = 0  # nodes fresh at central (counted while the fleet comes up)
        self.desired_synced = 0  # nodes whose desired-state replica central answered
        self.desired_held = 0  # assignments those replicas held at fleet up
        self.published_total: int | None = None
        self.log = CentralLog()

    def sample(self) -> None:
        self.rss_max = max(self.rss_max, psutil.Process().memory_info().rss / 1e6)

    def summary(self) -> dict[str, Any]:
        proc = psutil.Process()
        now = time.time()
        start = self.window[0] if self.window else None
        end = self.window[1] if len(self.window) > 1 else now
        steps = [d for t, d in list(self.steps) if start is not None and t >= start]
        all_steps = [d for _, d in list(self.steps)]
        submits = dict(self.submits)
        seen = dict(self.seen)
        placed = {t: s for t, s in submits.items() if s[2] is not None}
        latency = [seen[t][1] - s[0] for t, s in placed.items() if t in seen]
        cut_nodes, cut_at = self.cut_off or (frozenset(), float("inf"))
        online = [  # placed on a node that stayed up until it saw it
            seen[t][1] - s[0] for t, s in placed.items()
            if t in seen and not (s[2] in cut_nodes and seen[t][1] > cut_at)
        ]  # fmt: skip
        wrong = sum(1 for t, s in placed.items() if t in seen and seen[t][0] != s[2])
        published = dict(self.published)
        out_at = [published[t] - s[0] for t, s in placed.items() if t in published]
        heal = [self.converged_at[n] - at for n, at in dict(self.healed_at).items()
                if n in self.converged_at]  # fmt: skip
        tail_note = published_tail_note(placed, published, dict(self.handed), set(self.healed_at))
        window_s = (end - start) if start is not None else None
        out: dict[str, Any] = {
            "nodes": self.scale.nodes,
            "phase": self.phase,
            "finished": self.finished,
            "elapsed_s": now - self.started,
            "seeded_assignments": self.seeded,
            "projected_assignments": self.projected,
            "seed_s": self.seed_s,
            "seeder_rss_mb": self.seeder_rss_mb,
            "restart_s": self.restart_s,
            "restart_writes": self.restart_writes,
            "fresh": self.fresh,
            "desired_synced": self.desired_synced,
            "desired_held": self.desired_held,
            "fleet_up_s": self.fleet_up_s,
            "window_s": window_s,
            "steps": len(steps),
            "steps_all": len(all_steps),
            "step_p50_ms": _ms(pct(steps, 50)),
            "step_p99_ms": _ms(pct(steps, 99)),
            "step_max_ms": _ms(max(all_steps, default=None)),
            "step_max_phase": self.step_max[1],
            "step_busy": (sum(steps) / window_s) if window_s else None,
            "submitted": len(submits),
            "placed": len(placed),
            "refused": self.refused,
            "skipped": self.skipped,
            "seen": sum(1 for t in placed if t in seen),
            "seen_wrong_node": wrong,
            "submit_call_p50_ms": _ms(pct((s[1] - s[0] for s in submits.values()), 50)),
            "submit_call_p99_ms": _ms(pct((s[1] - s[0] for s in submits.values()), 99)),
            "assignments_published": len(out_at),
            "projected_at_once": self.projected_at_once,
            "published_p50_ms": _ms(pct(out_at, 50)),
            "published_p99_ms": _ms(pct(out_at, 99)),
            "seen_p50_ms": _ms(pct(latency, 50)),
            "seen_p99_ms": _ms(pct(latency, 99)),
            "seen_online": len(online),
            "seen_online_p50_ms": _ms(pct(online, 50)),
            "seen_online_p99_ms": _ms(pct(online, 99)),
            "healed": len(self.healed_at),
            "converged": len(heal),
            "heal_p50_s": pct(heal, 50),
            "heal_p99_s": pct(heal, 99),
            "check_round_max_s": max(self.check_rounds, default=None),
            "rss_mb": proc.memory_info().rss / 1e6,
            "rss_max_mb": max(self.rss_max, proc.memory_info().rss / 1e6),
            "cpu_s": self.cpu_s
            if self.cpu_s is not None
            else (sum(proc.cpu_times()[:2]) - self.cpu0 if start is not None else None),
            "notes": list(self.notes) + ([] if tail_note is None else [tail_note]),
            "central_log": dict(self.log.counts),
            "central_errors": list(self.log.first),
            "central_warnings": dict(self.log.warnings),
        }
        if window_s and self.status0 and self.status1:
            merged = self.status1["updates_in"] - self.status0["updates_in"]
            out["merged"] = merged
            out["merged_per_s"] = merged / window_s
            out["rejected"] = sum(self.status1["rejected"].values()) - sum(
                self.status0["rejected"].values()
            )
        if self.published_total is not None and self.status1:
            # since the start (the fleet's bring-up too): the nodes' document messages
            # (updates and step 2 answers) against what central's replicas applied
            # (more applied than published: QoS 1 redeliveries, after a reconnect of central's)
            out["published"] = self.published_total
            missing = self.published_total - self.status1["updates_in"]
            out["not_applied"] = max(0, missing)
            out["applied_twice"] = max(0, -missing)
        if self.sims:
            out["broker_dropped"] = max(s["broker_dropped"] for s in self.sims)
            rows = [r for s in self.sims for r in s["per_node"]]
            if window_s:
                ins = [r[0] / window_s * 3600 for r in rows]
                outs = [r[1] / window_s * 3600 for r in rows]
                out["in_mb_h"] = sum(ins) / len(ins) / 1e6
                out["out_mb_h"] = sum(outs) / len(outs) / 1e6
                out["in_mb_h_max"] = max(ins) / 1e6
            online_h = sum(r[2] for r in rows) / 3600
            for kind in RECEIVED_KINDS:
                got = sum(s["received"][kind] for s in self.sims)
                out[f"in_{kind}_mb_h"] = got / online_h / 1e6 if online_h else None
            for kind in SENT_KINDS:
                sent = sum(s["sent"][kind] for s in self.sims)
                out[f"out_{kind}_mb_h"] = sent / online_h / 1e6 if online_h else None
            sim_window = max(s["window_s"] for s in self.sims)
            out["sim_cpu_window_s"] = sum(s["cpu_window_s"] for s in self.sims)
            out["sim_cpu_share"] = out["sim_cpu_window_s"] / sim_window if sim_window else None
            out["sim_cpu_s"] = sum(s["cpu_s"] for s in self.sims)
            out["sim_rss_mb"] = sum(s["rss_mb"] for s in self.sims)
            counts: dict[str, int] = {}
            for s in self.sims:
                for k, v in s["counts"].items():
                    counts[k] = counts.get(k, 0) + v
            out["sim_counts"] = counts
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


class Sims:
    """The simulator processes and their pipes, read by one polling task."""

    def __init__(self, measure: Measure) -> None:
        self.measure = measure
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.replies: list[asyncio.Queue[tuple[Any, ...]]] = []

    def start(self, plans: list[SimPlan]) -> None:
        ctx = mp.get_context("spawn")
        for plan in plans:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=simulator_main, args=(plan, theirs), daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
            self.replies.append(asyncio.Queue())

    async def poll(self) -> None:
        while True:
            for conn, replies in zip(self.conns, self.replies, strict=True):
                with contextlib.suppress(EOFError, OSError):
                    while conn.poll():
                        message = conn.recv()
                        if message[0] == "seen":
                            for task_id, node, at in message[1]:
                                self.measure.seen.setdefault(task_id, (node, at))
                        else:
                            replies.put_nowait(message)
            await asyncio.sleep(0.02)

    def check(self) -> None:
        """RuntimeError if a simulator process died."""
        for proc in self.procs:
            if not proc.is_alive():
                raise RuntimeError(f"simulator process {proc.name} exited {proc.exitcode}")

    async def replies_of_all(self) -> list[tuple[Any, ...]]:
        out = []
        for q in self.replies:
            while q.empty():
                self.check()
                await asyncio.sleep(0.05)
            out.append(q.get_nowait())
        return out

    async def ask(self, *message: object) -> list[tuple[Any, ...]]:
        """Send ``message`` to every simulator; one reply of each."""
        for conn in self.conns:
            conn.send(message)
        return await self.replies_of_all()

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def wrap_control_step(engine: CentralEngine, measure: Measure) -> None:
    """Time every call of this engine's ``control_step`` (its control loop calls it)."""
    original = engine.control_step

    def timed() -> None:
        start, t0 = time.time(), time.perf_counter()
        try:
            original()
        finally:
            took = time.perf_counter() - t0
            measure.steps.append((start, took))
            if took > measure.step_max[0]:
                measure.step_max = (took, measure.phase)

    engine.control_step = timed  # type: ignore[method-assign]


def time_submission_parts(engine: CentralEngine, measure: Measure) -> None:
    """Time the two waits of ``engine.submit`` while it runs: the engine's lock (a control
    step may hold it) and the fleet journal's flush (the assignment on disk); what a slow
    submission waited for, said in the size's notes (:func:`submission_parts`)."""
    lock, journal = engine._lock, engine._fleet_journal
    acquire = lock.acquire

    async def timed_acquire() -> bool:
        t0 = time.perf_counter()
        try:
            return await acquire()
        finally:
            measure.lock_waits.append(time.perf_counter() - t0)

    lock.acquire = timed_acquire  # type: ignore[method-assign,assignment]
    measure.store_lock = TimedStoreLock(engine.store)
    engine.store._lock = measure.store_lock  # type: ignore[assignment]
    if journal is not None:
        flushed = journal.flushed

        async def timed_flushed() -> None:
            t0 = time.perf_counter()
            try:
                await flushed()
            finally:
                measure.flush_waits.append(time.perf_counter() - t0)

        journal.flushed = timed_flushed  # type: ignore[method-assign]


class TimedStoreLock:
    """Central's store lock (``Store._lock``, which a transaction block holds), timed by the
    asyncio task that takes it: how long each waited for it, how long it held it and how many
    of the store's jobs (turns of its thread, each a hand-back to the loop) it ran meanwhile;
    and every job (``Store._job``: queued in the database thread, run, handed back) timed by
    its task. What a submission's journal write waits behind, said in the notes."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.inner: asyncio.Lock = store._lock
        self.by_task: dict[str, list[tuple[float, float, int]]] = {}
        self._held: tuple[str, float, float, int] | None = None
        self.jobs: dict[str, list[float]] = {}
        #: each job's own run in the database thread, by the task that queued it
        self.runs: dict[str, list[float]] = {}
        #: each job's own run, by the store method that made it
        self.kinds: dict[str, list[float]] = {}
        job = store._job

        async def timed_job(fn: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            ran: list[float] = []

            def run(conn: Any) -> Any:
                r0 = time.perf_counter()
                try:
                    return fn(conn)
                finally:
                    ran.append(time.perf_counter() - r0)

            try:
                return await job(run, *args, **kwargs)
            finally:
                self.jobs.setdefault(self._name(), []).append(time.perf_counter() - t0)
                self.runs.setdefault(self._name(), []).extend(ran)
                self.kinds.setdefault(_job_kind(fn), []).extend(ran)

        store._job = timed_job

    @staticmethod
    def _name() -> str:
        task = asyncio.current_task()
        name = "-" if task is None else task.get_name()
        return "submission" if name.startswith("Task-") else name

    async def acquire(self) -> bool:
        t0 = time.perf_counter()
        await self.inner.acquire()
        got = time.perf_counter()
        self._held = (self._name(), got - t0, got, self.store.jobs)
        return True

    def release(self) -> None:
        if self._held is not None:
            name, waited, got, jobs = self._held
            held = time.perf_counter() - got
            self.by_task.setdefault(name, []).append((waited, held, self.store.jobs - jobs))
        self._held = None
        self.inner.release()

    def locked(self) -> bool:
        return self.inner.locked()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def note(self) -> str:
        """Per holder: holds, wait p99, hold p50 / p99 / max, jobs per hold p99, total."""
        rows = []
        by_total = sorted(self.by_task.items(), key=lambda kv: -sum(h for _, h, _ in kv[1]))
        for name, holds in by_total:
            waits = [w for w, _, _ in holds]
            held = [h for _, h, _ in holds]
            jobs = [float(j) for _, _, j in holds]
            rows.append(
                f"{name}: {len(holds)} holds, wait p99 {_ms(pct(waits, 99)):.0f} ms, hold p50 / p99"
                f" / max {_ms(pct(held, 50)):.0f} / {_ms(pct(held, 99)):.0f} / "
                f"{_ms(max(held)):.0f} ms, jobs p99 {pct(jobs, 99):.0f}, total {sum(held):.1f} s"
            )
        job_rows = []
        for name, took in sorted(self.jobs.items(), key=lambda kv: -sum(kv[1])):
            ran = self.runs.get(name) or [0.0]
            job_rows.append(
                f"{name}: {len(took)} jobs, p50 / p99 / max {_ms(pct(took, 50)):.0f} / "
                f"{_ms(pct(took, 99)):.0f} / {_ms(max(took)):.0f} ms, total {sum(took):.1f} s "
                f"(run in the thread p50 / p99 / max {_ms(pct(ran, 50)):.0f} / "
                f"{_ms(pct(ran, 99)):.0f} / {_ms(max(ran)):.0f} ms)"
            )
        kinds = sorted(self.kinds.items(), key=lambda kv: -max(kv[1], default=0.0))
        kind_rows = [
            f"{kind} {len(ran)}, p99 / max {_ms(pct(ran, 99)):.0f} / {_ms(max(ran)):.0f} ms"
            for kind, ran in kinds[:6] if ran
        ]  # fmt: skip
        return (
            "the store's lock (blocks) by holder: " + "; ".join(rows[:8])
            + "; the store's jobs (queued, run, handed back) by task: " + "; ".join(job_rows[:8])
            + "; their runs in the thread by the store's call: " + ", ".join(kind_rows)
        )  # fmt: skip


def _job_kind(fn: Any) -> str:
    """The store method a job of ``Store._job`` came from: its body's qualified name
    (``Store.replace_docs.<locals>.body`` is ``replace_docs``), through the partials."""
    while isinstance(fn, functools.partial):
        bodies = [a for a in fn.args if callable(a)]
        fn = bodies[-1] if bodies else fn.func
    parts = getattr(fn, "__qualname__", "?").split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "Store" else parts[0]


def submission_parts(measure: Measure) -> str:
    """The waits :func:`time_submission_parts` timed, as a note."""

    def ms(values: list[float], q: float) -> str:
        return "-" if not values else f"{_ms(pct(values, q)):.0f}"

    return (
        f"waits while submitting: the engine's lock p50 {ms(measure.lock_waits, 50)} / p99 "
        f"{ms(measure.lock_waits, 99)} ms ({len(measure.lock_waits)} taken, control steps "
        f"too), the fleet journal's flush p50 {ms(measure.flush_waits, 50)} / p99 "
        f"{ms(measure.flush_waits, 99)} ms"
    )


def time_publishes(measure: Measure) -> None:
    """Note when central's publish of a desired-state update carrying a submission returns:
    the broker acknowledged it (QoS 1). Wraps the publish its document peers call; an
    update carries the task id's bytes (the assignment's key), so the first acknowledged
    desired-state frame holding them is the one. The issue's "assignment published"."""
    original = peer_module.publish  # type: ignore[attr-defined]

    async def timed(client: Any, topic: str, payload: bytes, **kwargs: Any) -> None:
        carried: list[str] = []  # the submissions awaited that this frame carries
        if measure.awaiting_publish and "/doc/desired-" in topic:
            now = time.time()
            carried = [t for t in measure.awaiting_publish if t.encode() in payload]
            for task_id in carried:
                measure.handed.setdefault(task_id, now)  # past its journal, at the gate
        await original(client, topic, payload, **kwargs)
        now = time.time()
        for task_id in carried:
            if task_id in measure.awaiting_publish:  # (not acknowledged in another frame)
                measure.awaiting_publish.discard(task_id)
                measure.published[task_id] = now

    peer_module.publish = timed  # type: ignore[attr-defined]


async def submit_loop(engine: CentralEngine, measure: Measure, stop: asyncio.Event) -> None:
    """Submissions at central at ``rate``, each awaited in its own task (at most
    :data:`MAX_SUBMITS_IN_FLIGHT`; a tick beyond it, or one the loop fell behind on, is
    skipped and counted)."""
    interval = 1 / measure.scale.rate
    in_flight: set[asyncio.Task[None]] = set()
    count = 0
    due = time.monotonic()
    time_submission_parts(engine, measure)
    time_publishes(measure)

    async def one(task_id: str) -> None:
        spec = TaskSpec(id=task_id, command=("sleep", str(measure.scale.run_s)), cpu=0.1,
                        mem_gib=0.1, duration_s=measure.scale.run_s)  # fmt: skip
        measure.awaiting_publish.add(task_id)
        called = time.time()
        try:
            view = await engine.submit(spec)
        except Exception as exc:  # a refusal is a figure, not a crash
            measure.refused += 1
            log.warning("submit %s refused: %s", task_id, exc)
            return
        node = view["node"] if view["state"] == "active" else None
        measure.submits[task_id] = (called, time.time(), node)
        desired = engine.desired.docs.get(node) if engine.desired and node else None
        if desired is not None and desired.assignment(task_id) is not None:
            measure.projected_at_once += 1  # in the node's desired document as submit returns

    while not stop.is_set():
        now = time.monotonic()
        if now < due:
            await asyncio.sleep(due - now)
            continue
        due += interval
        if now - due > 1.0 or len(in_flight) >= MAX_SUBMITS_IN_FLIGHT:
            measure.skipped += 1
            continue
        count += 1
        task = asyncio.create_task(one(f"{SUBMISSION_PREFIX}{count:06d}"))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(in_flight, timeout=30)


class OverBudget(Exception):
    pass


async def quiesce(engine: CentralEngine, published: int, wait_s: float) -> None:
    """With the nodes frozen, give central until it applied all they published since they
    started (or made no progress for 5 s, or ``wait_s`` passed): what is missing then was
    lost."""
    base = 0
    end = time.monotonic() + wait_s
    last, last_change = -1, time.monotonic()
    while time.monotonic() < end:
        applied = engine.status()["updates_in"] - base
        if applied >= published:
            return
        if applied != last:
            last, last_change = applied, time.monotonic()
        elif time.monotonic() - last_change > 5.0:
            return
        await asyncio.sleep(0.25)


async def run_size(
    scale: Scale,
    port: int,
    workdir: Path,
    measure: Measure | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One size, start to end; the summary. Phases past the deadline are cut short."""
    measure = measure or Measure(scale)
    capture: Capture | None = None
    deadline = time.monotonic() + scale.budget_s
    ids = node_ids(scale.nodes)
    config = EdgeschedConfig(
        central=CentralConfig(
            central_id=CENTRAL_ID, state_dir=str(workdir / "central"), api_port=0,
            mqtt=MqttConfig(port=port, reconnect_max_s=1.0),
        )
    )  # fmt: skip
    if scale.replica_cold_after_s is not None:
        config = replace(
            config, central=replace(config.central, replica_cold_after_s=scale.replica_cold_after_s)
        )
    procs = max(1, min(scale.procs, scale.nodes))
    nodes_files = [str(workdir / f"nodes-{k}.pickle") for k in range(procs)]
    measure.phase = "seeding"  # central's store and the nodes' own, in a process of its own
    try:
        async with asyncio.timeout(scale.budget_s):
            seeded = await run_seeder(
                SeedPlan(scale, tuple(ids), config.central.state_dir, tuple(nodes_files),
                         time.time())
            )  # fmt: skip
    except (TimeoutError, RuntimeError) as exc:
        measure.notes.append(f"seeding failed: {exc!r}")
        return measure.summary()
    measure.seeded, measure.seed_s = seeded["assignments"], seeded["seconds"]
    measure.seeder_rss_mb = seeded["rss_mb"]
    engine = CentralEngine(config)
    wrap_control_step(engine, measure)
    measure.log.attach()
    measure.phase = "central start"  # restored from SQLite: the fleet, desired docs, replicas
    restart_t0 = time.time()
    engine_task = asyncio.create_task(engine.run(), name="central")
    sims = Sims(measure)
    background: list[asyncio.Task[None]] = []

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OverBudget(measure.phase)
        return remaining

    async def until(pred: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
        end = time.monotonic() + min(timeout, left())
        while not pred():
            if time.monotonic() > end:
                return False
            sims.check()  # (a simulator that died: said at once, not after the wait)
            await asyncio.sleep(interval)
            measure.sample()
        return True

    try:
        async with asyncio.timeout(min(scale.up_s, left())):
            await engine.wait_ready()
        await until(lambda: engine.session.connected, 30)
        measure.restart_s = time.time() - restart_t0
        policy = engine.policy
        assert policy is not None and engine.desired is not None
        measure.restart_writes = engine.desired.writes  # what DesiredDocs.match had to write
        measure.projected = projected_assignments(engine, ids)
        if measure.projected != measure.seeded:
            measure.notes.append(
                f"central's index holds {measure.projected} of {measure.seeded} seeded "
                "assignments after its restart"
            )
        snapshot = workdir / "policy.snapshot"  # the fleet-wide one: mode, tidal, models
        snapshot.write_bytes(policy.snapshot())
        measure.phase = "simulators start"
        plans = [
            SimPlan(k, tuple(ids[k::procs]), port, str(snapshot), scale, nodes_files[k])
            for k in range(procs)
        ]
        sims.start(plans)
        background.append(asyncio.create_task(sims.poll()))
        if report is not None:
            background.append(asyncio.create_task(_report_loop(measure, report)))
        started = time.time()
        async with asyncio.timeout(left()):
            ready = await sims.replies_of_all()
        assert all(r[0] == "ready" for r in ready), ready
        measure.phase = "fleet up"  # both waits below within up_s: then the window starts
        up_end = time.monotonic() + scale.up_s

        def fleet_fresh() -> bool:
            measure.fresh = sum(1 for n in ids if engine.is_fresh(n))
            return measure.fresh == len(ids)

        up = await until(fleet_fresh, scale.up_s, 1.0)
        if not up:
            measure.notes.append(f"fleet never fully fresh: {measure.fresh}/{len(ids)} nodes")
            measure.notes.append(why_not_fresh(engine, ids))
        # ... and every node's desired-state replica answered by central (its step 2)
        end = min(up_end, time.monotonic() + left())
        while True:
            replies = await sims.ask("desired")
            measure.desired_synced = sum(r[1] for r in replies)
            measure.desired_held = sum(r[2] for r in replies)
            if measure.desired_synced >= len(ids) or time.monotonic() > end:
                break
            await asyncio.sleep(0.5)
        if measure.desired_synced < len(ids):
            waiting = [n for r in replies for n in r[3]][:5]
            measure.notes.append(
                f"desired documents synced at {measure.desired_synced}/{len(ids)} nodes "
                f"(never answered: {', '.join(waiting)}, ...)"
            )
        measure.fleet_up_s = time.time() - started

        measure.phase = "steady"
        if scale.capture is not None:
            capture = start_capture(Path(scale.capture), port)
        await sims.ask("mark")
        measure.status0 = engine.status()
        measure.cpu0 = sum(psutil.Process().cpu_times()[:2])
        measure.window = [time.time()]
        measure.gc.reset()
        gc.callbacks.append(measure.gc)
        lags: list[float] = []
        lag_probe = asyncio.create_task(loop_lag(lags))
        holds = HoldSampler() if scale.hold_sample else None
        hold_probe = None if holds is None else asyncio.create_task(holds.run())
        publishes: dict[str, list[tuple[int, ...]]] = {}
        publish_probe = asyncio.create_task(publish_queue(publishes, measure))
        cpus: dict[str, list[tuple[float, float, float]]] = {}
        cpu_probe = asyncio.create_task(cpu_by_phase(cpus, listener_pid(port), measure))
        stop_submitting = asyncio.Event()
        submitter = asyncio.create_task(submit_loop(engine, measure, stop_submitting))
        await until(lambda: False, scale.steady_s)

        measure.phase = "heal: offline"
        healed = healed_nodes(ids, scale.heal_share)
        measure.cut_off = (frozenset(healed), time.time())
        await sims.ask("heal_start", healed)
        await until(lambda: False, scale.offline_s)
        measure.phase = "heal: converging"
        for reply in await sims.ask("heal_end", healed):
            measure.healed_at.update(reply[1])
        pending = set(healed)
        end = time.monotonic() + scale.converge_s
        while pending and time.monotonic() < min(end, deadline):
            fresh = [n for n in pending if engine.is_fresh(n)]
            if fresh:
                # Hash only what may have converged (its state vector is central's), a few
                # at a time: the check runs in central's process, and hashing a thousand
                # documents at once held its loop for seconds (counted against the heal
                # and against the submissions waiting meanwhile).
                vectors: dict[str, tuple[int, bytes, int, bytes]] = {}
                for reply in await sims.ask("vectors", fresh):
                    vectors.update(reply[1])
                desired = engine.desired
                assert desired is not None
                # Each node's document and desired document at the same state vectors on
                # both sides (and the node holds what central wants), then their deletions
                # (the diff against that vector: the delete set alone, from a frozen
                # document's bytes without a thaw), compared in the simulators.
                checked = time.time()
                taken = []
                for node_id, (epoch, sv, feed_epoch, feed_sv) in vectors.items():
                    doc = engine.replicas.replicas[node_id].doc
                    ours = desired.docs.get(node_id)
                    if (
                        ours is not None
                        and doc.epoch == epoch
                        and doc.state_vector() == sv
                        and ours.epoch == feed_epoch
                        and ours.state_vector() == feed_sv
                    ):
                        taken.append(
                            (node_id, epoch, sv, doc.diff(sv), feed_sv, ours.diff(feed_sv))
                        )
                if taken:
                    for reply in await sims.ask("compare", taken):
                        for node_id in reply[1]:
                            measure.converged_at[node_id] = checked
                            pending.discard(node_id)
                    measure.check_rounds.append(time.time() - checked)
            await asyncio.sleep(0.1)
            measure.sample()
        if pending:
            measure.notes.append(f"{len(pending)} healed nodes not converged")
        left()

        measure.phase = "drain"
        stop_submitting.set()
        await submitter
        measure.notes.append(submission_parts(measure))
        if measure.store_lock is not None:
            measure.notes.append(measure.store_lock.note())
        measure.notes.append(measure.gc.note(time.time() - measure.window[0]))
        gc.callbacks.remove(measure.gc)  # (the window's collections only)
        lag_probe.cancel()
        if hold_probe is not None and holds is not None:
            hold_probe.cancel()
            measure.notes.append(holds.note())
        publish_probe.cancel()
        cpu_probe.cancel()
        if cpus:
            measure.notes.append(cpu_by_phase_note(cpus))
        if publishes:
            measure.notes.append(publish_queue_note(publishes))
        if lags:
            measure.notes.append(
                f"event loop lag (a 50 ms sleep's lateness) p50 {_ms(pct(lags, 50)):.0f} / p99 "
                f"{_ms(pct(lags, 99)):.0f} / max {_ms(max(lags)):.0f} ms"
            )

        heap = heap_note()
        if heap is not None:
            measure.notes.append(heap)
        measure.notes.append(memory_note(engine))
        if scale.memory_breakdown:
            measure.notes.append(memory_breakdown(engine))
            measure.notes.append(_one_document(engine))

        def drained() -> bool:
            placed = [t for t, s in measure.submits.items() if s[2] is not None]
            return all(t in measure.seen for t in placed)

        await until(drained, scale.drain_s, 0.2)
        measure.window.append(time.time())
        measure.cpu_s = sum(psutil.Process().cpu_times()[:2]) - measure.cpu0
        measure.phase = "quiesce"
        frozen = await sims.ask("freeze")
        measure.published_total = sum(f[1]["updates_out"] + f[1]["step2_out"] for f in frozen)
        await quiesce(engine, measure.published_total, scale.drain_s)
        measure.status1 = engine.status()
        measure.phase = "collecting"
        finals = await sims.ask("stop")
        measure.sims = [f[1] for f in finals]
        measure.finished = True
        measure.phase = "done"
    except (OverBudget, TimeoutError):
        measure.notes.append(f"budget of {scale.budget_s:.0f}s ran out in phase {measure.phase}")
    except RuntimeError as exc:
        measure.notes.append(f"{exc} (phase {measure.phase})")
    finally:
        for task in background:
            task.cancel()
        if capture is not None:
            measure.notes.extend(finish_capture(capture, measure))
        sims.stop()
        engine.stop()
        try:
            async with asyncio.timeout(60):
                await engine_task
        except TimeoutError:
            engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await engine_task
        measure.log.detach()
    return measure.summary()


async def _report_loop(measure: Measure, report: Callable[[dict[str, Any]], None]) -> None:
    while True:
        await asyncio.sleep(2.0)
        report(measure.summary())


def size_worker(scale: Scale, port: int, workdir: str, conn: Connection) -> None:
    """Entry point of one size's central process: runs it, streams summaries to the parent
    (also from a thread, so a control step that holds the loop for long is still seen)."""
    pin(scale.central_cpus)
    quiet_logs()
    measure = Measure(scale)
    lock = threading.Lock()

    def report(summary: dict[str, Any]) -> None:
        with lock, contextlib.suppress(OSError):
            conn.send(("partial", summary))

    def reporter() -> None:
        while not measure.finished:
            time.sleep(5.0)
            with contextlib.suppress(RuntimeError):  # a dict resized under us: next time
                report(measure.summary())

    threading.Thread(target=reporter, daemon=True).start()
    summary = asyncio.run(run_size(scale, port, Path(workdir), measure, report))
    with lock:
        conn.send(("final", summary))


def memory_needed_gb(scale: Scale) -> float:
    """A rough estimate of what one size needs, from this harness's own runs of 1,000, 3,000
    and 10,000 nodes of 100 entries, 70 of them central's (docs/benchmarks.md): central about
    0.3 MB per node past its ~0.15 GB (2.9 GB bringing 10,000 up: restored from SQLite, its
    replicas and desired documents packed, frozen until their node speaks), the simulators
    about 0.15-0.27 MB per node (each node's packed document, its desired replica, two
    peers), the seeder (0.8 GB at 10,000) gone before either grows."""
    per_node = (0.3e6 + 0.2e6) * scale.tasks_per_node / 100
    return scale.nodes * per_node / 1e9 + 0.5


def measure_size(scale: Scale) -> dict[str, Any]:
    """One size in a process of its own, killed if it overruns its budget (plus a grace)."""
    with tempfile.TemporaryDirectory(prefix="edgesched-central-scale-") as tmp:
        load_start = os.getloadavg()[0]  # (the machine is shared: say how busy it was)
        broker = start_broker(Path(tmp), scale.broker_queue, scale.broker_log)
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=size_worker, args=(scale, broker.port, tmp, theirs))
        proc.start()
        theirs.close()
        last: dict[str, Any] = {"nodes": scale.nodes, "finished": False, "phase": "starting",
                                "notes": []}  # fmt: skip
        deadline = time.monotonic() + scale.budget_s + 90  # the worker stops itself first
        try:
            while time.monotonic() < deadline:
                if not ours.poll(1.0):
                    if not proc.is_alive():
                        last["notes"].append(f"central process exited {proc.exitcode}")
                        break
                    continue
                try:
                    kind, summary = ours.recv()
                except EOFError:
                    last["notes"].append(f"central process exited {proc.exitcode}")
                    break
                if summary.get("phase") != last.get("phase"):
                    print(f"  {scale.nodes:,} nodes: {summary.get('phase')} "
                          f"({summary.get('elapsed_s', 0):.0f}s)", flush=True)  # fmt: skip
                last = summary
                if kind == "final":
                    break
            else:
                last["notes"] = [*last.get("notes", []), "killed: over budget"]
        finally:
            if broker.proc.poll() is not None:  # (every connection lost at once: say why)
                note = f"the broker exited {broker.proc.returncode} during the run"
                last["notes"] = [*last.get("notes", []), note]
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            broker.stop()
        last["load_start"], last["load_end"] = load_start, os.getloadavg()[0]
        return last


# --- the table --------------------------------------------------------------------------------

ROWS: list[tuple[str, str, str]] = [
    # (label, key, format)
    ("seeding central's store and the nodes' (s)", "seed_s", "{:.1f}"),
    ("central restart from it, to connected (s)", "restart_s", "{:.1f}"),
    ("  entries its desired documents lacked", "restart_writes", "{:d}"),
    ("fleet up, every node fresh (s)", "fleet_up_s", "{:.1f}"),
    ("control steps in the window", "steps", "{:d}"),
    ("control step p50 (ms)", "step_p50_ms", "{:.1f}"),
    ("control step p99 (ms)", "step_p99_ms", "{:.1f}"),
    ("control step max, whole run (ms)", "step_max_ms", "{:.0f}"),
    ("  in phase", "step_max_phase", "{}"),
    ("share of the window in control steps", "step_busy", "{:.0%}"),
    ("submitted / placed (ticks skipped)", "submitted_placed", "{}"),
    ("seen by their node (wrong node)", "seen_wrong", "{}"),
    ("engine.submit p50 (ms)", "submit_call_p50_ms", "{:.1f}"),
    ("engine.submit p99 (ms)", "submit_call_p99_ms", "{:.1f}"),
    ("assignments published (broker's PUBACK)", "assignments_published", "{}"),
    ("submit -> assignment published p50 (ms)", "published_p50_ms", "{:.0f}"),
    ("submit -> assignment published p99 (ms)", "published_p99_ms", "{:.0f}"),
    ("submit -> seen by node p50 (ms)", "seen_p50_ms", "{:.0f}"),
    ("submit -> seen by node p99 (ms)", "seen_p99_ms", "{:.0f}"),
    ("  of nodes up until they saw it: how many", "seen_online", "{}"),
    ("  of nodes up until they saw it: p50 (ms)", "seen_online_p50_ms", "{:.0f}"),
    ("  of nodes up until they saw it: p99 (ms)", "seen_online_p99_ms", "{:.0f}"),
    ("healed nodes converged", "converged_of", "{}"),
    ("heal -> converged p50 (s)", "heal_p50_s", "{:.2f}"),
    ("heal -> converged p99 (s)", "heal_p99_s", "{:.2f}"),
    ("  longest round of the check (s): a stamp's lateness", "check_round_max_s", "{:.2f}"),
    ("node updates merged at central /s", "merged_per_s", "{:.0f}"),
    ("node doc messages published / not applied", "published_lost", "{}"),
    ("messages central rejected", "rejected", "{:d}"),
    ("broker: messages dropped", "broker_dropped", "{:d}"),
    ("central RSS at end (MB)", "rss_mb", "{:.0f}"),
    ("simulators' RSS at end (MB)", "sim_rss_mb", "{:.0f}"),
    ("central CPU in the window (s)", "cpu_s", "{:.1f}"),
    ("central CPU, share of one core", "cpu_share", "{:.0%}"),
    ("simulators' CPU in the window, cores", "sim_cpu_share", "{:.2f}"),
    ("machine load (1 min) at start / end", "load", "{}"),
    ("bytes to each node (MB/h, mean)", "in_mb_h", "{:.2f}"),
    ("  of it: its desired document", "in_desired_mb_h", "{:.3f}"),
    ("  of it: its own document (central's side)", "in_node_doc_mb_h", "{:.3f}"),
    ("  of it: the policy document (central's)", "in_policy_mb_h", "{:.4f}"),
    ("  of it: central's heartbeat", "in_heartbeat_mb_h", "{:.3f}"),
    ("bytes from each node (MB/h, mean)", "out_mb_h", "{:.2f}"),
    ("  of it: its own document", "out_node_doc_mb_h", "{:.3f}"),
    ("  of it: its desired document (step 1s)", "out_desired_mb_h", "{:.3f}"),
    ("  of it: the policy (step 1s, answers)", "out_policy_mb_h", "{:.4f}"),
    ("  of it: status and telemetry", "out_link_mb_h", "{:.3f}"),
    ("measured window (s)", "window_s", "{:.0f}"),
]
RATIO_KEYS = {
    "fleet_up_s", "seed_s", "restart_s", "sim_cpu_share", "step_p50_ms", "step_p99_ms",
    "step_max_ms", "submit_call_p50_ms", "submit_call_p99_ms", "published_p50_ms",
    "published_p99_ms", "seen_p50_ms", "seen_p99_ms", "seen_online_p50_ms",
    "seen_online_p99_ms", "heal_p50_s", "heal_p99_s",
    "merged_per_s", "rss_mb", "cpu_s", "cpu_share", "in_mb_h", "out_mb_h", "in_desired_mb_h",
    "in_node_doc_mb_h", "in_policy_mb_h", "in_heartbeat_mb_h", "sim_rss_mb", "out_node_doc_mb_h",
    "out_desired_mb_h", "out_policy_mb_h", "out_link_mb_h",
}  # fmt: skip


def derived(s: dict[str, Any]) -> dict[str, Any]:
    out = dict(s)
    if "submitted" in s:
        out["submitted_placed"] = f"{s['submitted']} / {s['placed']} ({s['skipped']})"
        out["seen_wrong"] = f"{s['seen']} ({s['seen_wrong_node']})"
        out["converged_of"] = f"{s['converged']} / {s['healed']}"
    if "published" in s and "not_applied" in s:
        out["published_lost"] = f"{s['published']} / {s['not_applied']}"
        if s.get("applied_twice"):
            out["published_lost"] += f" (+{s['applied_twice']} redelivered)"
    if s.get("cpu_s") is not None and s.get("window_s"):
        out["cpu_share"] = s["cpu_s"] / s["window_s"]
    if s.get("out_status_mb_h") is not None and s.get("out_telemetry_mb_h") is not None:
        out["out_link_mb_h"] = s["out_status_mb_h"] + s["out_telemetry_mb_h"]
    if s.get("load_start") is not None:
        end = s.get("load_end")
        out["load"] = f"{s['load_start']:.1f} / " + ("-" if end is None else f"{end:.1f}")
    return out


def cell(s: dict[str, Any], key: str, fmt: str) -> str:
    value = s.get(key)
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def table(results: list[dict[str, Any]]) -> str:
    rows = [derived(r) for r in results]
    heads = ["figure"] + [f"{r['nodes']:,} nodes" for r in rows]
    ran = [r for r in rows if r.get("phase") != "skipped"]  # the ratio: of sizes that ran
    ratio = len(ran) > 1
    if ratio:
        heads.append(f"{ran[-1]['nodes']:,} / {ran[0]['nodes']:,}")
    lines = [heads]
    for label, key, fmt in ROWS:
        line = [label] + [cell(r, key, fmt) for r in rows]
        if ratio:
            a, b = ran[0].get(key), ran[-1].get(key)
            ok = key in RATIO_KEYS and isinstance(a, int | float) and isinstance(b, int | float)
            line.append(f"x{b / a:.1f}" if ok and a else "")
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(heads))]
    text = []
    for n, line in enumerate(lines):
        first = line[0].ljust(widths[0])
        text.append(
            "  ".join([first] + [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)])
        )
        if n == 0:
            text.append("-" * len(text[0]))
    for r in rows:
        status = "finished" if r.get("finished") else "DID NOT FINISH WITHIN BUDGET"
        notes = "; ".join(r.get("notes", []))
        text.append(f"{r['nodes']:,} nodes: {status} (phase {r.get('phase')})"
                    + (f": {notes}" if notes else ""))  # fmt: skip
        logged = r.get("central_log") or {}
        if logged:
            text.append("  central logged: " + ", ".join(f"{v} {k.lower()}" for k, v in
                                                        sorted(logged.items())))  # fmt: skip
            text += [f"    {line}" for line in r.get("central_errors", [])]
            warned = sorted((r.get("central_warnings") or {}).items(), key=lambda kv: -kv[1])
            text += [f"    {count} x {kind}" for kind, count in warned[:8]]
        counts = r.get("sim_counts")
        if counts:
            sent = counts["policy_step1_sent"]
            text.append(
                f"  simulators: {sent} policy step 1s sent by nodes (to central only), "
                f"{counts['policy_frames_from_central']} policy frames from central "
                f"({counts['policy_replies_from_central']} on the askers' reply topics; "
                f"{counts['policy_step1_heard']} step 1s, {counts['policy_answers']} node "
                f"answers), {counts['frames_not_from_central']} frames of central's documents "
                f"from anyone else, {counts['frames_from_central']} node-document and "
                f"{counts['desired_frames_from_central']} desired-document frames from central "
                f"({counts['desired_step1_out']} desired step 1s sent, "
                f"{counts['desired_step2_in']} answered), "
                f"{counts['telemetry']} telemetry samples, CPU {r.get('sim_cpu_s', 0):.0f}s"
            )
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="100,1000", help="comma-separated fleet sizes")
    parser.add_argument("--budget-s", type=float, default=900.0, help="wall clock per size")
    parser.add_argument("--rate", type=float, default=2.0, help="submissions/s at central")
    parser.add_argument("--steady-s", type=float, default=30.0)
    parser.add_argument("--offline-s", type=float, default=10.0)
    parser.add_argument("--tasks", type=int, default=100, help="task entries per node")
    parser.add_argument("--procs", type=int, default=0, help="simulator processes (0: auto)")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON too")
    parser.add_argument(
        "--up-s", type=float, default=600.0, help="longest wait for the fleet to come up"
    )
    parser.add_argument(
        "--connect-rate",
        type=float,
        default=50.0,
        help="nodes connecting per second at bring-up, the whole fleet (0: all at once)",
    )
    parser.add_argument("--force", action="store_true", help="run a size that may not fit")
    parser.add_argument(
        "--memory-breakdown",
        action="store_true",
        help="at the end, break central's Python objects down by what holds them",
    )
    parser.add_argument(
        "--broker-queue",
        type=int,
        default=None,
        help="the bench broker's max_queued_messages (default: the deployed 100,000; 0: none)",
    )
    parser.add_argument(
        "--broker-log",
        default=None,
        help="append the bench broker's log (connections, why each ended) to this file",
    )
    parser.add_argument(
        "--replica-cold-after-s",
        type=float,
        default=None,
        help="central's [central] replica_cold_after_s (default: central's own default)",
    )
    parser.add_argument(
        "--capture",
        default=None,
        help="record central's broker connection with tcpdump into this directory from the "
        "steady window on, and split each submission's PUBACK wait (broker or central)",
    )
    parser.add_argument(
        "--pin-central",
        action="store_true",
        help="central's process on the first CPU alone, the simulated fleet, broker and "
        "seeder on the others (in production central has its machine to itself)",
    )
    parser.add_argument(
        "--nice-fleet",
        type=int,
        default=0,
        help="run the simulated fleet and the seeder at this niceness (1-19): central has "
        "the CPU whenever it can run, on every core, the fleet what it leaves",
    )
    parser.add_argument(
        "--hold-sample",
        action="store_true",
        help="sample central's loop thread while its loop is late, and note what held it",
    )
    args = parser.parse_args()
    central_cpus = other_cpus = None
    if args.pin_central:
        central_cpus, other_cpus = split_cpus()
        pin(other_cpus)  # (the broker and the checks started from here run there too)
        print(
            f"central pinned to CPU {','.join(map(str, central_cpus))}; the simulated "
            f"fleet, the broker and the seeder to CPU {','.join(map(str, other_cpus))}"
        )
    if args.nice_fleet:
        print(f"the simulated fleet and the seeder at niceness {args.nice_fleet}, central at 0")
    sizes = sorted(int(n.replace(",", "").replace("_", "")) for n in args.nodes.split(","))
    results = []
    for n in sizes:
        scale = Scale(
            nodes=n, tasks_per_node=args.tasks, rate=args.rate, steady_s=args.steady_s,
            offline_s=args.offline_s, budget_s=args.budget_s,
            procs=args.procs or (1 if n <= 2000 else 2), broker_queue=args.broker_queue,
            broker_log=None if args.broker_log is None else str(Path(args.broker_log).resolve()),
            up_s=args.up_s, connect_rate=args.connect_rate,
            memory_breakdown=args.memory_breakdown,
            replica_cold_after_s=args.replica_cold_after_s,
            capture=None if args.capture is None else str(Path(args.capture).resolve()),
            central_cpus=central_cpus, other_cpus=other_cpus, fleet_nice=args.nice_fleet,
            hold_sample=args.hold_sample,
        )  # fmt: skip
        need = memory_needed_gb(scale)
        have = psutil.virtual_memory().available / 1e9
        if need > 0.8 * have and not args.force:
            print(f"{n:,} nodes: skipped: needs about {need:.0f} GB, {have:.0f} GB available "
                  "(--force runs it anyway)", flush=True)  # fmt: skip
            results.append({"nodes": n, "finished": False, "phase": "skipped",
                            "notes": [f"needs about {need:.0f} GB of {have:.0f} GB"]})  # fmt: skip
            continue
        print(f"{n:,} nodes: running (budget {scale.budget_s:.0f}s, about {need:.1f} GB) ...",
              flush=True)  # fmt: skip
        results.append(measure_size(scale))
        r = results[-1]
        print(f"{n:,} nodes: {'finished' if r.get('finished') else 'did not finish within budget'}"
              f" after {r.get('elapsed_s', 0):.0f}s", flush=True)  # fmt: skip
    print()
    queue = "as deployed" if args.broker_queue is None else str(args.broker_queue)
    print(f"central scale: {args.rate:g} submissions/s, {args.tasks} task entries per node, "
          f"nodes connecting {args.connect_rate:g}/s (0: at once), "
          f"heal of 10% after {args.steady_s:g}s (offline {args.offline_s:g}s), "
          f"broker max_queued_messages {queue}")  # fmt: skip
    print(table(results))
    if args.json:
        print(json.dumps([{k: v for k, v in r.items()} for r in results], indent=1, default=str))


if __name__ == "__main__":
    main()
