"""Central's control step at fleet scale, in one process: incremental vs the full walk.

Builds central's real engine (:class:`~edgesched.central.engine.CentralEngine`, not started:
no broker, no API) over replicas made with the project's document classes: N nodes, each
with a registration and ``--tasks`` task entries (70% of them running central's assignment,
the rest finished), and the policy document holding those assignments. Every node is online
and fresh. Then, with the same rate of change at every size, it times:

* **idle step**: ``control_step()`` with nothing changed;
* **step with work**: before each step, ``--changes`` running tasks exit on their nodes
  (their node documents change), as many new tasks are submitted (written pending, as
  ``submit`` does when another replica leads), and one node in 20 steps goes offline past
  the failover grace (its services fail over);
* **the full walk** the step replaced (``fleet_view`` + ``failovers`` + ``reconcile`` +
  ``prunable`` over every replica, :mod:`edgesched.central.placement`): the old step's cost,
  for the smallest size only when the largest would take minutes (``--walk-up-to``).

Prints p50/p99 per size (of the step with work: its wall time and its CPU time, which is
what it costs when other work shares the machine's cores), the growth ratio of each figure
from the smallest size to the largest (the same rate of change at both), central's RSS, and
the cost to build the fleet.
Pinned to one core by the thread settings below.

    .venv/bin/python bench/bench_control_step.py [--nodes 100,1000,10000] [--tasks 100]
        [--steps 40] [--changes 50] [--walk-up-to 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import psutil

from edgesched.central.desired import DesiredDocs
from edgesched.central.engine import CentralEngine
from edgesched.central.liveness import NodeStatus
from edgesched.central.placement import assignment_entry, failovers, fleet_view, prunable, reconcile
from edgesched.central.replicas import NODE_DOC_PREFIX
from edgesched.config import parse_config
from edgesched.core.model import Arch, ServerClass
from edgesched.core.task import RestartPolicy, TaskSpec, TaskState
from edgesched.policies.models import ActiveModels
from edgesched.sync.doc import NodeDoc, PolicyDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import AssignmentRef, AssignmentState, Registration, TaskReport
from edgesched.sync.store import Store

GRACE_S = 30.0


class Clock:
    """The engine's clock, moved by the benchmark."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def build(
    nodes: int, tasks: int, state_dir: Path, *, cold: bool = False, packed: bool = True
) -> tuple[CentralEngine, Clock, list[str]]:
    """A central engine holding ``nodes`` replicas with ``tasks`` entries each, all fresh
    (``cold``: each replica frozen once the index has read it, as a restored central's;
    ``packed``: task entries written as JSON text, as nodes of this version write them)."""
    clock = Clock()
    config = parse_config(
        {
            "central": {
                "central_id": "central",
                "state_dir": str(state_dir),
                "failover_after_s": GRACE_S,
                "assignment_retention_s": 600.0,
                "cold_after_s": 60.0 if cold else 0.0,  # (0: no freezer watches anything)
            }
        }
    )
    engine = CentralEngine(config, clock=clock)
    engine.models = ActiveModels(
        state_dir / "models",
        {"forecast": engine.central.forecast_model, "placement": engine.central.placement_model},
    )
    engine.policy = PolicyDoc("policy", client_id_for("central"))
    engine.fleet = PolicyDoc("fleet", client_id_for("central"))
    engine.fleet.packed = True  # as the engine's own
    engine.fleet.track_changes("assignments", "stops", "power")
    policy = engine.fleet
    now = clock.now
    running: list[str] = []
    registration = Registration(
        arch=Arch.X86_64, server_class=ServerClass.GENERAL, cpu=256, mem_gib=1024,
        reads_packed=packed,  # (a node of this version)
    )  # fmt: skip
    for n in range(nodes):
        node_id = f"gw-{n:05d}"
        # written as the node writes its document (its own client id), then held as a
        # replica restored from SQLite is: central never writes a replica, so nothing of it
        # waits in the replica's outgoing queue (written through the replica, every entry
        # would, ~50 KB per node that a real central never holds)
        doc = NodeDoc(f"{NODE_DOC_PREFIX}{node_id}", client_id_for(node_id))
        doc.packed = packed  # as a node of this version writes, once central says it reads it
        with doc.doc.transaction():
            doc.set_registration(registration)
            for t in range(tasks):
                # (interned, as central's index holds the ids it reads: the list of running
                # tasks below is the benchmark's own, not memory of central's to count)
                task_id = sys.intern(f"{node_id}-t{t:03d}")
                assigned = t % 10 < 7
                state = TaskState.RUNNING if assigned else TaskState.EXITED
                ref = AssignmentRef("central", 1) if assigned else None
                doc.put_task(
                    task_id,
                    TaskReport(state=state, updated_at=now - 3600, cpu=1.0, assignment=ref),
                )
                if assigned:
                    spec = TaskSpec(
                        id=task_id, command=("sleep", "1d"), cpu=1.0, mem_gib=1.0,
                        restart=RestartPolicy.ALWAYS,
                    )  # fmt: skip
                    entry = assignment_entry(
                        spec, node_id, central="central", epoch=1, replacement=False,
                        score=1.0, at=now - 3600, reason="seeded",
                    )  # fmt: skip
                    policy.assign(task_id, entry)
                    running.append(task_id)
        held = NodeDoc(doc.name, engine.replicas.client_id)  # central's replica of it
        held.doc.apply_update(doc.doc.get_update())
        held.packed = packed  # (the steps below write the nodes' exits through it)
        replica = engine.replicas.add(node_id, held)
        engine.liveness.nodes[node_id] = NodeStatus("online", now - 7200)
        engine._node_status_changed(node_id, engine.liveness.nodes[node_id])
        replica.peer.synced_at[node_id] = now - 7000
        if cold:  # as a central restarted from SQLite: the index reads it, then it is frozen
            engine._dirty_nodes.discard(node_id)
            engine._restored(node_id)
    engine.events.clear()
    return engine, clock, running


def published(engine: CentralEngine) -> int:
    """What the session's sender would publish now, taken from every peer's queue (no
    broker here: without this, each desired document's writes since the start would stay
    queued, memory a running central does not hold); returns the bytes."""
    sent = 0
    for channel in engine.session.channels:
        if isinstance(channel, DocPeer):
            outgoing = channel.take_outgoing()
            sent += 0 if outgoing is None else len(outgoing[0])
    return sent


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def timed_cpu(fn: object, cpu: list[float]) -> float:
    """Wall time of ``fn()``; its CPU time (this thread's) appended to ``cpu``: on a machine
    shared with other work, the CPU time is what the step costs, the wall time what it took."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    fn()  # type: ignore[operator]
    cpu.append(time.thread_time() - start_cpu)
    return time.perf_counter() - start


def walk(engine: CentralEngine) -> float:
    """The old step's walks over the whole fleet (what the index replaced)."""
    policy = engine.fleet
    assert policy is not None

    def run() -> None:
        docs = engine.replicas.views()
        status = {n: engine.liveness.state(n) for n in docs}
        now = engine.clock()
        fleet_view(docs, status, now)
        assignments = policy.assignments()
        offline = {n: s.since for n, s in engine.liveness.nodes.items() if s.state == "offline"}
        failovers(assignments, offline, now, GRACE_S)
        reconcile(assignments, docs, policy.stops(), engine.reconcile_policy, engine.fresh_nodes())
        prunable(assignments, docs, now, 600.0)

    return timed(run)


async def measure(nodes: int, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        engine, clock, running = build(
            nodes, args.tasks, Path(tmp), cold=args.cold, packed=args.packed
        )
        built = time.perf_counter() - t0
        store = await Store.open(Path(tmp) / "central.db")
        freezer = engine.freezer if args.cold else None
        desired = DesiredDocs(
            "central", engine.session, store, clock=clock, freezer=freezer,
            reads_packed=engine.index.reads_packed,  # (as the engine's own)
        )  # fmt: skip
        first = timed(lambda: engine.sync_index(project=False))  # the index learns it all
        t0 = time.perf_counter()
        desired.match(engine.index.assignments, engine.index.stops, engine.index.orders)
        projected = time.perf_counter() - t0
        t0 = time.perf_counter()
        await desired.journals.flush()
        journaled = time.perf_counter() - t0
        engine.desired = desired
        engine.control_step()
        published(engine)  # (the initial projection: every desired document's state)
        sent = 0
        engine.settle_heap(full=True)  # as the engine does once it has started
        rss_start = psutil.Process().memory_info().rss / 2**20
        idle = []
        for _ in range(args.steps):
            clock.now += 0.1
            idle.append(timed(engine.control_step))
        busy: list[float] = []
        busy_cpu: list[float] = []
        flushes = []
        submitted = 0
        exits = iter(spread_exits(running, args.steps * args.changes))
        offline_at = {}
        for step in range(args.steps):
            clock.now += 1.0
            for _ in range(args.changes):  # running tasks exit on their nodes
                task_id = next(exits, None)
                if task_id is None:
                    break
                node_id = task_id.rsplit("-t", 1)[0]
                doc = engine.replicas.replicas[node_id].doc
                report = doc.task(task_id)
                assert report is not None
                doc.put_task(task_id, TaskReport(
                    state=TaskState.EXITED, updated_at=clock.now, cpu=1.0,
                    assignment=report.assignment,
                ))  # fmt: skip
                engine._replica_changed(node_id)
            for _ in range(args.changes):  # new work submitted
                spec = TaskSpec(id=f"new-{submitted:07d}", command=("true",), cpu=0.5)
                engine._pending(spec, None, 1, "accepted")
                submitted += 1
            if step % 20 == 0:  # a node goes offline, past the grace
                node_id = f"gw-{(step * 7) % nodes:05d}"
                status = NodeStatus("offline", clock.now - GRACE_S - 1)
                engine.liveness.nodes[node_id] = status
                engine._node_status_changed(node_id, status)
                offline_at[node_id] = clock.now
            if args.cold and step % args.sweep_every == 0:
                engine.sweep_cold()  # (outside the timed step: it runs on its own timer)
            busy.append(timed_cpu(engine.control_step, busy_cpu))
            t0 = time.perf_counter()
            await desired.journals.flush()  # the step's desired-state writes, one transaction
            flushes.append(time.perf_counter() - t0)
            sent += published(engine)
        policy = engine.fleet
        assert policy is not None
        rss = psutil.Process().memory_info().rss / 2**20  # (before the check below decodes
        # the whole fleet document into its view: a copy of every assignment central's own
        # loop never makes)
        left_pending = sum(
            1 for e in policy.assignments().values() if e.state is AssignmentState.PENDING
        )
        failed_over = sum(1 for e in engine.events if e.kind == "failover")
        live, frozen, thaws = engine.freezer.live, engine.freezer.frozen, engine.freezer.thaws
        full = walk(engine) if nodes <= args.walk_up_to else float("nan")  # (thaws them all)
        await store.close()
    return {
        "nodes": nodes,
        "entries": nodes * args.tasks,
        "build_s": built,
        "first_s": first,
        "project_s": projected,
        "journal_s": journaled,
        "flush_p50": statistics.median(flushes),
        "flush_p99": quantile(flushes, 0.99),
        "desired_docs": len(desired.docs),
        "idle_p50": statistics.median(idle),
        "idle_p99": quantile(idle, 0.99),
        "busy_p50": statistics.median(busy),
        "busy_p99": quantile(busy, 0.99),
        "busy_cpu_p50": statistics.median(busy_cpu),
        "busy_cpu_p99": quantile(busy_cpu, 0.99),
        "walk_s": full,
        "rss_mib": rss,
        "rss_start_mib": rss_start,
        "submitted": submitted,
        "left_pending": left_pending,
        "failed_over": failed_over,
        "live": live,
        "frozen": frozen,
        "thaws": thaws,
        "sent_kib_per_step": sent / 1024 / max(1, args.steps),
    }


def spread_exits(running: list[str], count: int) -> list[str]:
    """``count`` of the running tasks (ids ``<node>-t<n>``, node by node) to exit in turn,
    consecutive ones on distinct nodes: the tasks of each node in turn, one node after
    another, as independent exits fall in a fleet of either size. (Every k-th task of the
    node-by-node list put two consecutive exits on one node at 1,000 nodes and one a node at
    10,000: the smaller fleet did half the per-node work for the same changes, and the growth
    ratio read about twice what it was.)"""
    by_node: dict[str, list[str]] = {}
    for task_id in running:
        by_node.setdefault(task_id.rsplit("-t", 1)[0], []).append(task_id)
    nodes = sorted(by_node)
    stride = max(1, len(nodes) // max(1, count))  # over the whole fleet, not its first rows
    order = [n for start in range(stride) for n in nodes[start::stride]]
    out: list[str] = []
    depth = 0
    while len(out) < count:
        layer = [by_node[n][depth] for n in order if depth < len(by_node[n])]
        if not layer:
            break
        out.extend(layer)
        depth += 1
    return out[:count]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--walk-up-to", type=int, default=1000)
    parser.add_argument(
        "--cold", action=argparse.BooleanOptionalAction, default=True,
        help="freeze unused documents (central's default cold_after_s); --no-cold: all live",
    )  # fmt: skip
    parser.add_argument(
        "--packed", action=argparse.BooleanOptionalAction, default=True,
        help="entries as JSON text (nodes and central of this version); --no-packed: nested, "
        "as nodes of older versions write them",
    )  # fmt: skip
    parser.add_argument("--sweep-every", type=int, default=10, help="steps per freezer sweep")
    args = parser.parse_args()
    sizes = [int(x) for x in args.nodes.split(",")]
    rows = []
    for n in sizes:
        row = asyncio.run(measure(n, args))
        rows.append(row)
        print(
            f"{n:>6} nodes, {row['entries']:>9,} entries: build {row['build_s']:.1f} s, "
            f"index learns it {row['first_s']:.1f} s, {row['desired_docs']} desired documents "
            f"projected {row['project_s']:.1f} s + journaled {row['journal_s']:.1f} s, "
            f"idle step p50/p99 "
            f"{row['idle_p50'] * 1000:.2f}/{row['idle_p99'] * 1000:.2f} ms, step with work "
            f"p50/p99 {row['busy_p50'] * 1000:.1f}/{row['busy_p99'] * 1000:.1f} ms (CPU "
            f"{row['busy_cpu_p50'] * 1000:.1f}/{row['busy_cpu_p99'] * 1000:.1f} ms; its desired-"
            f"state journal batch {row['flush_p50'] * 1000:.1f}/{row['flush_p99'] * 1000:.1f} ms)"
            f", full walk "
            f"{row['walk_s']:.2f} s, RSS {row['rss_start_mib']:.0f} MiB before the steps, "
            f"{row['rss_mib']:.0f} MiB after (documents: {row['live']} "
            f"live, {row['frozen']} frozen, {row['thaws']} thaws); {row['submitted']} submitted, "
            f"{row['left_pending']} left pending, {row['failed_over']} failed over, "
            f"{row['sent_kib_per_step']:.0f} KiB of updates out per step",
            flush=True,
        )
    base, top = rows[0], rows[-1]
    print(
        f"\ngrowth {base['nodes']} -> {top['nodes']} nodes ({top['nodes'] / base['nodes']:.0f}x "
        f"the fleet, the same changes per step): idle step p99 "
        f"{top['idle_p99'] / base['idle_p99']:.2f}x, step with work p50 "
        f"{top['busy_p50'] / base['busy_p50']:.2f}x, p99 {top['busy_p99'] / base['busy_p99']:.2f}x"
        f"; its CPU time p50 {top['busy_cpu_p50'] / base['busy_cpu_p50']:.2f}x, p99 "
        f"{top['busy_cpu_p99'] / base['busy_cpu_p99']:.2f}x (load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end)"
    )
    walked = [r for r in rows if r["walk_s"] == r["walk_s"]]
    if walked:
        r = walked[-1]
        print(
            f"at {r['nodes']} nodes the full walk the step replaced takes {r['walk_s']:.2f} s: "
            f"{r['walk_s'] / r['busy_p50']:.0f}x the incremental step with work (p50)"
        )


if __name__ == "__main__":
    main()
