"""Fleet power: which online nodes central parks and wakes. Pure.

In ``energy`` and ``learned`` mode, with ``[central] park_nodes`` on, the leading central runs
the core's power stage over the fleet each control step: the nodes with their power state as
*they* report it, what they run, the tasks waiting at central, and the fleet's 15-minute
forecast (``ClusterView.forecast_cpu``). The core keeps the forecast peak plus spare awake,
wakes parked nodes ahead of a peak or for waiting work, and parks nodes idle longer than
``park_idle_after_s`` beyond that. Central writes its orders into the policy document's
``power`` map; each node carries them out and reports back in its document
(``node.power``: ``state``, ``idle_since``). Until a woken node reports itself active it is
*waking* (no placement target); a node cut off from central wakes itself when local work
arrives (autonomy first), and reports that.

Central only parks a node that reports no active task. The core's consolidation moves only
migratable work: at central, a service's replicas (:mod:`edgesched.central.services`), which
central migrates make-before-break (:meth:`CentralEngine.migrate`'s path: the target runs
it, then the source stops it); anything else stays where it runs, and its node awake.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from edgesched.central.placement import FleetView
from edgesched.core.model import DecisionKind, Node, NodeState, Task
from edgesched.core.policy import PolicyConfig
from edgesched.core.scheduler import ClusterView, schedule
from edgesched.sync import schema
from edgesched.sync.schema import NodeView, PowerReport

PARKED = "parked"
ACTIVE = "active"


@dataclass(frozen=True, slots=True)
class PowerOrder:
    """Central's order to one node: ``parked`` or ``active``, and why."""

    node_id: str
    state: str
    reason: str
    at: float

    def to_order(self) -> schema.PowerOrder:
        """The policy document's ``power`` entry."""
        return schema.PowerOrder(state=self.state, reason=self.reason, at=self.at)


def reported(view: NodeView) -> PowerReport:
    """A node document's power report, its state read as parked or active; a node that
    reports nothing (an older engine, or a report the schema refused) is active and never
    idle."""
    power = view.power
    if power is None:
        return PowerReport()
    state = PARKED if power.state == PARKED else ACTIVE
    return power if state == power.state else replace(power, state=state)


def with_power(
    view: FleetView,
    reports: Mapping[str, PowerReport],
    orders: Mapping[str, schema.PowerOrder],
) -> FleetView:
    """``view`` with each node's power state (:func:`powered`)."""
    nodes = tuple(
        powered(node, reports.get(node.id, PowerReport()), orders.get(node.id))
        for node in view.nodes
    )
    return replace(view, nodes=nodes)


def powered(node: Node, report: PowerReport, standing: schema.PowerOrder | None) -> Node:
    """``node`` with its power state: parked as it reports, *waking* when central's
    ``standing`` order is active but it still reports parked, active otherwise; and its idle
    time."""
    if report.state == PARKED:
        ordered = None if standing is None else standing.state
        state = NodeState.WAKING if ordered == ACTIVE else NodeState.PARKED
        return replace(node, state=state, idle_since=None)
    return replace(node, state=NodeState.ACTIVE, idle_since=report.idle_since)


@dataclass(frozen=True, slots=True)
class Move:
    """The core's consolidation: move ``task_id`` from ``source`` to ``target`` (to empty
    ``source`` for parking). Only migratable tasks (a service's replicas, at central) move."""

    task_id: str
    source: str
    target: str
    reason: str


def power_orders(
    cluster: ClusterView,
    busy: Collection[str],
    waiting: Sequence[Task],
    policy: PolicyConfig,
    orders: Mapping[str, schema.PowerOrder],
    reports: Mapping[str, PowerReport],
) -> list[PowerOrder]:
    """The park and wake orders of :func:`power_plan`."""
    return power_plan(cluster, busy, waiting, policy, orders, reports)[0]


def power_plan(
    cluster: ClusterView,
    busy: Collection[str],
    waiting: Sequence[Task],
    policy: PolicyConfig,
    orders: Mapping[str, schema.PowerOrder],
    reports: Mapping[str, PowerReport],
) -> tuple[list[PowerOrder], list[Move]]:
    """The park and wake orders the core gives for ``cluster`` (its nodes' power states as
    :func:`with_power` gives them, the forecast in ``forecast_cpu``), leaving out orders
    already standing and parks of ``busy`` nodes (those that run anything). An order is
    standing while the node has neither changed state nor started a new idle spell since it
    was given (a node that woke itself for local work, or was busy when a park order came,
    gets a new one when it has been idle long enough again)."""
    if not policy.parks_nodes:
        return [], []
    result = schedule(cluster, list(waiting), policy)
    out: list[PowerOrder] = []
    moves: list[Move] = []
    for d in result.decisions:
        if d.kind is DecisionKind.MIGRATE and d.task_id is not None and d.from_node:
            moves.append(Move(d.task_id, d.from_node, d.node_id, d.reason))
            continue
        if d.kind is DecisionKind.PARK and d.node_id not in busy:
            state = PARKED
        elif d.kind is DecisionKind.WAKE:
            state = ACTIVE
        else:
            continue
        standing = orders.get(d.node_id)
        report = reports.get(d.node_id, PowerReport())
        since = max(report.since, report.idle_since or 0.0)
        if standing is not None and standing.state == state and standing.at >= since:
            continue
        out.append(PowerOrder(d.node_id, state, d.reason, cluster.now))
    return out, moves
