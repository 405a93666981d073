"""Task dependencies of a replayed trace: release times, and a gate that holds dependents back.

A trace groups instances into tasks; a task may depend on other tasks (all their instances
must finish before any of its own starts). The simulator's arrivals are fixed in advance, so
a replay does two things:

* :func:`release_times`: each instance is submitted at its *unconstrained release time*,
  ``max(arrival, finish of every task it depends on)`` where a task finishes when its last
  instance would end had every instance started at its own release (a topological pass). The
  SLO wait is measured from that time.
* :class:`DependencyGate`: wraps a strategy so it never sees (so never starts) an instance
  while a task it depends on still has an instance that has not finished in the simulation.
  A dependent of a task that queued is therefore held back past its release, and the extra
  wait is counted against the strategy that delayed the task it waited for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgesched.core.model import DecisionKind, Task
from edgesched.core.scheduler import ClusterView, ScheduleResult
from edgesched.core.strategies import Strategy


class DependencyCycle(ValueError):
    """Tasks that depend on each other in a cycle; ``group`` is one task of it (an index)."""

    def __init__(self, group: int) -> None:
        super().__init__(f"dependency cycle through task group {group}")
        self.group = group


def release_times(
    arrivals: Sequence[float],
    durations: Sequence[float],
    group_of: Sequence[int],
    needs: Sequence[Sequence[int]],
) -> list[float]:
    """Release time of each instance: instance ``i`` belongs to task group ``group_of[i]``,
    group ``g`` depends on the groups ``needs[g]``. Raises :class:`DependencyCycle`."""
    n_groups = len(needs)
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for i, g in enumerate(group_of):
        members[g].append(i)
    finish = [0.0] * n_groups
    ready = [0.0] * n_groups  # the latest finish among a group's dependencies
    state = [0] * n_groups  # 0 new, 1 on the stack, 2 done
    out = list(arrivals)
    for root in range(n_groups):
        if state[root]:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            g, k = stack[-1]
            deps = needs[g]
            if k < len(deps):
                stack[-1] = (g, k + 1)
                d = deps[k]
                if state[d] == 1:
                    raise DependencyCycle(d)
                if state[d] == 0:
                    state[d] = 1
                    stack.append((d, 0))
                continue
            stack.pop()
            ready[g] = max((finish[d] for d in deps), default=0.0)
            end = 0.0
            for i in members[g]:
                out[i] = max(arrivals[i], ready[g])
                end = max(end, out[i] + durations[i])
            finish[g] = max(end, ready[g])
            state[g] = 2
    return out


@dataclass(slots=True)
class DependencyGate:
    """``inner`` with the instances whose dependencies have not finished hidden from it.

    ``needs``: task id -> the task groups it waits for; ``members``: group -> its task ids.
    An instance counts as finished once it was placed and is neither running nor pending
    (a preempted instance goes back to pending, so it is not finished)."""

    inner: Strategy
    needs: Mapping[str, tuple[str, ...]]
    members: Mapping[str, tuple[str, ...]]
    _placed: set[str] = field(default_factory=set)
    _left: dict[str, int] = field(default_factory=dict)
    _done: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._left = {g: len(ids) for g, ids in self.members.items()}

    @property
    def name(self) -> str:
        return self.inner.name

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        if self._placed:
            live = {p.task.id for p in view.placements}
            live.update(t.id for t in pending)
            for task_id in self._placed - live:
                self._finish(task_id)
            self._placed &= live
        visible = [t for t in pending if self._ready(t.id)]
        result = self.inner.decide(view, visible)
        for d in result.decisions:
            if d.kind is DecisionKind.PLACE and d.task_id is not None:
                self._placed.add(d.task_id)
        return result

    def _ready(self, task_id: str) -> bool:
        return all(self._left.get(g, 0) == 0 for g in self.needs.get(task_id, ()))

    def _finish(self, task_id: str) -> None:
        if task_id in self._done:
            return
        self._done.add(task_id)
        group = _group_of(task_id)
        if group in self._left:
            self._left[group] -= 1


def _group_of(task_id: str) -> str:
    """The task group of an instance id ``job/task/k``: ``job/task``."""
    return task_id.rpartition("/")[0]
