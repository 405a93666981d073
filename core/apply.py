"""Apply a cycle's decisions to a cluster view: the core's own model of their effect.

Tests use it to check the core's invariants (no node overcommitted after the decisions), and
a tier can use it to predict the state it is steering to. Pure: returns new tuples, never
mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from edgesched.core.model import Decision, DecisionKind, Node, NodeState, Placement, Task


class DecisionError(ValueError):
    """A decision that does not fit the state it is applied to."""


@dataclass(frozen=True, slots=True)
class Applied:
    nodes: tuple[Node, ...]
    placements: tuple[Placement, ...]
    preempted: tuple[Task, ...]
    placed: tuple[str, ...]


def apply_decisions(
    nodes: Sequence[Node],
    placements: Iterable[Placement],
    pending: Iterable[Task],
    decisions: Iterable[Decision],
    now: float,
) -> Applied:
    """The state after ``decisions``; raises :class:`DecisionError` on an impossible one."""
    by_node = {n.id: n for n in nodes}
    running = {p.task.id: p for p in placements}
    waiting = {t.id: t for t in pending}
    preempted: list[Task] = []
    placed: list[str] = []
    for d in decisions:
        if d.kind is DecisionKind.PLACE:
            task = waiting.pop(d.task_id or "", None)
            if task is None:
                raise DecisionError(f"place: task {d.task_id} is not pending")
            if d.node_id not in by_node:
                raise DecisionError(f"place: unknown node {d.node_id}")
            running[task.id] = Placement(task, d.node_id, now)
            placed.append(task.id)
        elif d.kind is DecisionKind.PREEMPT:
            victim = running.pop(d.task_id or "", None)
            if victim is None or victim.node_id != d.node_id:
                raise DecisionError(f"preempt: task {d.task_id} is not running on {d.node_id}")
            preempted.append(victim.task)
        elif d.kind is DecisionKind.MIGRATE:
            moving = running.get(d.task_id or "")
            if moving is None or moving.node_id != d.from_node:
                raise DecisionError(f"migrate: task {d.task_id} is not on {d.from_node}")
            running[moving.task.id] = replace(moving, node_id=d.node_id)
        elif d.kind is DecisionKind.PARK:
            by_node[d.node_id] = replace(by_node[d.node_id], state=NodeState.PARKED)
        elif d.kind is DecisionKind.WAKE:
            node = by_node[d.node_id]
            by_node[d.node_id] = replace(
                node, state=NodeState.WAKING, ready_at=now + node.power.wake_latency_s
            )
    return Applied(
        nodes=tuple(by_node[n.id] for n in nodes),
        placements=tuple(running.values()),
        preempted=tuple(preempted),
        placed=tuple(placed),
    )
