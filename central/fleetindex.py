"""Central's fleet index: what the control loop reads, kept up to date from each change.

A control step used to rebuild the fleet from every replica and walk every node's tasks for
every assignment (reconcile, prune: O(assignments × nodes)); at 1,000 nodes one step took a
minute. The index holds the same facts keyed the way the step asks for them, and is told
what changed: the keys of each node document's ``tasks`` map and of the policy document's
``assignments``, ``stops`` and ``power`` maps (pycrdt's map events, drained through
:meth:`edgesched.sync.doc.SyncedDoc.drain_changes`), a node's registration and power report,
its liveness and its freshness. Each fact change costs O(that node's tasks) at most, and a
step asks only for what is due:

* :attr:`pending`: tasks waiting at central;
* :meth:`failover_candidates`: service assignments on nodes offline past the grace (a heap
  of offline nodes by when their grace ends);
* :meth:`settlements`: tasks whose claims, assignment, stops or claimants' freshness changed
  since the last call, settled by the pure rule (:func:`edgesched.central.placement.settle`);
* :meth:`stops_done`: stop orders whose loser now reports its copy inactive;
* :meth:`forgettable`: assignments central may forget (a heap by when they may);
* :meth:`table`: the core's :class:`~edgesched.core.nodetable.NodeTable` of the usable
  nodes and what counts on them (reported active copies, and active assignments their node
  has not reported yet), built once and patched from then on: a row's footprint in place;
  the nodes that became usable, unusable or changed (liveness, registration, power) since
  the last call by a new table with their rows inserted, removed or replaced (array copies,
  no Python work per node), or rebuilt when many changed at once; placement forks it
  (O(nodes), not O(placements)).

Pure bookkeeping: no I/O, no clock (callers pass ``now``). The slow path it replaces stays
in :mod:`edgesched.central.placement` (``fleet_view``, ``failovers``, ``reconcile``,
``prunable``) as the oracle the tests compare it with on random event sequences.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
from sortedcontainers import SortedList

from edgesched.central.placement import (
    Settlement,
    can_forget,
    claims_from,
    forget_at,
    registered_node,
    report_task,
    settle,
)
from edgesched.central.power import PARKED, powered, reported
from edgesched.core.model import Node, Placement, Task
from edgesched.core.nodetable import NodeTable
from edgesched.core.service import parse_replica_id
from edgesched.core.task import RestartPolicy
from edgesched.sync.reconcile import ReconcilePolicy
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentState,
    NodeView,
    PowerOrder,
    PowerReport,
    Registration,
    StopOrder,
    TaskReport,
)


@dataclass
class _Member:
    """One node document's facts as the index keeps them."""

    registration: Registration | None = None
    power: PowerReport = field(default_factory=PowerReport)
    reports: dict[str, TaskReport] = field(default_factory=dict)
    #: ``reports`` counted by state, kept as they change (the dashboard shows it per node
    #: each second: counting 100,000 reports there was most of its snapshot)
    states: Counter[str] = field(default_factory=Counter)
    #: The core's node (registration, power state applied), or None with ``why``.
    node: Node | None = None
    why: str = "no registration"
    #: What counts on this node for placement (the footprint): the task ids, in order, and
    #: each one's Placement here, aligned (two lists, not a dict: a node of 100 tasks).
    #: Both replaced on a change, never mutated: the table's row shares ``placements``.
    keys: list[str] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    #: The footprint's sums as the table last took them (:meth:`FleetIndex.table`).
    used: np.ndarray = field(default_factory=lambda: np.zeros(4))
    usage: dict[str, float] = field(default_factory=dict)
    #: The footprint's sums kept as it changes (cpu, memory, accelerators, iops; CPU per
    #: workload), and how many changes since they were last summed exactly.
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    running_usage: dict[str, float] = field(default_factory=dict)
    inexact: int = 0


#: More node changes at once than this and :meth:`FleetIndex.table` rebuilds instead of
#: patching: a patch costs about 1/15 of a rebuild at any fleet size (both are O(nodes), a
#: patch in array copies), so a site going dark costs one rebuild, not one patch per node.
PATCH_UP_TO = 8


#: Changes of a node's footprint between two exact sums of it (:meth:`FleetIndex.table`).
EXACT_EVERY = 64

#: Superseded forgetting times :meth:`FleetIndex.forgettable`'s buckets may hold beyond as
#: many as the live ones before they are rebuilt from them.
PRUNE_SLACK = 1024


#: The bucket of a forgetting time that never comes (+inf), and of one that is not a
#: time (NaN, -inf: looked at by the next call).
_NEVER = 1 << 62
_AT_ONCE = -(1 << 62)


def _second(due: float) -> int:
    """The whole second a forgetting time is bucketed under."""
    if math.isfinite(due):
        return math.floor(due)
    return _NEVER if due > 0 else _AT_ONCE


def _count(member: _Member, task: Task, sign: float) -> None:
    """Add (``sign`` 1) or take away (-1) what ``task`` counts for in the member's sums."""
    d = task.demand
    sums = member.sums
    sums[0] += sign * d.cpu
    sums[1] += sign * d.mem_gib
    sums[2] += sign * d.accel
    sums[3] += sign * d.iops_k
    usage = member.running_usage
    usage[task.workload] = usage.get(task.workload, 0.0) + sign * d.cpu


def _sum_exactly(member: _Member) -> None:
    """The member's sums from scratch, in task id order (as the table's build sums them)."""
    cpu = mem = accel = iops = 0.0
    usage: dict[str, float] = {}
    for placement in member.placements:
        task = placement.task
        d = task.demand
        cpu += d.cpu
        mem += d.mem_gib
        accel += d.accel
        iops += d.iops_k
        usage[task.workload] = usage.get(task.workload, 0.0) + d.cpu
    member.sums = [cpu, mem, accel, iops]
    member.running_usage = usage
    member.inexact = 0


def _spec_task(entry: AssignmentEntry) -> Task:
    """An assignment not reported by its node yet, as the core sees its footprint there."""
    task = entry.task_spec.to_task(entry.at)
    if parse_replica_id(task.id) is not None:  # a service's replica: consolidation moves it
        return replace(task, migratable=True)
    return task


class FleetIndex:
    """The fleet's tasks, assignments and nodes, indexed for an incremental control step."""

    def __init__(self, *, grace_s: float, retention_s: float) -> None:
        """``grace_s``: how long a node is offline before its services fail over
        (``failover_after_s``); ``retention_s``: how long finished assignments are kept."""
        self.grace_s = grace_s
        self.retention_s = retention_s
        self.members: dict[str, _Member] = {}
        self.status: dict[str, tuple[str, float]] = {}  # node -> (online/offline, since)
        self.fresh: set[str] = set()
        #: task id -> the node reporting a copy of it (any state), or the nodes (sorted) when
        #: several do: the reports themselves are the members' (:meth:`copies_of`). One
        #: string per task, not a dict per task (a million tasks at 10,000 nodes).
        self.holders: dict[str, str | tuple[str, ...]] = {}
        self.assignments: dict[str, AssignmentEntry] = {}
        #: every task id of ``assignments`` and ``holders``, sorted: where a page of
        #: ``GET /v1/tasks`` starts (sorting a million ids for each page took ~0.5 s)
        self.task_ids: SortedList[str] = SortedList()
        self.pending: set[str] = set()
        #: node id -> the task ids actively assigned to it, in order (a tuple, not a set: a
        #: set of 70 ids is 2 KiB, the tuple 0.6; changed one assignment at a time).
        self.assigned: dict[str, tuple[str, ...]] = {}
        self.stops: dict[str, StopOrder] = {}
        self.orders: dict[str, PowerOrder] = {}
        self.parked: set[str] = set()  # nodes that report themselves parked
        self._reconcile_due: set[str] = set()
        #: Services' replicas whose report or assignment changed since the service controller
        #: last looked (it drains this: a step reconciles only the services they belong to)
        self.replicas_touched: set[str] = set()
        self._stops_due: set[str] = set()
        #: When each finished assignment may be forgotten, and the same task ids bucketed by
        #: the whole second of that time (a heap of the seconds beside): 8 bytes a task in a
        #: bucket's list where a heap of (time, id) tuples took 64 (half a million such at
        #: 10,000 nodes). A bucket may hold ids whose time moved since (superseded: skipped
        #: when its second comes, and all dropped once they outnumber the live ones).
        self._prune_at: dict[str, float] = {}
        self._prune_buckets: dict[int, list[str]] = {}
        self._prune_seconds: list[int] = []
        self._prune_held = 0  # ids in the buckets, superseded ones too
        #: assignments :meth:`recheck_all` left for :meth:`recheck_some` to schedule a
        #: forgetting time for, a slice a step
        self._prune_recheck: list[str] = []
        self._offline_heap: list[tuple[float, float, str]] = []  # (since + grace, since, node)
        self._overdue: set[str] = set()
        #: the active service assignments (restart always) of the overdue nodes: what
        #: :meth:`failover_candidates` answers, kept as assignments and statuses change (a
        #: step no longer walks every task of every overdue node: 2 s a step with 1,000 such)
        self._failover: set[str] = set()
        self._table: NodeTable | None = None
        self._stale: set[str] = set()  # nodes whose footprint moved, not yet summed
        self._moved: set[str] = set()  # nodes whose core Node changed, row not yet patched
        #: Bumped whenever what a placement would see changes.
        self.version = 0

    # --- node documents -------------------------------------------------------------------

    def update_node(self, node_id: str, view: NodeView, changed: Iterable[str] | None) -> None:
        """A node document changed: ``changed`` are the task ids whose entries changed (None:
        any may have, e.g. a new replica or a new epoch)."""
        member = self.members.get(node_id)
        new = member is None
        if member is None:
            member = self.members[node_id] = _Member()
            changed = None
            for task_id in self.assigned.get(node_id, ()):
                self._refresh_pair(task_id, node_id)
            self._stops_due.update(k for k in self.stops if k.endswith(f"@{node_id}"))
        tasks = view.tasks
        keys = set(member.reports) | set(tasks) if changed is None else set(changed)
        for task_id in keys:
            report = tasks.get(task_id)
            old = member.reports.get(task_id)
            if report == old:
                continue
            if old is not None:
                member.states[old.state.value] -= 1
            if report is None:
                del member.reports[task_id]
                self._drop_holder(task_id, node_id)
            else:
                member.reports[task_id] = report
                member.states[report.state.value] += 1
                if old is None:
                    self._add_holder(task_id, node_id)
            self._refresh_pair(task_id, node_id)
            self._reconcile_due.add(task_id)
            if parse_replica_id(task_id) is not None:
                self.replicas_touched.add(task_id)
            key = f"{task_id}@{node_id}"
            if key in self.stops:
                self._stops_due.add(key)
            self._schedule_prune(task_id)
        power = reported(view)
        if new or view.registration != member.registration or power != member.power:
            member.registration = view.registration
            member.power = power
            if power.state == PARKED:
                self.parked.add(node_id)
            else:
                self.parked.discard(node_id)
            self._recompute_node(node_id)

    def copies_of(self, task_id: str) -> dict[str, TaskReport]:
        """node id -> that node's report of the task (any state), in node id order."""
        held = self.holders.get(task_id)
        if held is None:
            return {}
        if type(held) is str:
            return {held: self.members[held].reports[task_id]}
        return {n: self.members[n].reports[task_id] for n in held}

    def _add_holder(self, task_id: str, node_id: str) -> None:
        held = self.holders.get(task_id)
        if held is None:
            self.holders[task_id] = node_id
            if task_id not in self.assignments:
                self.task_ids.add(task_id)
        elif type(held) is str:
            self.holders[task_id] = tuple(sorted((held, node_id)))
        else:
            self.holders[task_id] = tuple(sorted((*held, node_id)))

    def _drop_holder(self, task_id: str, node_id: str) -> None:
        held = self.holders.get(task_id)
        if held is None:
            return
        if type(held) is str:
            if held == node_id:
                del self.holders[task_id]
                if task_id not in self.assignments:
                    self.task_ids.remove(task_id)
            return
        rest = tuple(n for n in held if n != node_id)
        self.holders[task_id] = rest[0] if len(rest) == 1 else rest

    def reads_packed(self, node_id: str) -> bool:
        """Whether the node's registration says it reads packed entries."""
        member = self.members.get(node_id)
        return (
            member is not None
            and member.registration is not None
            and (member.registration.reads_packed)
        )

    def set_status(self, node_id: str, state: str, since: float) -> None:
        """A node's liveness (``online``/``offline``) since ``since``."""
        if self.status.get(node_id) == (state, since):
            return
        was = self.status.get(node_id, ("unknown", 0.0))[0]
        self.status[node_id] = (state, since)
        if node_id in self._overdue:  # a new spell, whatever the old one was
            self._overdue.discard(node_id)
            self._failover.difference_update(self.assigned.get(node_id, ()))
        if state == "offline":
            heapq.heappush(self._offline_heap, (since + self.grace_s, since, node_id))
        if (was == "online") != (state == "online") and node_id in self.members:
            self._recompute_node(node_id)

    def set_fresh(self, node_id: str, fresh: bool) -> None:
        """Whether the node's replica is current (online, resynced since): only fresh nodes'
        claims are settled."""
        if fresh == (node_id in self.fresh):
            return
        if fresh:
            self.fresh.add(node_id)
        else:
            self.fresh.discard(node_id)
        member = self.members.get(node_id)
        if member is not None:
            self._reconcile_due.update(
                t for t, r in member.reports.items() if r.active and r.assignment is not None
            )

    # --- the policy document --------------------------------------------------------------

    def set_assignment(self, task_id: str, entry: AssignmentEntry | None) -> None:
        old = self.assignments.get(task_id)
        if entry == old:
            return
        if entry is None:
            del self.assignments[task_id]
            if task_id not in self.holders:
                self.task_ids.remove(task_id)
        else:
            self.assignments[task_id] = entry
            if old is None and task_id not in self.holders:
                self.task_ids.add(task_id)
        if entry is not None and entry.state is AssignmentState.PENDING:
            self.pending.add(task_id)
        else:
            self.pending.discard(task_id)
        nodes = set()
        for e in (old, entry):
            if e is not None and e.node:
                nodes.add(e.node)
        self._failover.discard(task_id)
        if (
            entry is not None
            and entry.active
            and entry.node in self._overdue
            and entry.task_spec.restart is RestartPolicy.ALWAYS
        ):
            self._failover.add(task_id)
        if old is not None and old.active and old.node:
            held = self.assigned.get(old.node, ())
            i = bisect_left(held, task_id)
            if i < len(held) and held[i] == task_id:
                if len(held) == 1:
                    del self.assigned[old.node]
                else:
                    self.assigned[old.node] = held[:i] + held[i + 1 :]
        if entry is not None and entry.active and entry.node:
            held = self.assigned.get(entry.node, ())
            i = bisect_left(held, task_id)
            if i == len(held) or held[i] != task_id:
                self.assigned[entry.node] = (*held[:i], task_id, *held[i:])
        for node_id in sorted(nodes):
            self._refresh_pair(task_id, node_id)
        self._reconcile_due.add(task_id)
        if parse_replica_id(task_id) is not None:
            self.replicas_touched.add(task_id)
        self._schedule_prune(task_id)
        self.version += 1

    def set_stop(self, key: str, order: StopOrder | None) -> None:
        if order is None:
            self.stops.pop(key, None)
        else:
            self.stops[key] = order
            self._stops_due.add(key)
        self._reconcile_due.add(key.rpartition("@")[0])

    def set_order(self, node_id: str, order: PowerOrder | None) -> None:
        if order == self.orders.get(node_id):
            return
        if order is None:
            self.orders.pop(node_id, None)
        else:
            self.orders[node_id] = order
        if node_id in self.members:
            self._recompute_node(node_id)

    # --- what a step asks -----------------------------------------------------------------

    def failover_candidates(self, now: float) -> list[str]:
        """Active service assignments whose node has been offline more than the grace (the
        same list :func:`edgesched.central.placement.failovers` gives)."""
        heap = self._offline_heap
        while heap:
            _due, since, node_id = heap[0]
            if self.status.get(node_id) != ("offline", since):
                heapq.heappop(heap)  # it came back (or went offline again since)
                continue
            if not now - since > self.grace_s:
                break
            heapq.heappop(heap)
            if node_id not in self._overdue:
                self._overdue.add(node_id)
                for task_id in self.assigned.get(node_id, ()):
                    if self.assignments[task_id].task_spec.restart is RestartPolicy.ALWAYS:
                        self._failover.add(task_id)
        return sorted(self._failover)

    def settlements(self, policy: ReconcilePolicy, limit: int | None = None) -> list[Settlement]:
        """Tasks due a look settled by the pure rule (those needing stop orders), draining
        the due set: the same settlements :func:`~edgesched.central.placement.reconcile`
        gives over every task, for the tasks whose inputs changed. ``limit``: look at most at
        that many (the rest stay due, :attr:`backlog`): a step after :meth:`recheck_all`
        stays short (700,000 tasks due at 10,000 nodes took one step ~15 s)."""
        due = self._reconcile_due
        if limit is not None and len(due) > limit:
            batch = sorted(itertools.islice(due, limit))
            due.difference_update(batch)
        else:
            batch, self._reconcile_due = sorted(due), set()
        out = []
        for task_id in batch:
            entry = self.assignments.get(task_id)
            if entry is None or task_id not in self.holders:
                continue
            live = {n: r for n, r in self.copies_of(task_id).items() if n in self.fresh}
            settled = settle(task_id, entry, claims_from(task_id, live), self.stops, policy)
            if settled is not None:
                out.append(settled)
        return out

    def recheck_all(self) -> None:
        """Look at every task and stop order again at the next step, and every finished
        assignment's time to forget (leadership or shard ownership changed: what another
        replica was to act on is ours now). O(assignments), once."""
        self._reconcile_due.update(self.assignments)
        self._stops_due.update(self.stops)
        self._prune_at.clear()
        self._prune_buckets.clear()
        self._prune_seconds.clear()
        self._prune_held = 0
        self._prune_recheck = list(self.assignments)  # (the engine's step: recheck_some)

    def recheck_some(self, limit: int | None) -> None:
        """Schedule a forgetting time for up to ``limit`` (None: all) of the assignments
        :meth:`recheck_all` left; a task changed meanwhile was scheduled by its change (the
        same time again: no harm). Until then such a task is forgotten later, never early."""
        pending = self._prune_recheck
        take = len(pending) if limit is None else min(limit, len(pending))
        if take:
            for task_id in pending[-take:]:
                self._schedule_prune(task_id)
            del pending[-take:]

    @property
    def backlog(self) -> int:
        """Work :meth:`recheck_all` left for later steps (tasks to settle, forgetting times
        to schedule)."""
        return len(self._reconcile_due) + len(self._prune_recheck)

    def stops_done(self) -> list[str]:
        """Stop orders (``task@node``) whose loser reports no active copy any more."""
        due, self._stops_due = self._stops_due, set()
        out = []
        for key in sorted(due):
            if key not in self.stops:
                continue
            task_id, _, node_id = key.rpartition("@")
            member = self.members.get(node_id)
            if member is None:
                continue
            report = member.reports.get(task_id)
            if report is None or not report.active:
                out.append(key)
        return out

    def forgettable(self, now: float) -> list[str]:
        """Assignments central may forget now (what
        :func:`~edgesched.central.placement.prunable` gives)."""
        out = []
        seconds, buckets, prune_at = self._prune_seconds, self._prune_buckets, self._prune_at
        last = _second(now)
        due_seconds = []
        while seconds and seconds[0] <= last:
            due_seconds.append(heapq.heappop(seconds))
        for second in due_seconds:  # (what is pushed meanwhile goes to new buckets)
            task_ids = buckets.pop(second, ())
            self._prune_held -= len(task_ids)
            for task_id in task_ids:
                due = prune_at.get(task_id)
                if due is None or _second(due) != second:
                    continue  # superseded by a later change (or forgotten already)
                if due > now:  # (later in the current second): look again then
                    self._bucket_prune(task_id, due)
                    continue
                del prune_at[task_id]
                entry = self.assignments.get(task_id)
                if entry is None:
                    continue
                copies = self.copies_of(task_id)
                if can_forget(entry, copies, now, self.retention_s):
                    out.append(task_id)
                else:  # (a rounding hair short of its time): look again later
                    again = forget_at(entry, copies, self.retention_s)
                    if again is not None:
                        self._push_prune(task_id, max(again, now) + 1e-6)
        return sorted(out)

    def table(self) -> NodeTable:
        """The usable nodes (online, registered) and what counts on them, as the core's
        table. Shared: fork it before changing it (the core's cycles do)."""
        self.sum_footprints()
        moved, self._moved = self._moved, set()
        table = self._table
        if table is None:
            table = self._build_table()
        elif len(moved) > PATCH_UP_TO:  # one pass over the table for all of them
            table = table.with_rows(self._rows(table, moved))
        else:
            for node_id, row in sorted(self._rows(table, moved).items()):
                table = table.without_node(node_id) if row is None else table.with_node(*row)
        self._table = table
        return table

    def _rows(
        self, table: NodeTable, moved: Iterable[str]
    ) -> dict[str, tuple[Node, np.ndarray, list[Placement]] | None]:
        """What the moved nodes' rows are to become (:meth:`NodeTable.with_rows`, or one
        ``with_node`` / ``without_node`` each): each one's row as its member is now (footprint
        summed), None for one whose row goes; a row back as it was (offline, then online
        again) and a node that had no row and has none are left out."""
        rows: dict[str, tuple[Node, np.ndarray, list[Placement]] | None] = {}
        for node_id in moved:
            member = self.members[node_id]
            node = member.node
            row = table.index.get(node_id)
            if node is None:
                if row is not None:
                    rows[node_id] = None
            elif row is None or table.nodes[row] != node:
                rows[node_id] = (node, member.used, member.placements)
        return rows

    def sum_footprints(self) -> None:
        """Sum what changed on each node since last asked, into its row (O(changed nodes)):
        a step does it as it goes; the rows of nodes that joined, left or changed wait for
        the next :meth:`table` (one pass for all of them, when a placement needs it)."""
        for node_id in sorted(self._stale):
            self._footprint_changed(node_id)
        self._stale.clear()

    def usable(self) -> dict[str, Node]:
        return {n.id: n for n in self.table().nodes}

    def unusable(self) -> dict[str, str]:
        """node id -> why it is no placement target (the nodes with a document)."""
        table = self.table()
        return {n: m.why for n, m in sorted(self.members.items()) if n not in table.index}

    def placements(self) -> tuple[Placement, ...]:
        """Everything the table counts, node by node (O(placements): for the extender)."""
        return tuple(p for row in self.table().on_node for p in row)

    # --- upkeep ---------------------------------------------------------------------------

    def _refresh_pair(self, task_id: str, node_id: str) -> bool:
        """Recompute what task ``task_id`` counts for on node ``node_id``; True if it moved."""
        member = self.members.get(node_id)
        if member is None:
            return False
        report = member.reports.get(task_id)
        task: Task | None = None
        if report is not None:
            task = report_task(task_id, report) if report.active else None
        else:
            entry = self.assignments.get(task_id)
            if entry is not None and entry.active and entry.node == node_id:
                task = _spec_task(entry)
        keys, placements = member.keys, member.placements
        i = bisect_left(keys, task_id)
        there = i < len(keys) and keys[i] == task_id
        old = placements[i].task if there else None
        if task == old:
            return False
        if old is not None:
            _count(member, old, -1.0)
        after = i + 1 if there else i  # (replaced lists: the table's row shares the old one)
        if task is None:
            member.keys = keys[:i] + keys[after:]
            member.placements = placements[:i] + placements[after:]
        else:
            member.keys = [*keys[:i], task_id, *keys[after:]]
            placed = Placement(task, node_id, task.submitted_at)
            member.placements = [*placements[:i], placed, *placements[after:]]
            _count(member, task, 1.0)
        member.inexact += 1
        self._stale.add(node_id)
        self.version += 1
        return True

    def _footprint_changed(self, node_id: str) -> None:
        """A stale row's placements and sums, for the table. The sums were kept as the
        footprint changed (O(1) a change); every :data:`EXACT_EVERY` changes, and whenever
        the node runs nothing, they are summed again from scratch, so the rounding of many
        additions and subtractions never drifts far (a node filled exactly to its capacity
        must still read full)."""
        member = self.members[node_id]
        if member.inexact >= EXACT_EVERY or not member.placements:
            _sum_exactly(member)
        used = np.array(member.sums)
        usage = {w: cpu for w, cpu in member.running_usage.items() if abs(cpu) >= 1e-9}
        old_usage = member.usage
        member.used = used
        member.usage = usage
        self.version += 1
        table = self._table
        row = None if table is None else table.index.get(node_id)
        if table is None or row is None:
            return
        table.used[row] = used
        table.on_node[row] = member.placements
        for workload, cpu in old_usage.items():
            table.usage[workload] = table.usage.get(workload, 0.0) - cpu
        for workload, cpu in usage.items():
            table.usage[workload] = table.usage.get(workload, 0.0) + cpu
        for workload in [w for w, cpu in table.usage.items() if abs(cpu) < 1e-9]:
            del table.usage[workload]

    def _recompute_node(self, node_id: str) -> None:
        """The core's node of a member (registration, liveness, power); when it changes, its
        table row is patched at the next :meth:`table`."""
        member = self.members[node_id]
        state = self.status.get(node_id, ("unknown", 0.0))[0]
        node: Node | None = None
        if state != "online":
            why = f"node is {state}"
        elif member.registration is None:
            why = f"node {node_id}: no registration"
        else:
            try:
                node = registered_node(node_id, member.registration)
                why = ""
            except ValueError as exc:
                why = str(exc)
        if node is not None:
            node = powered(node, member.power, self.orders.get(node_id))
        if node != member.node:
            member.node = node
            self._moved.add(node_id)
            self.version += 1
        member.why = why

    def _build_table(self) -> NodeTable:
        """The table from scratch, from the members as last summed (O(nodes))."""
        ids = sorted(n for n, m in self.members.items() if m.node is not None)
        nodes = [self.members[n].node for n in ids]
        table = NodeTable.build([n for n in nodes if n is not None], ())
        usage: dict[str, float] = {}
        if ids:
            table.used[:] = np.array([self.members[n].used for n in ids])
        for row, node_id in enumerate(ids):
            member = self.members[node_id]
            table.on_node[row] = member.placements
            for workload, cpu in member.usage.items():
                usage[workload] = usage.get(workload, 0.0) + cpu
        table.usage.clear()
        table.usage.update(usage)
        return table

    def _schedule_prune(self, task_id: str) -> None:
        entry = self.assignments.get(task_id)
        due = None if entry is None else forget_at(entry, self.copies_of(task_id), self.retention_s)
        if due is None:
            self._prune_at.pop(task_id, None)
        elif self._prune_at.get(task_id) != due:
            self._push_prune(task_id, due)

    def _push_prune(self, task_id: str, due: float) -> None:
        self._prune_at[task_id] = due
        self._bucket_prune(task_id, due)
        if self._prune_held > 2 * len(self._prune_at) + PRUNE_SLACK:
            # superseded times outnumber the live ones: rebuilt from the live (O(n), once
            # per as many pushes), else each change of a task leaves an id behind
            self._prune_buckets.clear()
            self._prune_seconds.clear()
            self._prune_held = 0
            for t, at in self._prune_at.items():
                self._bucket_prune(t, at)

    def _bucket_prune(self, task_id: str, due: float) -> None:
        """File ``task_id`` under the whole second of ``due``."""
        second = _second(due)
        bucket = self._prune_buckets.get(second)
        if bucket is None:
            self._prune_buckets[second] = [task_id]
            heapq.heappush(self._prune_seconds, second)
        else:
            bucket.append(task_id)
        self._prune_held += 1

    def stats(self) -> Mapping[str, int]:
        return {
            "nodes": len(self.members),
            "usable": len(self.table().nodes),
            "assignments": len(self.assignments),
            "pending": len(self.pending),
            "copies": sum(len(m.reports) for m in self.members.values()),  # (O(nodes))
            "stops": len(self.stops),
            "prune_queue": len(self._prune_at),
        }
