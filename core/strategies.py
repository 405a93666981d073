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
    failed: set[tuple[object, ...]] = set()  # load only grows in a cycle: a failed shape stays so
    for task in ordered:
        shape = (task.workload, task.demand, task.archs, tuple(task.images), task.server_classes)
        if shape in failed:
            waiting[task.id] = f"{reason}: no node fits"
            continue
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
            failed.add(shape)
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


def realized_peaks(tasks: Sequence[Task]) -> dict[str, Resources]:
    """Per workload class, the peak CPU and accelerators in use if every task started the moment
    it arrived.

    Sizing static slices from the realized trace (hindsight) is the most generous sizing a
    static operator could ever have; the baseline gets it so it is never set up to lose.
    """
    events: dict[str, list[tuple[float, float, int]]] = {}
    for t in tasks:
        end = t.submitted_at + (t.duration_s if t.duration_s is not None else float("inf"))
        d = t.demand
        events.setdefault(t.workload, []).extend(
            ((t.submitted_at, d.cpu, d.accel), (end, -d.cpu, -d.accel))
        )
    peaks: dict[str, Resources] = {}
    for workload, evs in events.items():
        cpu = peak_cpu = 0.0
        acc = peak_acc = 0
        for _, dc, da in sorted(evs):
            cpu += dc
            acc += da
            peak_cpu, peak_acc = max(peak_cpu, cpu), max(peak_acc, acc)
        peaks[workload] = Resources(cpu=peak_cpu, accel=peak_acc)
    return peaks


def partition_fleet(
    nodes: Sequence[Node], peaks: Mapping[str, Resources], samples: Mapping[str, Task]
) -> StaticPartition:
    """Split the fleet into per-class slices sized to each class's peak demand.

    ``samples`` holds one representative task per class (for its architecture, image and
    server-class constraints). Classes are served most-constrained first (fewest compatible
    nodes), each taking compatible nodes (its natural server class first, then the nodes fewest
    other classes can use) until it holds its share of the accelerators and its peak CPU, or,
    when the peaks add up to more than the fleet, its proportional share of what is left; nodes
    left over go one by one to the compatible class furthest below its peak.
    """
    fleet_acc = sum(n.capacity.accel for n in nodes)
    peak_acc = sum(p.accel for p in peaks.values()) or 1
    target_cpu = {w: p.cpu for w, p in peaks.items()}
    target_acc = {w: fleet_acc * p.accel / peak_acc for w, p in peaks.items()}

    def compatible(node: Node, workload: str) -> bool:
        t = samples[workload]
        if not t.runs_on(node.arch):
            return False
        if t.server_classes and node.server_class not in t.server_classes:
            return False
        return t.demand.fits_in(node.capacity)

    users = {n.id: sum(compatible(n, w) for w in peaks) for n in nodes}
    assigned: dict[str, list[Node]] = {w: [] for w in peaks}
    free = {n.id: n for n in sorted(nodes, key=lambda n: n.id)}

    def short(w: str) -> bool:
        have_cpu = sum(n.capacity.cpu for n in assigned[w])
        have_acc = sum(n.capacity.accel for n in assigned[w])
        return have_cpu < target_cpu[w] or have_acc < target_acc[w]

    by_constraint = sorted(peaks, key=lambda w: (sum(compatible(n, w) for n in nodes), w))
    for i, w in enumerate(by_constraint):
        # What is left is shared in proportion to the peaks of the classes not yet served, so
        # a shortfall (the sum of the peaks may exceed the fleet) falls on every class alike.
        left_cpu = sum(n.capacity.cpu for n in free.values())
        unserved = sum(peaks[x].cpu for x in by_constraint[i:]) or 1.0
        target_cpu[w] = min(peaks[w].cpu, left_cpu * peaks[w].cpu / unserved)
        natural = natural_class(samples[w])
        options = sorted(
            (n for n in free.values() if compatible(n, w)),
            key=lambda n: (n.server_class != natural, users[n.id], n.id),
        )
        for node in options:
            if not short(w):
                break
            assigned[w].append(free.pop(node.id))
    for node in list(free.values()):
        owners = [w for w in peaks if compatible(node, w)]
        if owners:
            best = min(
                owners,
                key=lambda w: (
                    sum(n.capacity.cpu for n in assigned[w]) / max(target_cpu[w], 1e-9),
                    w,
                ),
            )
            assigned[best].append(free.pop(node.id))
    return StaticPartition({w: tuple(ns) for w, ns in assigned.items()})
