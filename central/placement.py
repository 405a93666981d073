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
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from edgesched.core.model import DecisionKind, Node, Placement, Resources, Task
from edgesched.core.nodetable import NodeTable
from edgesched.core.policy import PolicyConfig
from edgesched.core.scheduler import ClusterView, schedule
from edgesched.core.service import parse_replica_id
from edgesched.core.spread import SpreadGroup
from edgesched.core.task import RestartPolicy, TaskSpec, TaskState
from edgesched.sync.reconcile import Claim, ReconcilePolicy, losers, winner
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentState,
    NodeView,
    Registration,
    SchemaError,
    StopOrder,
    TaskReport,
)

#: node id -> what its document says (typed, see :class:`edgesched.sync.schema.NodeView`).
NodeViews = Mapping[str, NodeView]


def node_of(node_id: str, view: NodeView) -> Node:
    """The core's :class:`Node` of a node's registration; ValueError if it has none."""
    return registered_node(node_id, view.registration)


def registered_node(node_id: str, registration: Registration | None) -> Node:
    """The core's :class:`Node` of a registration; ValueError if None or unusable."""
    if registration is None:
        raise ValueError(f"node {node_id}: no registration")
    try:
        return registration.to_node(node_id)
    except SchemaError as exc:
        raise ValueError(f"node {node_id}: bad registration: {exc}") from None


def report_task(task_id: str, report: TaskReport) -> Task:
    """What a node reports of a task, as the core sees its footprint (a replica of a service
    central placed is migratable: the core's consolidation may move it)."""
    return Task(
        id=task_id,
        workload=report.workload,
        priority=report.priority,
        demand=Resources.shared(report.cpu, report.mem_gib, report.accel),
        submitted_at=report.updated_at,
        migratable=report.assignment is not None and parse_replica_id(task_id) is not None,
    )


@dataclass(frozen=True)
class FleetView:
    """What central knows at ``now``: usable nodes and what they run, by node."""

    nodes: tuple[Node, ...]
    placements: tuple[Placement, ...]
    now: float
    unusable: Mapping[str, str]  # node id → why it is not in ``nodes``


def fleet_view(node_docs: NodeViews, status: Mapping[str, str], now: float) -> FleetView:
    """``node_docs``: node id → its document, typed; ``status``: node id → "online" /
    "offline" / "unknown". Only online nodes are placement targets."""
    nodes: list[Node] = []
    placements: list[Placement] = []
    unusable: dict[str, str] = {}
    for node_id in sorted(node_docs):
        content = node_docs[node_id]
        if status.get(node_id) != "online":
            unusable[node_id] = f"node is {status.get(node_id, 'unknown')}"
            continue
        try:
            node = node_of(node_id, content)
        except ValueError as exc:
            unusable[node_id] = str(exc)
            continue
        nodes.append(node)
        for task_id, report in sorted(content.tasks.items()):
            if report.active:
                task = report_task(task_id, report)
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


def place_all(
    specs: Sequence[TaskSpec],
    table: NodeTable,
    now: float,
    policy: PolicyConfig,
    groups: Mapping[str, SpreadGroup] | None = None,
) -> dict[str, Choice]:
    """Run the core once over the fleet for a batch of tasks (in the core's queue order,
    each seeing the ones placed before it): task id -> where it goes or why it waits.
    ``table``: the fleet index's table of the usable nodes, forked by the core; ``groups``:
    the spread of the services some of the tasks are replicas of (by task id)."""
    if not specs:
        return {}
    if not table.nodes:
        return {s.id: Choice(None, "no node online to place it on") for s in specs}
    cluster = ClusterView(table.nodes, (), now, table=table, plan_power=False)
    result = schedule(cluster, [s.to_task(now) for s in specs], policy, groups)
    out: dict[str, Choice] = {}
    for decision in result.decisions:
        if decision.kind is DecisionKind.PLACE and decision.task_id is not None:
            score = sum(decision.scores.values())
            out[decision.task_id] = Choice(
                decision.node_id, decision.reason, score if math.isfinite(score) else 0
            )
    for spec in specs:
        if spec.id not in out:
            out[spec.id] = Choice(None, result.waiting.get(spec.id, "no node fits"))
    return out


def place_pinned(
    spec: TaskSpec,
    table: NodeTable,
    now: float,
    policy: PolicyConfig,
    pin: str,
    unusable: Mapping[str, str],
    groups: Mapping[str, SpreadGroup] | None = None,
) -> Choice:
    """Run the core for one task on node ``pin`` only (a pinned submission, a migration)."""
    row = table.index.get(pin)
    if row is None:
        why = unusable.get(pin, "not a node central knows")
        return Choice(None, f"node {pin} cannot take it: {why}")
    return place_all([spec], table.subset([row]), now, policy, groups)[spec.id]


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
    state: AssignmentState = AssignmentState.ACTIVE,
    pin: str | None = None,
    lease: int = 0,
) -> AssignmentEntry:
    """An ``assignments`` entry of the fleet document (active unless ``state`` says);
    ``lease``: the fencing token it is decided under (0 without shard leases)."""
    return AssignmentEntry(
        spec=spec,
        node=node_id,
        epoch=epoch,
        replacement=replacement,
        score=round(score, 6),
        central=central,
        at=at,
        reason=reason,
        state=state,
        pin=pin,
        lease=lease,
    )


def failovers(
    assignments: Mapping[str, AssignmentEntry],
    offline_since: Mapping[str, float],
    now: float,
    grace_s: float,
) -> list[str]:
    """Active service assignments whose node has been offline for more than ``grace_s``."""
    out = []
    for task_id, entry in sorted(assignments.items()):
        if not entry.active:
            continue
        since = offline_since.get(entry.node)
        if since is None or now - since <= grace_s:
            continue
        if entry.task_spec.restart is RestartPolicy.ALWAYS:
            out.append(task_id)
    return out


def prunable(
    assignments: Mapping[str, AssignmentEntry],
    node_docs: NodeViews,
    now: float,
    retention_s: float,
) -> list[str]:
    """Assignments central can forget (the policy document would otherwise only grow): see
    :func:`can_forget`. Walks every node for every assignment: the fleet index's oracle."""
    out = []
    for task_id, entry in sorted(assignments.items()):
        copies = {
            node_id: copy
            for node_id, doc in node_docs.items()
            if (copy := doc.tasks.get(task_id)) is not None
        }
        if can_forget(entry, copies, now, retention_s):
            out.append(task_id)
    return out


def can_forget(
    entry: AssignmentEntry, copies: Mapping[str, TaskReport], now: float, retention_s: float
) -> bool:
    """Whether central can forget an assignment, given every node's copy of its task: no
    node reports a copy still active, and either the assigned node reports the task finished
    more than ``retention_s`` ago, or it was cancelled more than ``retention_s`` ago. A task
    whose node never said it finished stays: that node may be cut off and still running it.
    A pending task has no copy anywhere yet: forgetting it would lose it."""
    horizon = now - retention_s
    if entry.state is AssignmentState.PENDING or entry.at > horizon:
        return False
    if any(c.active for c in copies.values()):
        return False
    mine = copies.get(entry.node)
    # (mine, if present, is finished: no copy is active)
    return not (entry.active and not (mine is not None and mine.updated_at <= horizon))


def forget_at(
    entry: AssignmentEntry, copies: Mapping[str, TaskReport], retention_s: float
) -> float | None:
    """The earliest time :func:`can_forget` may hold if nothing changes (None: not until
    something changes)."""
    if entry.state is AssignmentState.PENDING or any(c.active for c in copies.values()):
        return None
    due = entry.at + retention_s
    if entry.active:
        mine = copies.get(entry.node)
        if mine is None:
            return None
        due = max(due, mine.updated_at + retention_s)
    return due


#: A copy in these states runs, or can at once (placed: its process is about to start); a
#: queued (accepted) or preempted one does not, and never wins a reconcile over one that does.
_RUNS = frozenset({TaskState.RUNNING, TaskState.PLACED})


def claims_of(task_id: str, node_docs: NodeViews) -> list[Claim]:
    """Every node's active copy of a central task, as a :class:`Claim`: what the nodes report
    in their documents, not what central intended."""
    copies = {
        node_id: report
        for node_id in node_docs
        if (report := node_docs[node_id].tasks.get(task_id)) is not None
    }
    return claims_from(task_id, copies)


def claims_from(task_id: str, copies: Mapping[str, TaskReport]) -> list[Claim]:
    """The claims of ``copies`` (node id -> its report of the task), by node id."""
    claims = []
    for node_id in sorted(copies):
        report = copies[node_id]
        if not report.active or report.assignment is None:
            continue  # (no assignment: a local task sharing the id, not central's to settle)
        a = report.assignment
        claims.append(
            Claim(
                task_id=task_id,
                node_id=node_id,
                epoch=a.epoch,
                decided_by=a.central,
                started_at=report.started_at if report.started_at is not None
                else report.updated_at,
                score=a.score,
                replacement=a.replacement,
                running=report.state in _RUNS,
            )
        )  # fmt: skip
    return claims


def task_policy(entry: AssignmentEntry, default: ReconcilePolicy) -> ReconcilePolicy:
    """The task's own reconcile choice (its spec's ``reconcile``), else ``default``."""
    choice = entry.task_spec.reconcile
    try:
        return ReconcilePolicy(choice) if choice else default
    except ValueError:
        return default


@dataclass(frozen=True)
class Settlement:
    """The reconcile outcome for one task placed twice."""

    task_id: str
    #: The copy kept; None for a task cancelled at central, whose copies all stop.
    winner: Claim | None
    losers: tuple[Claim, ...]
    policy: ReconcilePolicy


def reconcile(
    assignments: Mapping[str, AssignmentEntry],
    node_docs: NodeViews,
    stops: Mapping[str, StopOrder],
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
        settled = settle(task_id, assignments[task_id], claims_of(task_id, live), stops, policy)
        if settled is not None:
            out.append(settled)
    return out


def settle(
    task_id: str,
    entry: AssignmentEntry,
    claims: list[Claim],
    stops: Mapping[str, StopOrder],
    policy: ReconcilePolicy,
) -> Settlement | None:
    """One task's settlement from its fresh claims: None unless it runs on two nodes or more
    and some loser has no stop order out yet; for a task cancelled at central, every copy
    still active off its assignment's node, with no winner; for a task whose one running copy
    is off its assignment's node at a later epoch (a site's failover), that copy, with no
    loser (central's assignment follows it).

    A copy already ordered stopped (a stop order for its node at its epoch) competes no more.
    (A migration waiting for its target to run is not settled at all: the engine skips it.)"""
    claims = [
        c
        for c in claims
        if (stop := stops.get(f"{task_id}@{c.node_id}")) is None or stop.epoch != c.epoch
    ]
    rule = task_policy(entry, policy)
    if entry.state is AssignmentState.CANCELLED:
        # Cancelled at central: its node cancels its copy when it hears the assignment, but
        # a node holding an older epoch (cut off when the task failed over, say) follows no
        # assignment of its own any more; it stops only when ordered to. Every copy off the
        # assignment's node is a loser, kept by nobody.
        gone = tuple(c for c in claims if c.node_id != entry.node)
        return Settlement(task_id, None, gone, rule) if gone else None
    if len({c.node_id for c in claims}) < 2:
        # One copy, off the assignment's node, at a later placement epoch: a cut-off site's
        # coordinator failed the task over (edgesched.core.site) and its node runs it.
        # Central adopts that placement (a settlement with no loser), so it does not fail
        # the task over once more from the node it still has it on.
        only = claims[0] if claims else None
        if (
            only is not None
            and entry.state is AssignmentState.ACTIVE
            and only.node_id != entry.node
            and only.epoch > entry.epoch
            and only.running
        ):
            return Settlement(task_id, only, (), rule)
        return None
    best = winner(claims, rule)
    lost = tuple(c for c in losers(claims, rule) if f"{task_id}@{c.node_id}" not in stops)
    return Settlement(task_id, best, lost, rule) if lost else None
