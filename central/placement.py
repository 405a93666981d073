"""Central's decisions over the merged fleet view: place, fail over, reconcile. Pure.

The fleet view is built from the node documents' replicas (each node's registration and the
tasks it reports) and the nodes' liveness; placement runs the same core the nodes run. Three
decisions:

* :func:`place`: a task submitted at central goes to the node the core picks among the nodes
  that are online now (or to the node the caller pins it to, if that node can take it).
* :func:`failovers`: a task whose node has been offline longer than the grace, and whose
  restart policy is ``always`` (a service), is placed again elsewhere: a new placement epoch,
  marked as a replacement. A batch task is never failed over: running it twice is worse
  than running it late.
* :func:`reconcile`: after a heal, a task reported active by two nodes (the cut-off node
  kept it, the replacement started it) has two :class:`~edgesched.sync.reconcile.Claim`\\ s;
  :func:`edgesched.sync.reconcile.winner` picks one, the same on every central replica, and
  the others get stop orders. Nodes stop a copy only on an explicit order, never because an
  assignment moved: a cut-off node that hears of a failover before central heard of it would
  otherwise stop the copy that should win.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgesched.core.model import (
    Arch,
    DecisionKind,
    Node,
    Placement,
    PowerModel,
    Resources,
    ServerClass,
    Task,
)
from edgesched.core.policy import PolicyConfig
from edgesched.core.scheduler import ClusterView, schedule
from edgesched.core.task import RestartPolicy, SpecError, TaskSpec
from edgesched.sync.reconcile import Claim, ReconcilePolicy, losers, winner

#: Task states in a node document that hold (or are about to hold) resources.
ACTIVE_STATES = frozenset({"accepted", "placed", "running", "preempted"})
#: Task states in a node document that mean it is over.
FINISHED_STATES = frozenset({"exited", "failed", "cancelled"})


def node_from_registration(node_id: str, registration: object) -> Node:
    """The core's :class:`Node` from a node document's ``registration``; ValueError if bad."""
    if not isinstance(registration, Mapping):
        raise ValueError(f"node {node_id}: no registration")
    try:
        power = registration.get("power") or {}
        if not isinstance(power, Mapping):
            raise ValueError("power is not an object")
        cpu = float(registration["cpu"])
        return Node(
            id=node_id,
            arch=Arch(registration["arch"]),
            server_class=ServerClass(registration["server_class"]),
            capacity=Resources(
                cpu=cpu,
                mem_gib=float(registration.get("mem_gib", 0.0)),
                accel=int(registration.get("accel", 0)),
            ),
            power=PowerModel(
                idle_w=float(power.get("idle_w", 10.0 * cpu)),
                peak_w=float(power.get("peak_w", 25.0 * cpu)),
                parked_w=float(power.get("parked_w", 10.0)),
                wake_latency_s=float(power.get("wake_latency_s", 60.0)),
            ),
            perf=float(registration.get("perf", 1.0)),
            site=str(registration.get("site", "default")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"node {node_id}: bad registration: {exc}") from None


def _entry_task(task_id: str, entry: Mapping[str, Any], now: float) -> Task | None:
    """What a node reports of a task, as the core sees its footprint (None if unusable)."""
    try:
        demand = Resources(
            cpu=float(entry.get("cpu", 0.0)),
            mem_gib=float(entry.get("mem_gib", 0.0)),
            accel=int(entry.get("accel", 0)),
        )
        return Task(
            id=task_id,
            workload=str(entry.get("workload", "default")),
            priority=int(entry.get("priority", 0)),
            demand=demand,
            submitted_at=float(entry.get("updated_at", now)),
        )
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class FleetView:
    """What central knows at ``now``: usable nodes and what they run, by node."""

    nodes: tuple[Node, ...]
    placements: tuple[Placement, ...]
    now: float
    unusable: Mapping[str, str]  # node id → why it is not in ``nodes``


def fleet_view(
    node_docs: Mapping[str, Mapping[str, Any]],
    status: Mapping[str, str],
    now: float,
) -> FleetView:
    """``node_docs``: node id → its document's content (``node`` and ``tasks``); ``status``:
    node id → "online" / "offline" / "unknown". Only online nodes are placement targets."""
    nodes: list[Node] = []
    placements: list[Placement] = []
    unusable: dict[str, str] = {}
    for node_id in sorted(node_docs):
        content = node_docs[node_id]
        if status.get(node_id) != "online":
            unusable[node_id] = f"node is {status.get(node_id, 'unknown')}"
            continue
        try:
            node = node_from_registration(node_id, (content.get("node") or {}).get("registration"))
        except ValueError as exc:
            unusable[node_id] = str(exc)
            continue
        nodes.append(node)
        for task_id, entry in sorted((content.get("tasks") or {}).items()):
            if isinstance(entry, Mapping) and entry.get("state") in ACTIVE_STATES:
                task = _entry_task(task_id, entry, now)
                if task is not None:
                    placements.append(Placement(task, node_id, task.submitted_at))
    return FleetView(tuple(nodes), tuple(placements), now, unusable)


@dataclass(frozen=True)
class Choice:
    """Where central places a task, or why it cannot."""

    node_id: str | None
    reason: str
    score: float = 0.0


def place(
    spec: TaskSpec,
    view: FleetView,
    policy: PolicyConfig,
    *,
    pin: str | None = None,
    exclude: Iterable[str] = (),
) -> Choice:
    """Run the core over the fleet for one task; ``pin`` restricts it to one node."""
    banned = set(exclude)
    nodes = tuple(n for n in view.nodes if n.id not in banned and (pin is None or n.id == pin))
    if pin is not None and not nodes:
        why = view.unusable.get(pin, "not a node central knows")
        return Choice(None, f"node {pin} cannot take it: {why}")
    if not nodes:
        return Choice(None, "no node online to place it on")
    running = tuple(p for p in view.placements if p.node_id in {n.id for n in nodes})
    cluster = ClusterView(nodes, running, view.now)
    result = schedule(cluster, [spec.to_task(view.now)], policy)
    for decision in result.decisions:
        if decision.kind is DecisionKind.PLACE and decision.task_id == spec.id:
            score = sum(decision.scores.values())
            return Choice(decision.node_id, decision.reason, score if math.isfinite(score) else 0)
    return Choice(None, result.waiting.get(spec.id, "no node fits"))


def assignment_entry(
    spec: TaskSpec,
    node_id: str,
    *,
    central: str,
    epoch: int,
    replacement: bool,
    score: float,
    at: float,
    reason: str,
) -> dict[str, Any]:
    """An ``assignments`` entry of the policy document."""
    return {
        "spec": spec.to_json(),
        "node": node_id,
        "epoch": epoch,
        "replacement": replacement,
        "score": round(score, 6),
        "central": central,
        "at": at,
        "reason": reason,
        "state": "active",
    }


def failovers(
    assignments: Mapping[str, Mapping[str, Any]],
    offline_since: Mapping[str, float],
    now: float,
    grace_s: float,
) -> list[str]:
    """Active service assignments whose node has been offline for more than ``grace_s``."""
    out = []
    for task_id, entry in sorted(assignments.items()):
        if entry.get("state") != "active":
            continue
        since = offline_since.get(str(entry.get("node")))
        if since is None or now - since <= grace_s:
            continue
        try:
            spec = TaskSpec.from_json(entry.get("spec"))
        except SpecError:
            continue
        if spec.restart is RestartPolicy.ALWAYS:
            out.append(task_id)
    return out


def prunable(
    assignments: Mapping[str, Mapping[str, Any]],
    node_docs: Mapping[str, Mapping[str, Any]],
    now: float,
    retention_s: float,
) -> list[str]:
    """Assignments central can forget (the policy document would otherwise only grow): no
    node reports a copy still active, and either the assigned node reports the task finished
    more than ``retention_s`` ago, or it was cancelled more than ``retention_s`` ago. A task
    whose node never said it finished stays: that node may be cut off and still running it."""
    out = []
    horizon = now - retention_s
    for task_id, entry in sorted(assignments.items()):
        state = entry.get("state")
        if state not in ("active", "cancelled"):
            continue
        copies = {
            node_id: copy
            for node_id, doc in node_docs.items()
            if isinstance(copy := (doc.get("tasks") or {}).get(task_id), Mapping)
        }
        if any(c.get("state") in ACTIVE_STATES for c in copies.values()):
            continue
        at = entry.get("at")
        if not isinstance(at, int | float) or at > horizon:
            continue
        mine = copies.get(str(entry.get("node")))
        if state == "active":
            done_at = mine.get("updated_at") if mine is not None else None
            finished = mine is not None and mine.get("state") in FINISHED_STATES
            if not (finished and isinstance(done_at, int | float) and done_at <= horizon):
                continue
        out.append(task_id)
    return out


def claims_of(task_id: str, node_docs: Mapping[str, Mapping[str, Any]]) -> list[Claim]:
    """Every node's active copy of a central task, as a :class:`Claim`: what the nodes report
    in their documents, not what central intended."""
    claims = []
    for node_id in sorted(node_docs):
        entry = (node_docs[node_id].get("tasks") or {}).get(task_id)
        if not isinstance(entry, Mapping) or entry.get("state") not in ACTIVE_STATES:
            continue
        assignment = entry.get("assignment")
        if not isinstance(assignment, Mapping):
            continue  # a local task that happens to share the id: not central's to settle
        try:
            claims.append(
                Claim(
                    task_id=task_id,
                    node_id=node_id,
                    epoch=int(assignment.get("epoch", 0)),
                    decided_by=str(assignment.get("central", "central")),
                    started_at=float(entry.get("started_at", entry.get("updated_at", 0.0))),
                    score=float(assignment.get("score", 0.0)),
                    replacement=bool(assignment.get("replacement", False)),
                )
            )
        except (TypeError, ValueError):
            continue
    return claims


def task_policy(entry: Mapping[str, Any], default: ReconcilePolicy) -> ReconcilePolicy:
    """The task's own reconcile choice (its spec's ``reconcile``), else ``default``."""
    spec = entry.get("spec")
    choice = spec.get("reconcile") if isinstance(spec, Mapping) else None
    try:
        return ReconcilePolicy(choice) if choice else default
    except ValueError:
        return default


@dataclass(frozen=True)
class Settlement:
    """The reconcile outcome for one task placed twice."""

    task_id: str
    winner: Claim
    losers: tuple[Claim, ...]
    policy: ReconcilePolicy


def reconcile(
    assignments: Mapping[str, Mapping[str, Any]],
    node_docs: Mapping[str, Mapping[str, Any]],
    stops: Mapping[str, Mapping[str, Any]],
    policy: ReconcilePolicy,
    fresh: Collection[str],
) -> list[Settlement]:
    """Tasks of central's with active copies on more than one node and no stop order out for
    every loser yet; the winner by the pure rule, the same on every central replica.

    Only the documents of ``fresh`` nodes count: online, and answered a resync since they
    came back. A cut-off node's replica is what it was when the link died; settling on it
    would keep a copy that may have stopped since, and stop the one that runs.
    """
    live = {n: d for n, d in node_docs.items() if n in fresh}
    out = []
    for task_id in sorted(assignments):
        claims = claims_of(task_id, live)
        if len({c.node_id for c in claims}) < 2:
            continue
        rule = task_policy(assignments[task_id], policy)
        best = winner(claims, rule)
        lost = tuple(c for c in losers(claims, rule) if f"{task_id}@{c.node_id}" not in stops)
        if lost:
            out.append(Settlement(task_id, best, lost, rule))
    return out
