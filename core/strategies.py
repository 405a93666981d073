"""Placement strategies the simulator compares: our policy modes and three baselines.

* :class:`CoreStrategy` runs :func:`edgesched.core.scheduler.schedule` under a policy (our
  modes, with or without the tidal profile), and also the Kubernetes-like baseline, which is
  the same pipeline restricted to kube-scheduler's LeastAllocated + BalancedAllocation scores
  on requests, priority order with preemption, no tidal profile, nothing parked.
* :class:`StaticPartition`: each workload class owns a fixed slice of servers, sized in
  proportion to its peak demand; a task may only use its class's slice (least allocated first).
* :class:`FirstFit`: first-come first-served, the first node in id order that fits.

Baselines are written as their operators would run them, never tuned to lose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from edgesched.core.model import Decision, DecisionKind, Node, Resources, Task
from edgesched.core.nodetable import natural_class
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, ScheduleResult, schedule


class Strategy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult: ...


@dataclass(frozen=True, slots=True)
class CoreStrategy:
    name: str
    policy: PolicyConfig

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        return schedule(view, pending, self.policy)


def kubernetes_like() -> CoreStrategy:
    """kube-scheduler defaults: LeastAllocated + BalancedAllocation on requests, preemption."""
    policy = PolicyConfig(
        mode=PolicyMode.PRIORITY,
        weights={"least_allocated": 1.0, "balanced_allocation": 1.0, "class_fit": 0.0},
    )
    return CoreStrategy("k8s-spread", policy)


def _free_fit(node: Node, used: Resources, demand: Resources) -> bool:
    return (used + demand).fits_in(node.capacity)


def _node_loads(view: ClusterView) -> dict[str, Resources]:
    used: dict[str, Resources] = {n.id: Resources() for n in view.nodes}
    for p in view.placements:
        used[p.node_id] = used[p.node_id] + p.task.demand
    return used


def _greedy(
    view: ClusterView,
    ordered: Sequence[Task],
    candidates: Mapping[str, Sequence[Node]] | None,
    reason: str,
    least_allocated: bool,
) -> ScheduleResult:
    used = _node_loads(view)
    nodes = sorted(view.nodes, key=lambda n: n.id)
    decisions: list[Decision] = []
    waiting: dict[str, str] = {}
    for task in ordered:
        pool = candidates[task.workload] if candidates is not None else nodes
        fits = [
            n
            for n in pool
            if task.runs_on(n.arch)
            and (not task.server_classes or n.server_class in task.server_classes)
            and _free_fit(n, used[n.id], task.demand)
        ]
        if not fits:
            waiting[task.id] = f"{reason}: no node fits"
            continue
        if least_allocated:
            target = min(fits, key=lambda n: (used[n.id].cpu / n.capacity.cpu, n.id))
        else:
            target = fits[0]
        used[target.id] = used[target.id] + task.demand
        decisions.append(
            Decision(
                DecisionKind.PLACE,
                target.id,
                reason,
                view.now,
                task_id=task.id,
                image=task.image_for(target.arch),
            )
        )
    return ScheduleResult(tuple(decisions), waiting)


@dataclass(frozen=True, slots=True)
class FirstFit:
    name: str = "first-fit"

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        ordered = sorted(pending, key=lambda t: (t.submitted_at, t.id))
        return _greedy(view, ordered, None, "first-fit", least_allocated=False)


@dataclass(frozen=True, slots=True)
class StaticPartition:
    """Each workload class owns fixed servers; see :func:`partition_fleet`."""

    slices: Mapping[str, tuple[Node, ...]]
    name: str = "static-partition"
    owner: Mapping[str, str] = field(default_factory=dict)

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        current = {n.id: n for n in view.nodes}
        slices = {w: tuple(current[n.id] for n in ns) for w, ns in self.slices.items()}
        ordered = sorted(pending, key=lambda t: (-t.priority, t.submitted_at, t.id))
        return _greedy(view, ordered, slices, "static slice", least_allocated=True)


def partition_fleet(
    nodes: Sequence[Node], peaks: Mapping[str, float], samples: Mapping[str, Task]
) -> StaticPartition:
    """Split the fleet into per-class slices sized in proportion to each class's peak demand.

    ``samples`` holds one representative task per class (for its architecture, image and
    server-class constraints). Nodes are dealt most-constrained first: each goes to the
    compatible class still below its target, preferring one whose natural server class is the
    node's, then the one furthest below its target.
    """
    total_peak = sum(peaks.values()) or 1.0
    fleet_cpu = sum(n.capacity.cpu for n in nodes)
    target = {w: fleet_cpu * p / total_peak for w, p in peaks.items()}
    assigned: dict[str, list[Node]] = {w: [] for w in peaks}
    have = dict.fromkeys(peaks, 0.0)

    def compatible(node: Node, workload: str) -> bool:
        t = samples[workload]
        if not t.runs_on(node.arch):
            return False
        if t.server_classes and node.server_class not in t.server_classes:
            return False
        return t.demand.fits_in(node.capacity)

    def flexibility(node: Node) -> int:
        return sum(compatible(node, w) for w in peaks)

    for node in sorted(nodes, key=lambda n: (flexibility(n), n.id)):
        options = [w for w in peaks if compatible(node, w)]
        if not options:
            continue
        best = max(
            options,
            key=lambda w: (
                have[w] < target[w],
                natural_class(samples[w]) == node.server_class,
                (target[w] - have[w]) / max(target[w], 1e-9),
                w,
            ),
        )
        assigned[best].append(node)
        have[best] += node.capacity.cpu
    return StaticPartition({w: tuple(ns) for w, ns in assigned.items()})
