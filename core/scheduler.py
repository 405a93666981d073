"""The scheduling core: one pure function from (cluster view, pending tasks, policy) to decisions.

A cycle runs these stages, in order, over a columnar node table:

1. **queue**: pending tasks sorted by the mode's order (priority then age, or age first);
2. **filter → score → select** for each task: the filter stage is
   :data:`~edgesched.core.plugins.FILTER_CHAIN` (the one declaration the extender runs too),
   then the score plugins of :mod:`edgesched.core.plugins` (over a sample of the nodes in a
   fleet of more than twice the policy's ``score_nodes``: see :func:`_sample`);
3. **preempt** when nothing fits: among the nodes passing the chain's stages no eviction can
   change, evict tasks of lower *effective* priority where the fewest, least important
   victims free enough room;
4. **power** (energy mode): wake parked nodes for work that could not be placed and for the
   forecast demand, consolidate migratable work off lightly used nodes, and park idle nodes
   beyond the headroom the forecast asks for;
5. **pin** (optional): per-core affinity plans for the nodes whose task set changed.

Effective priority: a task's own priority, plus :data:`TIDAL_BOOST` while its workload class is
within the share the current tidal window guarantees it. So a window hands its class the right
to reclaim capacity from classes running above their own share, and preemption never evicts a
task of higher or equal effective priority. Outside any window effective priority equals
priority.

Central runs this over the fleet, an edge node over itself; the simulator over simulated nodes.
No I/O, no clock: ``view.now`` is the only time.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgesched.core.affinity import AffinityDemand, plan_affinity, to_pin_decisions
from edgesched.core.learned import check_scores, learned_features
from edgesched.core.model import (
    MAX_PRIORITY,
    Decision,
    DecisionKind,
    Node,
    NodeState,
    Placement,
    ServerClass,
    Task,
)
from edgesched.core.nodetable import (
    CLASS_CODES,
    STATE_CODES,
    BoolArray,
    FloatArray,
    IntArray,
    NodeTable,
    resource_vector,
)
from edgesched.core.plugins import FILTER_CHAIN, SCORES, fits_when_empty
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.spread import (
    SPREAD_WEIGHT,
    GroupCounts,
    SpreadGroup,
    domain_codes,
    spread_mask,
    spread_score,
)

#: Added to a task's priority while its class is within its tidal guarantee.
TIDAL_BOOST = MAX_PRIORITY + 1
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the scheduler knows at ``now``: the nodes, what runs where, and the forecast.

    ``forecast_cpu`` is the peak CPU demand (cores) expected over the forecast horizon
    (15 minutes): work running and waiting, at an upper quantile rather than the mean, over a
    horizon that covers the slowest wake-up (the caller's forecaster decides; see
    :func:`edgesched.core.simulator.forecast_need`). The energy mode keeps that much capacity
    awake, plus headroom. ``forecast_ready`` False says the forecaster has no data yet (a
    cold start): the power stage then wakes what waiting work and the forecast ask for but
    parks and consolidates nothing.
    """

    nodes: tuple[Node, ...]
    placements: tuple[Placement, ...] = ()
    now: float = 0.0
    forecast_cpu: float | None = None
    #: Plan per-core affinity for nodes whose task set changed (the edge executor pins).
    pin_cores: bool = False
    #: Current pins (task id -> cores), so re-planning keeps them unless clearly better.
    pins: Mapping[str, frozenset[int]] = field(default_factory=dict)
    #: A table kept up to date by the caller for exactly ``nodes`` and ``placements``
    #: (central's fleet index): the cycle forks it instead of building one, O(nodes).
    table: NodeTable | None = None
    #: Run the power stage (energy mode). Central's placement of one task reads only the
    #: placement and turns it off: the power stage runs after placement and cannot change it.
    plan_power: bool = True
    forecast_ready: bool = True
    #: The peak number of accelerators asked over the same horizon (running and waiting),
    #: or None (no forecaster of accelerators: plan on what runs and waits).
    forecast_accel: float | None = None


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """The cycle's decisions, in order, and the tasks left waiting with the reason why."""

    decisions: tuple[Decision, ...]
    waiting: Mapping[str, str] = field(default_factory=dict)

    def of_kind(self, kind: DecisionKind) -> list[Decision]:
        return [d for d in self.decisions if d.kind is kind]


@dataclass(slots=True)
class _Cycle:
    """Mutable working state of one cycle; never escapes :func:`schedule`."""

    policy: PolicyConfig
    now: float
    table: NodeTable
    on_node: list[list[Placement]]
    usage: dict[str, float]
    guarantee: dict[str, float]
    decisions: list[Decision] = field(default_factory=list)
    touched: set[int] = field(default_factory=set)
    #: Bumped on every bind/unbind: a task shape that failed at this version fails again.
    version: int = 0
    static_cache: dict[Hashable, BoolArray] = field(default_factory=dict)
    #: task id -> its service's spread (:mod:`edgesched.core.spread`), and the cycle's count of
    #: each group's replicas per node.
    groups: Mapping[str, SpreadGroup] = field(default_factory=dict)
    group_counts: GroupCounts = field(default_factory=GroupCounts)
    domains: dict[str, tuple[list[str], IntArray]] = field(default_factory=dict)

    # --- tidal -----------------------------------------------------------------------------

    def in_share(self, workload: str, extra_cpu: float = 0.0) -> bool:
        cap = self.guarantee.get(workload)
        return cap is not None and self.usage.get(workload, 0.0) + extra_cpu <= cap + _EPS

    def effective_priority(self, task: Task, adding: bool) -> int:
        extra = task.demand.cpu if adding else 0.0
        boost = TIDAL_BOOST if self.in_share(task.workload, extra) else 0
        return task.priority + boost

    # --- bookkeeping -----------------------------------------------------------------------

    def static(self, task: Task, demand: FloatArray) -> BoolArray:
        """The filter chain's static stages for ``task``, computed once per task shape."""
        key = FILTER_CHAIN.static_key(task)
        mask = self.static_cache.get(key)
        if mask is None:
            mask = FILTER_CHAIN.static_mask(self.table, task, demand)
            self.static_cache[key] = mask
        return mask

    def feasible(self, task: Task, demand: FloatArray) -> BoolArray:
        """The filter stage: nodes passing the whole chain now."""
        return FILTER_CHAIN.feasible(self.table, task, demand, self.static(task, demand))

    def eligible(self, task: Task, demand: FloatArray) -> BoolArray:
        """Nodes passing the chain's stages that no eviction changes (preempt, consolidate)."""
        return FILTER_CHAIN.eligible(self.table, task, demand, self.static(task, demand))

    def spread(self, task: Task) -> tuple[BoolArray, FloatArray] | None:
        """For a replica of a service: the nodes of the whole table that may take it (its
        per-node bound) and their spread scores; None for any other task."""
        group = self.groups.get(task.id)
        if group is None:
            return None
        counts = self.group_counts.of(group)
        for key in group.across:
            if key != "node" and key not in self.domains:
                self.domains[key] = domain_codes(self.table, key)
        return (
            spread_mask(self.table, group, counts),
            spread_score(self.table, group, counts, self.domains),
        )

    def bind(self, row: int, task: Task) -> None:
        self.version += 1
        group = self.groups.get(task.id)
        if group is not None:
            self.group_counts.add(group, self.table.nodes[row].id)
        self.table.add(row, task.demand)
        # Replaced, not appended to: a forked table shares its rows (NodeTable.fork).
        placed = Placement(task, self.table.nodes[row].id, self.now)
        self.on_node[row] = [*self.on_node[row], placed]
        self.usage[task.workload] = self.usage.get(task.workload, 0.0) + task.demand.cpu
        self.touched.add(row)

    def unbind(self, row: int, placement: Placement) -> None:
        self.version += 1
        self.table.remove(row, placement.task.demand)
        kept = list(self.on_node[row])
        kept.remove(placement)
        self.on_node[row] = kept
        task = placement.task
        self.usage[task.workload] = max(self.usage.get(task.workload, 0.0) - task.demand.cpu, 0)
        self.touched.add(row)

    def awake_cpu(self) -> float:
        awake = self.table.state != STATE_CODES[NodeState.PARKED]
        return float(self.table.capacity[awake, 0].sum())

    def awake_accel(self) -> float:
        awake = self.table.state != STATE_CODES[NodeState.PARKED]
        return float(self.table.capacity[awake, 2].sum())

    def used_cpu(self) -> float:
        return float(self.table.used[:, 0].sum())


def _queue_key(policy: PolicyConfig) -> Callable[[Task], tuple[float, float, str]]:
    if policy.fifo:
        return lambda t: (t.submitted_at, -t.priority, t.id)
    return lambda t: (-t.priority, t.submitted_at, t.id)


def _weighted_score(
    policy: PolicyConfig, table: NodeTable, task: Task, demand: FloatArray
) -> tuple[FloatArray, dict[str, FloatArray]]:
    weights = policy.effective_weights
    parts = {name: SCORES[name].fn(table, task, demand) for name in sorted(weights)}
    total = np.zeros(len(table), dtype=np.float64)
    for name, values in parts.items():
        total += weights[name] * values
    total /= max(sum(weights.values()), _EPS)
    return total, parts


def _learned_score(
    cycle: _Cycle, task: Task, demand: FloatArray, candidates: np.ndarray
) -> tuple[FloatArray | None, str]:
    """The injected model's scores over ``candidates``, or ``(None, why)`` to fall back."""
    model = cycle.policy.learned_score
    if model is None:
        return None, "no model"
    try:
        raw = model(learned_features(cycle.table, task, demand, candidates))
    except Exception as exc:  # the model is foreign code: any failure means fall back
        return None, f"model failed: {type(exc).__name__}: {exc}"
    return check_scores(raw, len(candidates))


def _sample(cycle: _Cycle, task: Task, demand: FloatArray) -> tuple[NodeTable, int, BoolArray]:
    """What ``task`` is filtered and scored over: a table, the row of the cycle's table its
    first row is, and the nodes of it passing the filter chain.

    The whole table; or, when the policy's ``score_nodes`` is set and the table holds more
    than twice that many nodes, the smallest window of consecutive rows found holding that
    many feasible nodes: it starts where the task's id hashes (so tasks spread over the
    fleet, the same way on every replica and every run) and grows by the density of
    feasible nodes it has seen, up to the whole table. A task is placed if any node fits
    either way: the sample only bounds how many are compared."""
    table = cycle.table
    want = cycle.policy.score_nodes
    n = len(table)
    static = cycle.static(task, demand)
    if want == 0 or n <= 2 * want:
        return table, 0, FILTER_CHAIN.feasible(table, task, demand, static)
    size = want
    lo = zlib.crc32(task.id.encode()) % (n - size + 1)
    while True:
        hi = min(lo + size, n)
        lo = hi - size
        window = table.window(lo, hi)
        feasible = FILTER_CHAIN.feasible(window, task, demand, static[lo:hi])
        found = int(np.count_nonzero(feasible))
        if found >= want:
            return window, lo, feasible
        grown = 4 * size if found == 0 else math.ceil(size * want * 1.1 / found)
        size = max(grown, size + 1)
        if size >= n:  # the whole table after all: no sample
            return table, 0, FILTER_CHAIN.feasible(table, task, demand, static)


def _place(cycle: _Cycle, task: Task) -> bool:
    table = cycle.table
    demand = resource_vector(task.demand)
    scored, offset, feasible = _sample(cycle, task, demand)
    spread = cycle.spread(task)
    spread_part: FloatArray | None = None
    if spread is not None:  # a service's replica: its per-node bound, its domains' spread
        feasible = feasible & spread[0][offset : offset + len(scored)]
        spread_part = spread[1][offset : offset + len(scored)]
    if not feasible.any():
        return False
    candidates = np.flatnonzero(feasible)  # rows of ``scored``; of ``table``: + offset
    reason = f"{cycle.policy.mode.value}: best of {len(candidates)} feasible nodes"
    if scored is not table:
        reason += f" (a sample of {len(scored)} of {len(table)} nodes)"
    if spread_part is not None and cycle.groups[task.id].across:
        # the learned model knows nothing of services: it chooses among the emptiest domains
        best_spread = spread_part[candidates].max()
        if cycle.policy.mode is PolicyMode.LEARNED:
            candidates = candidates[spread_part[candidates] >= best_spread - _EPS]
        reason += ", spread across " + ", ".join(cycle.groups[task.id].across)
    if cycle.policy.mode is PolicyMode.LEARNED:
        learned, why = _learned_score(cycle, task, demand, candidates + offset)
        if learned is not None:
            best = int(np.argmax(learned))  # ties: the first, i.e. the lowest row
            row = int(candidates[best]) + offset
            cycle.bind(row, task)
            cycle.decisions.append(
                Decision(
                    DecisionKind.PLACE,
                    table.nodes[row].id,
                    reason,
                    cycle.now,
                    task_id=task.id,
                    image=task.image_for(table.nodes[row].arch),
                    scores={"learned": float(learned[best])},
                )
            )
            return True
        reason = f"learned score unavailable ({why}); energy heuristic: " + reason
    total, parts = _weighted_score(cycle.policy, scored, task, demand)
    if spread_part is not None and cycle.groups[task.id].across:
        parts["spread"] = spread_part
        total = total + SPREAD_WEIGHT * spread_part
    local = int(candidates[int(np.argmax(total[candidates]))])
    row = local + offset
    node = table.nodes[row]
    scores = {name: float(values[local]) for name, values in parts.items()}
    scores["total"] = float(total[local])
    if cycle.policy.mode is PolicyMode.LEARNED:
        scores["learned_fallback"] = 1.0
    cycle.bind(row, task)
    cycle.decisions.append(
        Decision(
            DecisionKind.PLACE,
            node.id,
            reason,
            cycle.now,
            task_id=task.id,
            image=task.image_for(node.arch),
            scores=scores,
        )
    )
    return True


def _victims_on(
    cycle: _Cycle, row: int, task: Task, demand: FloatArray, prio: int
) -> tuple[tuple[int, int, float], list[Placement]] | None:
    """The cheapest set of evictions on node ``row`` that makes ``task`` fit, or None."""
    table = cycle.table
    cpu_per, mem_per = table.reserve_per_accel

    def short(freed: FloatArray) -> bool:
        after = table.used[row] + demand - freed
        missing = after - table.capacity[row]
        if demand[2] <= 0:  # leave the accelerator reserve, as placement does
            free_acc = max(float(table.capacity[row, 2] - after[2]), 0.0)
            missing[0] += cpu_per * free_acc
            missing[1] += mem_per * free_acc
        return bool(np.any(missing > _EPS))

    if not short(np.zeros_like(demand)):
        return (0, 0, 0.0), []
    preemptor_boosted = prio > MAX_PRIORITY
    evictable: list[tuple[int, float, str, Placement]] = []
    for placement in cycle.on_node[row]:
        victim = placement.task
        if not victim.preemptible:
            continue
        vprio = cycle.effective_priority(victim, adding=False)
        if vprio >= prio:
            continue
        if not cycle.policy.priority_preemption and not (
            preemptor_boosted and vprio <= MAX_PRIORITY
        ):
            continue  # without priority preemption only tidal reclaim may evict
        evictable.append((vprio, -placement.started_at, victim.id, placement))
    evictable.sort(key=lambda e: e[:3])
    chosen: list[Placement] = []
    freed = np.zeros_like(demand)
    worst = -1
    for vprio, _, _, placement in evictable:
        if len(chosen) >= cycle.policy.max_preemptions_per_task:
            return None
        chosen.append(placement)
        freed += resource_vector(placement.task.demand)
        worst = max(worst, vprio)
        if not short(freed):
            cost = (worst, len(chosen), float(sum(p.task.demand.cpu for p in chosen)))
            return cost, chosen
    return None


def _preempt(cycle: _Cycle, task: Task) -> bool:
    prio = cycle.effective_priority(task, adding=True)
    if not cycle.policy.priority_preemption and prio <= MAX_PRIORITY:
        return False
    table = cycle.table
    demand = resource_vector(task.demand)
    eligible = cycle.eligible(task, demand) & fits_when_empty(table, demand)
    spread = cycle.spread(task)
    if spread is not None:  # (a replica's per-node bound holds for preemption too)
        eligible &= spread[0]
    candidates = np.flatnonzero(eligible)
    best: tuple[tuple[int, int, float], int, list[Placement]] | None = None
    for candidate in candidates.tolist():
        found = _victims_on(cycle, candidate, task, demand, prio)
        if found is not None and (best is None or (found[0], candidate) < (best[0], best[1])):
            best = (found[0], candidate, found[1])
    if best is None:
        return False
    _, row, victims = best
    node_id = table.nodes[row].id
    for placement in victims:
        vprio = cycle.effective_priority(placement.task, adding=False)
        cycle.unbind(row, placement)
        cycle.decisions.append(
            Decision(
                DecisionKind.PREEMPT,
                node_id,
                f"preempted for {task.id} (effective priority {vprio} < {prio})",
                cycle.now,
                task_id=placement.task.id,
                scores={"victim_priority": float(vprio), "preemptor_priority": float(prio)},
            )
        )
    cycle.bind(row, task)
    cycle.decisions.append(
        Decision(
            DecisionKind.PLACE,
            node_id,
            f"placed by preempting {len(victims)} task(s) of lower effective priority",
            cycle.now,
            task_id=task.id,
            image=task.image_for(table.nodes[row].arch),
            scores={"effective_priority": float(prio), "victims": float(len(victims))},
        )
    )
    return True


# --- power: wake, consolidate, park ---------------------------------------------------------


def _wake(cycle: _Cycle, row: int, reason: str, scores: Mapping[str, float]) -> None:
    cycle.table.set_state(row, NodeState.WAKING)
    cycle.decisions.append(
        Decision(
            DecisionKind.WAKE, cycle.table.nodes[row].id, reason, cycle.now, scores=dict(scores)
        )
    )


def _wake_order(cycle: _Cycle) -> list[int]:
    """Parked rows, most efficient first (general-purpose servers before scarce ones)."""
    table = cycle.table
    parked = np.flatnonzero(table.state == STATE_CODES[NodeState.PARKED])
    general = CLASS_CODES[ServerClass.GENERAL]
    return sorted(
        (int(r) for r in parked),
        key=lambda r: (table.server_class[r] != general, -table.efficiency[r], r),
    )


def _wake_for_waiting(cycle: _Cycle, waiting: Sequence[Task]) -> None:
    """Wake parked nodes that could host tasks nothing awake can take."""
    table = cycle.table
    waking = table.state == STATE_CODES[NodeState.WAKING]
    reserved = table.used.copy()  # capacity promised on waking nodes this cycle
    for task in waiting:
        demand = resource_vector(task.demand)
        # The chain's static stages only: parked nodes fail node_ready until they wake, and
        # capacity is counted against what this cycle already promised the waking ones.
        static = cycle.static(task, demand)
        fits = np.all(reserved + demand <= table.capacity + _EPS, axis=1)
        incoming = np.flatnonzero(waking & static & fits)
        if len(incoming):
            reserved[int(incoming[0])] += demand
            continue
        for row in _wake_order(cycle):
            if static[row] and bool(fits[row]):
                _wake(
                    cycle,
                    row,
                    f"wake for waiting task {task.id}",
                    {"efficiency": float(table.efficiency[row])},
                )
                waking[row] = True
                reserved[row] += demand
                break


def reclaimable_cpu(cycle: _Cycle, waiting: Sequence[Task]) -> float:
    """CPU of running preemptible work that the core could really evict for more important
    work: work of lower effective priority than some waiting task, or than some running task
    (a class that runs now is the work the forecast expects more of). Nothing when the
    policy does not preempt by priority, or when nothing outranks anything (a fleet of
    equal priorities evicts nothing, so its preemptible work is no spare)."""
    if not cycle.policy.priority_preemption:
        return 0.0
    # One pass over what runs (central's fleet runs a million tasks): a running task's tidal
    # boost depends on its class only, and its preemptible CPU is summed per rank.
    boost: dict[str, int] = {}
    by_rank: dict[int, float] = {}
    top = -1
    for placements in cycle.on_node:
        for p in placements:
            t = p.task
            extra = boost.get(t.workload)
            if extra is None:
                extra = boost[t.workload] = TIDAL_BOOST if cycle.in_share(t.workload) else 0
            rank = t.priority + extra
            top = max(top, rank)
            if t.preemptible:
                by_rank[rank] = by_rank.get(rank, 0.0) + t.demand.cpu
    for t in waiting:
        top = max(top, cycle.effective_priority(t, adding=True))
    return sum(cpu for rank, cpu in by_rank.items() if rank < top)


def _headroom_target(
    cycle: _Cycle, forecast_cpu: float | None, waiting: Sequence[Task] = ()
) -> float:
    """CPU to keep awake: the forecast peak, plus spare for bursts of work that cannot wait.

    Running preemptible work needs no spare of its own only where more important work could
    evict it at once (:func:`reclaimable_cpu`): the spare fraction covers the rest of the
    running work and the forecast growth. Work that waits now counts in the demand too.
    """
    used = cycle.used_cpu()
    queued = sum(t.demand.cpu for t in waiting)
    demand = max(forecast_cpu or 0.0, used + queued)
    firm = demand - reclaimable_cpu(cycle, waiting)
    return demand + cycle.policy.spare_cpu_fraction * firm + cycle.policy.min_spare_cpu


def _accel_target(
    cycle: _Cycle, forecast_accel: float | None, waiting: Sequence[Task] = ()
) -> float:
    """Accelerators to keep awake: the forecast peak of accelerators asked (or what runs and
    waits, when it is higher), rounded up. Accelerator servers wake in minutes, and work
    that asks accelerators runs nowhere else: without this, the CPU target let the last one
    be parked between two short accelerator tasks, and the next waited for its wake-up."""
    used = float(cycle.table.used[:, 2].sum())
    queued = float(sum(t.demand.accel for t in waiting))
    return float(math.ceil(max(forecast_accel or 0.0, used + queued) - 1e-6))


def _wake_for_accel(cycle: _Cycle, target: float) -> None:
    table = cycle.table
    awake = cycle.awake_accel()
    for row in _wake_order(cycle):
        if awake >= target:
            return
        if table.capacity[row, 2] <= 0:
            continue
        _wake(
            cycle,
            row,
            f"forecast needs {target:.0f} accelerators awake, {awake:.0f} are",
            {"target_accel": target, "awake_accel": awake},
        )
        awake += float(table.capacity[row, 2])


def _wake_for_forecast(cycle: _Cycle, target: float) -> None:
    awake = cycle.awake_cpu()
    for row in _wake_order(cycle):
        if awake >= target:
            return
        _wake(
            cycle,
            row,
            f"forecast needs {target:.0f} cores awake, {awake:.0f} are",
            {"target_cpu": target, "awake_cpu": awake},
        )
        awake += float(cycle.table.capacity[row, 0])


def _consolidate(cycle: _Cycle, target: float, accel_target: float = 0.0) -> None:
    """Move migratable work off lightly used nodes so they can be parked, the least used
    first. A node is a destination unless it is being emptied or was emptied this cycle;
    one that took work this cycle is no longer emptied (so nothing moves twice, and when
    every node is lightly used the work gathers on some of them)."""
    table = cycle.table
    budget = cycle.policy.max_migrations_per_cycle
    if budget == 0:
        return
    util = table.cpu_utilization()
    active = table.active_mask()
    sources = [
        int(r)
        for r in np.flatnonzero(active & (util > 0) & (util < cycle.policy.consolidate_below))
        if all(p.task.migratable for p in cycle.on_node[int(r)])
    ]
    sources.sort(key=lambda r: (util[r], table.efficiency[r], r))
    emptied: set[int] = set()
    received: set[int] = set()
    awake = cycle.awake_cpu()
    awake_accel = cycle.awake_accel()
    for src in sources:
        if src in received:
            continue
        moves = sorted(cycle.on_node[src], key=lambda p: p.task.id)
        if len(moves) > budget or awake - table.capacity[src, 0] < target:
            continue
        if table.capacity[src, 2] > 0 and awake_accel - table.capacity[src, 2] < accel_target:
            continue
        plan: list[tuple[Placement, int]] = []
        extra = np.zeros_like(table.used)
        for placement in moves:
            demand = resource_vector(placement.task.demand)
            ok = cycle.eligible(placement.task, demand)
            ok &= np.all(table.used + extra + demand <= table.capacity + _EPS, axis=1)
            ok[[src, *emptied]] = False
            rows = np.flatnonzero(ok)
            if not len(rows):
                break
            fill = (table.used[rows, 0] + extra[rows, 0]) / table.capacity[rows, 0]
            score = fill + 0.5 * table.efficiency[rows] / max(float(table.efficiency.max()), _EPS)
            dst = int(rows[int(np.argmax(score))])
            extra[dst] += demand
            plan.append((placement, dst))
        if len(plan) != len(moves):
            continue
        for placement, dst in plan:
            cycle.unbind(src, placement)
            cycle.bind(dst, placement.task)
            cycle.decisions.append(
                Decision(
                    DecisionKind.MIGRATE,
                    table.nodes[dst].id,
                    f"consolidate: drain {table.nodes[src].id} at {util[src]:.0%} CPU to park it",
                    cycle.now,
                    task_id=placement.task.id,
                    from_node=table.nodes[src].id,
                    scores={"source_util": float(util[src])},
                )
            )
            received.add(dst)
        budget -= len(plan)
        emptied.add(src)
        awake -= float(table.capacity[src, 0])
        awake_accel -= float(table.capacity[src, 2])


def _park(cycle: _Cycle, target: float, accel_target: float = 0.0) -> None:
    table = cycle.table
    awake = cycle.awake_cpu()
    awake_accel = cycle.awake_accel()
    idle_after = cycle.policy.park_idle_after_s
    candidates: list[int] = []
    for r in np.flatnonzero(table.active_mask()).tolist():
        node = table.nodes[r]
        if cycle.on_node[r] or r in cycle.touched:
            continue
        if node.idle_since is None or cycle.now - node.idle_since < idle_after:
            continue
        candidates.append(r)
    candidates.sort(key=lambda r: (table.efficiency[r], r))
    for row in candidates:
        cap = float(table.capacity[row, 0])
        accel = float(table.capacity[row, 2])
        if awake - cap < target or (accel > 0 and awake_accel - accel < accel_target):
            continue
        table.set_state(row, NodeState.PARKED)
        awake -= cap
        awake_accel -= accel
        cycle.decisions.append(
            Decision(
                DecisionKind.PARK,
                table.nodes[row].id,
                f"idle; {awake:.0f} cores stay awake for a forecast need of {target:.0f}",
                cycle.now,
                scores={"efficiency": float(table.efficiency[row]), "target_cpu": target},
            )
        )


# --- pin ------------------------------------------------------------------------------------


def affinity_demand(task: Task, max_threads: int | None = None) -> AffinityDemand:
    """A task's threads for the affinity planner: ``threads`` (or its whole cores) sharing
    its CPU demand evenly, never more than one core per thread. ``max_threads`` (the node's
    core count) caps them: more threads than cores pin no differently, and the planner's
    cost grows with every one (10,000 threads stalled an edge node's loop for seconds)."""
    threads = max(task.threads, math.ceil(task.demand.cpu - 1e-9), 1)
    if max_threads is not None:
        threads = max(1, min(threads, max_threads))
    load = min(task.demand.cpu / threads, 1.0) if task.demand.cpu > 0 else 0.01
    return AffinityDemand(task.id, (max(load, 0.01),) * threads)


def _pin(cycle: _Cycle, pins: Mapping[str, frozenset[int]]) -> None:
    for row in sorted(cycle.touched):
        node = cycle.table.nodes[row]
        tasks = sorted((p.task for p in cycle.on_node[row]), key=lambda t: t.id)
        if node.topology is None or not tasks:
            continue
        existing = {t.id: pins[t.id] for t in tasks if t.id in pins}
        cores = len(node.topology.cores)
        demands = [affinity_demand(t, cores) for t in tasks]
        plan = plan_affinity(node.topology, demands, existing)
        for decision in to_pin_decisions(node.id, plan, cycle.now):
            if frozenset(decision.cores) != existing.get(decision.task_id or ""):
                cycle.decisions.append(decision)


# --- entry point ----------------------------------------------------------------------------


def _start(view: ClusterView, policy: PolicyConfig) -> _Cycle:
    """A cycle's working state as its first task sees it."""
    reserve = (policy.accel_reserve_cpu, policy.accel_reserve_mem_gib)
    if view.table is not None:
        table = view.table.fork(reserve)
    else:
        table = NodeTable.build(view.nodes, view.placements, reserve)
    fleet_cpu = float(table.capacity[:, 0].sum())
    shares = policy.tidal.shares_at(view.now)
    cycle = _Cycle(
        policy=policy,
        now=view.now,
        table=table,
        on_node=table.on_node,  # unordered: every consumer sorts what it iterates
        usage=table.usage,
        guarantee={name: share * fleet_cpu for name, share in shares.items()},
    )
    if not policy.parks_nodes:
        for row in _wake_order(cycle):
            _wake(cycle, row, f"mode {policy.mode.value} keeps every node awake", {})
    return cycle


def feasible_nodes(view: ClusterView, task: Task, policy: PolicyConfig) -> frozenset[str]:
    """Ids of the nodes the filter stage of a cycle over ``view`` lets ``task`` onto, as the
    first task of that cycle (nothing placed yet)."""
    cycle = _start(view, policy)
    rows = np.flatnonzero(cycle.feasible(task, resource_vector(task.demand)))
    return frozenset(cycle.table.nodes[int(r)].id for r in rows)


def schedule(
    view: ClusterView,
    pending: Sequence[Task],
    policy: PolicyConfig,
    groups: Mapping[str, SpreadGroup] | None = None,
) -> ScheduleResult:
    """Decide for one cycle. Pure: the same arguments always give the same result.
    ``groups``: task id -> the spread of the service a pending task is a replica of."""
    cycle = _start(view, policy)
    if groups:
        cycle.groups = groups
    table = cycle.table
    waiting: dict[str, str] = {}
    waiting_tasks: list[Task] = []
    seen: set[str] = set()
    failed: dict[tuple[object, ...], tuple[int, str]] = {}  # shape -> (version, reason)
    for task in sorted(pending, key=_queue_key(policy)):
        if task.id in seen:
            raise ValueError(f"task {task.id} is pending twice")
        seen.add(task.id)
        d = task.demand
        shape = (
            FILTER_CHAIN.static_key(task),
            (d.cpu, d.mem_gib, d.accel, d.iops_k),
            cycle.effective_priority(task, adding=True),
            task.workload,
            None if groups is None or task.id not in groups else groups[task.id].name,
        )
        known = failed.get(shape)
        if known is not None and known[0] == cycle.version:
            waiting[task.id] = known[1]  # nothing changed since the same shape failed
        elif _place(cycle, task) or _preempt(cycle, task):
            continue
        else:
            waiting[task.id] = FILTER_CHAIN.explain(table, task, resource_vector(task.demand))
            group = cycle.groups.get(task.id)
            if group is not None and group.max_per_node:
                waiting[task.id] += (
                    f"; service {group.name} runs at most {group.max_per_node} a node"
                )
            failed[shape] = (cycle.version, waiting[task.id])
        waiting_tasks.append(task)

    if policy.parks_nodes and view.plan_power:
        _wake_for_waiting(cycle, waiting_tasks)
        target = _headroom_target(cycle, view.forecast_cpu, waiting_tasks)
        _wake_for_forecast(cycle, target)
        accel_target = _accel_target(cycle, view.forecast_accel, waiting_tasks)
        _wake_for_accel(cycle, accel_target)
        if view.forecast_ready:  # a safe start: nothing parked before the forecast has data
            _consolidate(cycle, target, accel_target)
            _park(cycle, target, accel_target)
    if view.pin_cores:
        _pin(cycle, view.pins)
    return ScheduleResult(tuple(cycle.decisions), waiting)


class Scheduler:
    """A scheduler bound to a policy; switch modes at run time with :meth:`with_policy`."""

    def __init__(self, policy: PolicyConfig | None = None) -> None:
        self.policy = policy or PolicyConfig()

    def with_policy(self, policy: PolicyConfig) -> Scheduler:
        return Scheduler(policy)

    def schedule(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        return schedule(view, pending, self.policy)
