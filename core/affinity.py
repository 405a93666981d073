"""Per-core CPU affinity planning: which cores of one node each task's threads are pinned to.

Role: given a node's :class:`~edgesched.core.model.CoreTopology` and the per-thread CPU load of
the tasks placed on it, :func:`plan_affinity` returns an :class:`AffinityPlan` that spreads the
load evenly over the cores (low per-core utilization spread, no overloaded core) while keeping
each task's threads inside one core cluster (ARM cluster / NUMA node) when they fit there, for
cache and memory locality. :func:`to_pin_decisions` turns a plan into PIN decisions.

Algorithm (deterministic; ties broken by task id, thread index and core id):

1. *Cluster choice.* Pinned tasks (see churn below) stay in their pins; tasks that fit no
   cluster even when empty (more threads than cores, or more load) may use any core. Every
   other task, largest total load first, goes to the cluster with the lowest projected
   utilization among those with enough cores for its threads and enough unclaimed capacity;
   if none has room it may use any core. A multi-thread task is then bound to its cluster
   (a single-thread one only starts there: it has no locality to lose).
2. *LPT.* In that order (pinned, node-wide, clustered, leftovers), threads largest first go to
   the least-loaded core of their pin / cluster / the node.
3. *Local search.* Repeatedly take the hottest core that can improve and move one thread to,
   or swap one pair with, a colder core when that lowers the sum of squared core loads (so
   both spread and peak shrink), keeping bound tasks in their cluster.
4. *Locality is a preference.* The search is rerun with cluster bindings lifted (pins still
   hold); that relaxed plan is used only if it lowers the per-core std by more than
   ``LOCALITY_MARGIN`` or relieves an overloaded core (load > 1), else locality is kept.

Pure functions and frozen dataclasses; no I/O. :func:`naive_plan`, :func:`simulate_throughput`
and :func:`arm48_experiment` reproduce the source article's 48-core ARM comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from edgesched.core.model import CoreTopology, Decision, DecisionKind

EPS = 1e-9
#: Existing pins are given up only when re-planning lowers the per-core std by more than this.
CHURN_MARGIN = 0.02
#: Local-search steps must lower the sum of squared core loads by more than this.
MIN_GAIN = 1e-4
#: Cluster locality is given up only when that lowers the per-core std by more than this (or
#: relieves an overloaded core).
LOCALITY_MARGIN = 0.01


@dataclass(frozen=True, slots=True)
class AffinityDemand:
    """A task's threads; each float is one thread's CPU load in cores, in (0, 1]."""

    task_id: str
    threads: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.task_id:
            raise ValueError("affinity demand: task id must not be empty")
        if not self.threads:
            raise ValueError(f"task {self.task_id}: needs at least one thread")
        for i, load in enumerate(self.threads):
            if not 0.0 < load <= 1.0:  # also rejects NaN
                raise ValueError(
                    f"task {self.task_id}: thread {i} load must be in (0, 1] cores, got {load}"
                )

    @property
    def load(self) -> float:
        return math.fsum(self.threads)


@dataclass(frozen=True, slots=True)
class AffinityPlan:
    """Where every thread runs.

    ``assignments`` maps a task to the sorted cores it is pinned to (the cores its threads run
    on, or its unchanged existing pin when the planner kept it, see ``kept``);
    ``thread_cores`` maps a task to the core of each of its threads (index-aligned with
    :attr:`AffinityDemand.threads`); ``core_load`` is the summed thread load of every core of
    the topology, in topology order.
    """

    assignments: Mapping[str, tuple[int, ...]]
    thread_cores: Mapping[str, tuple[int, ...]]
    core_load: Mapping[int, float]
    kept: frozenset[str] = field(default_factory=frozenset)

    def utilization(self) -> tuple[float, ...]:
        """Per-core utilization ``min(load, 1)`` in topology order."""
        return tuple(min(load, 1.0) for load in self.core_load.values())

    def std(self) -> float:
        """Population std of per-core utilization as a fraction (0.09 = 9%)."""
        util = self.utilization()
        return float(np.std(util)) if util else 0.0

    def max_load(self) -> float:
        """The most loaded core's load (> 1 means that core is overcommitted)."""
        return max(self.core_load.values(), default=0.0)


def _validate(topology: CoreTopology, demands: Sequence[AffinityDemand]) -> None:
    if not topology.cores:
        raise ValueError("affinity planning needs a topology with at least one core")
    seen: set[str] = set()
    for d in demands:
        if d.task_id in seen:
            raise ValueError(f"duplicate task id {d.task_id!r} in affinity demands")
        seen.add(d.task_id)


def _build(
    topology: CoreTopology,
    demands: Sequence[AffinityDemand],
    placed: Sequence[Sequence[int]],
    pins: Mapping[str, frozenset[int]],
) -> AffinityPlan:
    cores = topology.cores
    loads = dict.fromkeys(cores, 0.0)
    assignments: dict[str, tuple[int, ...]] = {}
    thread_cores: dict[str, tuple[int, ...]] = {}
    for d, idxs in zip(demands, placed, strict=True):
        tc = tuple(cores[i] for i in idxs)
        thread_cores[d.task_id] = tc
        pin = pins.get(d.task_id)
        assignments[d.task_id] = tuple(sorted(pin if pin is not None else set(tc)))
        for core, load in zip(tc, d.threads, strict=True):
            loads[core] += load
    kept = frozenset(t for t in pins if t in assignments)
    return AffinityPlan(assignments, thread_cores, loads, kept)


def _refine(
    loads: list[float],
    on_core: list[list[int]],
    placed: list[int],
    tload: Sequence[float],
    tallow: Sequence[frozenset[int] | None],
    core_ids: Sequence[int],
    max_steps: int,
) -> None:
    """Local search in place over threads ``0..m-1`` (load ``tload``, allowed cores ``tallow``).

    Moving load ``d`` from a core ``gap`` hotter lowers the sum of squared loads by
    ``2d(gap - d)``. Each step takes the hottest core that can improve, its coldest partner
    that admits an improving exchange, and applies the pair's best move or swap; steps gaining
    less than ``MIN_GAIN`` are not taken. A core found to have no improving exchange is only
    re-checked against the cores that changed since.
    """

    def exchange(h: int, lo: int) -> tuple[int, int]:
        gap = loads[h] - loads[lo]
        best, best_a, best_b = MIN_GAIN, -1, -1
        for a in on_core[h]:
            fa = tallow[a]
            if fa is not None and lo not in fa:
                continue
            la = tload[a]
            if la < gap and 2 * la * (gap - la) > best:
                best, best_a, best_b = 2 * la * (gap - la), a, -1
            for b in on_core[lo]:
                d = la - tload[b]
                if 0 < d < gap and 2 * d * (gap - d) > best:
                    fb = tallow[b]
                    if fb is None or h in fb:
                        best, best_a, best_b = 2 * d * (gap - d), a, b
        return best_a, best_b

    n = len(loads)
    changed = [0] * n  # step after which each core last changed
    verified = [-1] * n  # step at which a core last had no improving exchange
    log: list[tuple[int, int]] = []  # the two cores each step changed
    for step in range(max_steps):
        order = sorted(range(n), key=lambda i: (-loads[i], core_ids[i]))
        move = None
        for h in order:
            if len(on_core[h]) < 2:  # a lone thread can neither move nor swap usefully
                continue
            partners: Iterable[int] = reversed(order)  # coldest first
            if verified[h] >= changed[h]:  # only pairs with cores changed since can improve
                since = {c for pair in log[verified[h] :] for c in pair}
                partners = sorted(since, key=lambda i: (loads[i], -core_ids[i]))
            for lo in partners:
                if loads[lo] >= loads[h] - EPS:
                    break
                a, b = exchange(h, lo)
                if a >= 0:
                    move = (h, lo, a, b)
                    break
            if move is not None:
                break
            verified[h] = step
        if move is None:
            return
        h, lo, a, b = move
        on_core[h].remove(a)
        on_core[lo].append(a)
        placed[a] = lo
        shift = tload[a]
        if b >= 0:
            on_core[lo].remove(b)
            on_core[h].append(b)
            placed[b] = h
            shift -= tload[b]
        loads[h] -= shift
        loads[lo] += shift
        changed[h] = changed[lo] = step + 1
        log.append((h, lo))


def _plan(
    topology: CoreTopology,
    demands: Sequence[AffinityDemand],
    pins: Mapping[str, frozenset[int]],
    locality_margin: float,
) -> AffinityPlan:
    cores = topology.cores
    n = len(cores)
    index = {c: i for i, c in enumerate(cores)}
    clusters = [tuple(index[c] for c in cl) for cl in topology.clusters]
    # where each task's threads start (a core list) and may later move (None = any core)
    start: list[Sequence[int]] = [range(n)] * len(demands)
    allowed: list[frozenset[int] | None] = [None] * len(demands)
    loads = [0.0] * n
    on_core: list[list[int]] = [[] for _ in range(n)]
    threads: list[tuple[int, int]] = []  # (task, thread) of each flat thread id
    placed: list[int] = []

    def place(tasks: Iterable[int]) -> None:
        """LPT: the tasks' threads, largest first, each onto its least-loaded start core."""
        batch = sorted(
            ((k, j) for k in tasks for j in range(len(demands[k].threads))),
            key=lambda t: (-demands[t[0]].threads[t[1]], demands[t[0]].task_id, t[1]),
        )
        for k, j in batch:
            c = min(start[k], key=lambda i: (loads[i], cores[i]))
            loads[c] += demands[k].threads[j]
            on_core[c].append(len(threads))
            threads.append((k, j))
            placed.append(c)

    # 1. pinned tasks in their pins, then tasks too big for any cluster over the whole node
    by_load = sorted(range(len(demands)), key=lambda k: (-demands[k].load, demands[k].task_id))
    pinned = [k for k in by_load if demands[k].task_id in pins]
    for k in pinned:
        start[k] = sorted(index[c] for c in pins[demands[k].task_id])
        allowed[k] = frozenset(start[k])
    rest = [k for k in by_load if demands[k].task_id not in pins]
    big = [
        k
        for k in rest
        if not any(
            len(demands[k].threads) <= len(c) and demands[k].load <= len(c) for c in clusters
        )
    ]
    place(pinned)
    place(big)
    skip = set(big)
    # 2. every other task, largest first, to the cluster it fits with the lowest utilization
    claimed = [math.fsum(loads[i] for i in cl) for cl in clusters]
    homed, late = [], []
    for k in rest:
        d = demands[k]
        if k in skip:
            continue
        fits = [
            ((claimed[ci] + d.load) / len(cl), ci)
            for ci, cl in enumerate(clusters)
            if len(d.threads) <= len(cl) and claimed[ci] + d.load <= len(cl) + EPS
        ]
        if not fits:
            late.append(k)
            continue
        ci = min(fits)[1]
        claimed[ci] += d.load
        start[k] = clusters[ci]
        if len(d.threads) > 1:  # a single thread keeps its locality wherever it goes
            allowed[k] = frozenset(clusters[ci])
        homed.append(k)
    place(homed)
    place(late)
    tload = [demands[k].threads[j] for k, j in threads]
    tallow = [allowed[k] for k, _ in threads]

    def build() -> AffinityPlan:
        per_task = [[0] * len(d.threads) for d in demands]
        for (k, j), c in zip(threads, placed, strict=True):
            per_task[k][j] = c
        return _build(topology, demands, per_task, pins)

    # 3. local search, then again with cluster locality relaxed (pins still hold)
    max_steps = 50 + 10 * len(threads)
    _refine(loads, on_core, placed, tload, tallow, cores, max_steps)
    local = build()
    relaxed_allow = [
        fa if demands[k].task_id in pins else None
        for (k, _), fa in zip(threads, tallow, strict=True)
    ]
    if relaxed_allow == tallow or math.isinf(locality_margin):
        return local
    _refine(loads, on_core, placed, tload, relaxed_allow, cores, max_steps)
    relaxed = build()
    return relaxed if _clearly_better(relaxed, local, locality_margin) else local


def _clearly_better(new: AffinityPlan, old: AffinityPlan, margin: float) -> bool:
    """``new`` lowers the per-core std by more than ``margin`` or relieves an overloaded core."""
    relieves = old.max_load() > 1.0 + EPS and new.max_load() < old.max_load() - EPS
    return relieves or new.std() < old.std() - margin


def plan_affinity(
    topology: CoreTopology,
    demands: Sequence[AffinityDemand],
    existing: Mapping[str, frozenset[int]] | None = None,
    *,
    churn_margin: float = CHURN_MARGIN,
    locality_margin: float = LOCALITY_MARGIN,
) -> AffinityPlan:
    """Plan per-core affinity for ``demands`` on ``topology`` (see the module docstring).

    ``existing`` holds the current pins of tasks already running (entries for tasks not in
    ``demands`` are ignored). Churn rule: the planner builds a *stable* plan, in which every
    pinned task keeps its pin (its threads are balanced inside it) and only the others are
    placed freely, and a *fresh* plan that ignores the pins. It returns the stable plan unless
    the fresh one lowers the per-core std by more than ``churn_margin`` (default 2 points), or
    the stable plan overloads a core (load > 1) and the fresh one lowers the peak load.
    ``locality_margin`` is step 4's margin; ``math.inf`` keeps cluster locality even when
    that leaves a core overloaded.
    """
    _validate(topology, demands)
    valid = set(topology.cores)
    pins: dict[str, frozenset[int]] = {}
    for d in demands:
        pin = (existing or {}).get(d.task_id)
        if pin is None:
            continue
        if not pin or not pin <= valid:
            raise ValueError(
                f"task {d.task_id}: existing pin {sorted(pin)} must be a non-empty set of "
                "cores of the topology"
            )
        pins[d.task_id] = frozenset(pin)
    fresh = _plan(topology, demands, {}, locality_margin)
    if not pins:
        return fresh
    stable = _plan(topology, demands, pins, locality_margin)
    return fresh if _clearly_better(fresh, stable, churn_margin) else stable


def naive_plan(
    topology: CoreTopology,
    demands: Sequence[AffinityDemand],
    seed: int = 0,
    *,
    mode: Literal["block", "random"] = "block",
) -> AffinityPlan:
    """The load-blind placement a default static CPU manager produces (the baseline).

    ``block`` (default): each task, in arrival order, gets a contiguous block of as many cores
    as it has threads (at most the whole node), allocated round-robin from where the previous
    task's block ended and wrapping around the node; its threads go one per core of the block
    in order. This is how a cursor-based static allocator (or a ``taskset`` script) behaves: it
    never stacks threads while cores are free, but ignores thread loads, so once the node is
    wrapped cores get one heavy or two light threads at random. ``seed`` only picks the
    starting core (rotating the plan, which leaves its spread unchanged).

    ``random``: every thread on a uniformly random core, a harsher model of an unaware
    placement, provided for comparison.
    """
    _validate(topology, demands)
    cores = topology.cores
    n = len(cores)
    rng = np.random.default_rng(seed)
    placed: list[list[int]] = []
    cursor = int(rng.integers(n))
    for d in demands:
        if mode == "random":
            placed.append([int(i) for i in rng.integers(n, size=len(d.threads))])
            continue
        width = min(len(d.threads), n)
        placed.append([(cursor + j % width) % n for j in range(len(d.threads))])
        cursor = (cursor + width) % n
    return _build(topology, demands, placed, {})


def to_pin_decisions(node_id: str, plan: AffinityPlan, at: float) -> list[Decision]:
    """One PIN decision per task of ``plan`` (in plan order) with its cores and the spread."""
    std = plan.std()
    scores = {"core_std": std, "max_core_load": plan.max_load()}
    return [
        Decision(
            kind=DecisionKind.PIN,
            node_id=node_id,
            reason=f"affinity: spread {std * 100:.1f}%" + (" (kept)" if t in plan.kept else ""),
            at=at,
            task_id=t,
            cores=cores,
            scores=dict(scores),
        )
        for t, cores in plan.assignments.items()
    ]


def simulate_throughput(
    topology: CoreTopology, demands: Sequence[AffinityDemand], plan: AffinityPlan
) -> float:
    """Steady-state useful work per second (in cores) of ``demands`` placed by ``plan``.

    Model: a core time-shares its threads fairly, so a thread of load ``l`` on a core with total
    load ``L`` progresses at ``l / max(1, L)`` (an overcommitted core slows all its threads by
    the same factor). Each task is barrier-synchronised parallel work, so it advances at the
    pace of its slowest thread: its speed is ``min over threads of 1 / max(1, L_core)``. A
    task's work per second at full speed is its total load, so
    ``throughput = sum over tasks of speed * task load``; it equals the total load exactly when
    no core is overcommitted. Cache and cross-cluster effects are not modelled.
    """
    valid = set(topology.cores)
    total = 0.0
    for d in demands:
        tc = plan.thread_cores.get(d.task_id)
        if tc is None or len(tc) != len(d.threads) or not set(tc) <= valid:
            raise ValueError(f"plan does not place every thread of task {d.task_id!r}")
        speed = min(1.0 / max(1.0, plan.core_load[c]) for c in tc)
        total += speed * d.load
    return total


def arm48_demands(load: float = 0.7, seed: int = 0) -> list[AffinityDemand]:
    """A seeded task mix totalling ``load * 48`` cores of thread load.

    Threads per task: ``floor(Pareto(alpha=1))`` capped at 16 (half the tasks single-threaded,
    ``P(n >= k) = 1/k``). Thread load: ``0.2 * Pareto(alpha=2.5)`` capped at 1.0 (median
    0.26, mean about 0.33, 1.8% of threads at a full core). The last thread is trimmed so the
    total is exact. The achievable spread depends on this tail: with alpha=2 the near-full
    threads alone (each needs a core of its own) hold the per-core std near 10% at load 0.7
    whatever the placement.
    """
    if not 0.0 < load <= 2.0:
        raise ValueError(f"load must be in (0, 2], got {load}")
    rng = np.random.default_rng(seed)
    target = load * 48
    total = 0.0
    demands: list[AffinityDemand] = []
    while target - total > EPS:
        count = min(16, int(1.0 / (1.0 - rng.random())))
        threads: list[float] = []
        for _ in range(count):
            x = min(1.0, 0.2 * (1.0 - rng.random()) ** -0.4, target - total)
            threads.append(x)
            total += x
            if target - total <= EPS:
                break
        demands.append(AffinityDemand(f"task-{len(demands):03d}", tuple(threads)))
    return demands


def arm48_experiment(load: float = 0.7, seed: int = 0) -> dict[str, float]:
    """The source article's experiment: naive vs planned affinity on a 48-core ARM server.

    4 clusters of 12 cores, the :func:`arm48_demands` mix; the baseline is :func:`naive_plan`
    in ``block`` mode (``naive_random_*`` report the harsher ``random`` mode too).
    """
    topology = CoreTopology.uniform(48, 4)
    demands = arm48_demands(load, seed)
    naive = naive_plan(topology, demands, seed)
    planned = plan_affinity(topology, demands)
    rand = naive_plan(topology, demands, seed, mode="random")
    naive_tp = simulate_throughput(topology, demands, naive)
    planned_tp = simulate_throughput(topology, demands, planned)
    return {
        "load": load,
        "tasks": float(len(demands)),
        "threads": float(sum(len(d.threads) for d in demands)),
        "naive_std": naive.std(),
        "planned_std": planned.std(),
        "naive_random_std": rand.std(),
        "naive_max_load": naive.max_load(),
        "planned_max_load": planned.max_load(),
        "naive_throughput": naive_tp,
        "planned_throughput": planned_tp,
        "throughput_gain": planned_tp / naive_tp - 1.0,
        "naive_random_throughput": simulate_throughput(topology, demands, rand),
    }
