"""Filter and score plugins at named extension points, as in the Kubernetes scheduling framework.

A *filter* plugin returns a boolean mask over the node table: which nodes may take the task.
A *score* plugin returns a float array in [0, 1] over the node table: how much it likes each
node (higher is better). Each plugin is one pure vectorized function of (table, task, demand
vector).

:data:`FILTER_CHAIN` is the one ordered declaration of the filter stages. The scheduler, the
kube-scheduler extender and the "0/N nodes available" explanation all run it; nothing else
lists the filters. The scheduler then takes the weighted sum of the score plugins its policy
mode names and selects the best feasible node.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from edgesched.core.model import Arch, Node, Task
from edgesched.core.nodetable import (
    ARCH_CODES,
    CLASS_CODES,
    BoolArray,
    FloatArray,
    NodeTable,
    natural_class,
    power_draw,
)
from edgesched.core.slices import (
    HELD_LABEL,
    LAYOUT_LABEL,
    Request,
    fits_on_node,
    node_devices,
    parse_held_label,
)

FilterFn = Callable[[NodeTable, Task, FloatArray], BoolArray]
ScoreFn = Callable[[NodeTable, Task, FloatArray], FloatArray]

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class FilterPlugin:
    name: str
    fn: FilterFn
    #: Phrase used in "0/N nodes available: 12 <phrase>" explanations.
    why: str
    #: The stage reads only fixed node attributes (never node state or what is allocated)
    #: and the task fields its chain's ``static_key`` covers: the scheduler computes it once
    #: per key and cycle.
    static: bool = False
    #: Evicting running work can make a failing node pass (the stage reads what is
    #: allocated). Preemption searches only nodes that pass every other stage, and the
    #: extender reports failures of the other stages as unresolvable.
    resolvable: bool = False


@dataclass(frozen=True, slots=True)
class ScorePlugin:
    name: str
    fn: ScoreFn


# --- filters -------------------------------------------------------------------------------


def node_ready(table: NodeTable, task: Task, demand: FloatArray) -> BoolArray:
    return table.active_mask()


def arch_compatible(table: NodeTable, task: Task, demand: FloatArray) -> BoolArray:
    allowed = [ARCH_CODES[a] for a in Arch if task.runs_on(a)]
    mask: BoolArray = np.isin(table.arch, allowed)
    return mask


def server_class_allowed(table: NodeTable, task: Task, demand: FloatArray) -> BoolArray:
    if not task.server_classes:
        return np.ones(len(table), dtype=np.bool_)
    mask: BoolArray = np.isin(table.server_class, [CLASS_CODES[c] for c in task.server_classes])
    return mask


def resources_fit(table: NodeTable, task: Task, demand: FloatArray) -> BoolArray:
    used, cap = table.used, table.capacity
    mask: BoolArray = used[:, 0] + demand[0] <= cap[:, 0] + _EPS
    for k in _asked(demand)[1:]:
        mask &= used[:, k] + demand[k] <= cap[:, k] + _EPS
    if _slices_matter(table, task, demand):
        mask &= _slices_fit(table, task, mask)
    return mask


def _slices_matter(table: NodeTable, task: Task, demand: FloatArray) -> bool:
    """Whether the slice check can change the fit: the task asks slices, or whole devices
    where some node offers slices."""
    return bool(task.demand.accel_slices) or (demand[2] > 0 and bool(_sliced_rows(table).any()))


def _slices_fit(table: NodeTable, task: Task, candidates: BoolArray) -> BoolArray:
    """Accelerator slices (:mod:`edgesched.core.slices`): a task asking slices fits only a
    node that offers slices with one device keeping that many free; a whole-device task on a
    sliced node only where enough devices have every slice free. The node's devices are its
    capacity split evenly, and its running tasks are granted in (start, id) order by the
    same rule the node plans with (the node holds the real grants and checks again when it
    starts the task; its own core reads its uneven devices from the node's layout label and
    the grants it holds from its held label, so its view is exact). Unsliced nodes pass
    whole-device tasks as the count already did."""
    asked = slice_request(task)
    sliced = _sliced_rows(table)
    # unsliced nodes: whole devices are counted by the fit, and no slices are offered
    out: BoolArray = np.zeros(len(table), dtype=np.bool_) if asked.slices else ~sliced
    for row in np.flatnonzero(candidates & sliced):
        node = table.nodes[int(row)]
        cap = node.capacity
        running = sorted(table.on_node[int(row)], key=lambda p: (p.started_at, p.task.id))
        holders = [
            (p.task.id, slice_request(p.task))
            for p in running
            if p.task.demand.accel or p.task.demand.accel_slices
        ]
        if not asked.slices and not any(r.slices for _, r in holders):
            out[row] = True  # no slices in use: the whole-device count is exact
            continue
        labels = node.labels
        devices = node_devices(cap.accel, cap.accel_slices, labels.get(LAYOUT_LABEL))
        held = parse_held_label(labels.get(HELD_LABEL))
        out[row] = fits_on_node(devices, holders, task.id, asked, held)
    return out


#: The rows of recent tables whose nodes offer slices, by the identity of the table's node
#: tuple (forks share it; a patched table has a new one): a memo, so the fit of a task asking
#: accelerators costs no Python per node on a fleet without slices.
_SLICED_ROWS: dict[int, tuple[tuple[Node, ...], BoolArray]] = {}
_SLICED_ROWS_KEPT = 8


def _sliced_rows(table: NodeTable) -> BoolArray:
    nodes = table.nodes
    hit = _SLICED_ROWS.get(id(nodes))
    if hit is not None and hit[0] is nodes:
        return hit[1]
    rows = np.zeros(len(nodes), dtype=np.bool_)
    for row in np.flatnonzero(table.capacity[:, 2] > 0):  # only nodes with accelerators
        rows[row] = nodes[int(row)].capacity.accel_slices > 0
    while len(_SLICED_ROWS) >= _SLICED_ROWS_KEPT:
        del _SLICED_ROWS[next(iter(_SLICED_ROWS))]
    _SLICED_ROWS[id(nodes)] = (nodes, rows)
    return rows


def slice_request(task: Task) -> Request:
    """What ``task`` asks of a node's accelerators, as :func:`~edgesched.core.slices.plan`
    takes it."""
    return Request(devices=task.demand.accel, slices=task.demand.accel_slices)


def accelerator_reserve(table: NodeTable, task: Task, demand: FloatArray) -> BoolArray:
    """Work without accelerators leaves room on accelerator servers for their free
    accelerators' own CPU and memory needs (per the policy's reserve)."""
    if demand[2] > 0:
        return np.ones(len(table), dtype=np.bool_)
    cpu_per, mem_per = table.reserve_per_accel
    free_acc = np.maximum(table.capacity[:, 2] - table.used[:, 2], 0.0)
    mask: BoolArray = (
        table.used[:, 0] + demand[0] + cpu_per * free_acc <= table.capacity[:, 0] + _EPS
    )
    mask &= table.used[:, 1] + demand[1] + mem_per * free_acc <= table.capacity[:, 1] + _EPS
    return mask


# --- scores --------------------------------------------------------------------------------


def _asked(demand: FloatArray) -> list[int]:
    """Resource columns the task asks for; CPU always counts."""
    return [0] + [k for k in range(1, len(demand)) if demand[k] > 0]


def _mean_fraction_after(table: NodeTable, demand: FloatArray) -> FloatArray:
    """Per node: mean over the resources the task asks for of the allocated fraction after it."""
    columns = _asked(demand)
    total = np.zeros(len(table), dtype=np.float64)
    for k in columns:
        frac = (table.used[:, k] + demand[k]) / np.maximum(table.capacity[:, k], _EPS)
        total += np.clip(frac, 0.0, 1.0)
    mean: FloatArray = total / len(columns)
    return mean


def least_allocated(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """Prefer the emptiest nodes (spreading), on requested resources like kube-scheduler."""
    score: FloatArray = 1.0 - _mean_fraction_after(table, demand)
    return score


def most_allocated(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """Prefer the fullest nodes that still fit (bin packing, consolidation)."""
    return _mean_fraction_after(table, demand)


def balanced_allocation(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """Prefer nodes whose CPU and memory fill evenly after placement."""
    cpu = (table.used[:, 0] + demand[0]) / table.capacity[:, 0]
    mem = (table.used[:, 1] + demand[1]) / np.maximum(table.capacity[:, 1], _EPS)
    score: FloatArray = 1.0 - np.clip(np.abs(cpu - mem), 0.0, 1.0)
    return score


def energy_efficiency(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """Work per watt of the node, normalized to the fleet's best."""
    best = float(table.efficiency.max()) if len(table) else 1.0
    score: FloatArray = table.efficiency / max(best, _EPS)
    return score


def _power(table: NodeTable, extra: FloatArray | None) -> FloatArray:
    """The power model's active draw (W) per node with ``extra`` allocated on top:
    :func:`~edgesched.core.nodetable.power_draw`, CPU and accelerators apart where the
    node's model splits them."""
    used = table.used if extra is None else table.used + extra
    cpu = used[:, 0] / table.capacity[:, 0]
    acc = used[:, 2] / np.maximum(table.capacity[:, 2], 1.0)
    return power_draw(table.idle_w, table.peak_w, table.accel_dyn_w, cpu, acc)


def marginal_power(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """Prefer the node where the task adds the fewest watts.

    The added draw is the power model's draw after the task less before it (per resource:
    CPU work on an accelerator server adds CPU watts only; a model that does not split
    counts the larger of CPU and accelerator allocation, so there CPU work on a node whose
    accelerators already drive its utilization costs nothing extra), plus the node's idle
    power if it runs nothing yet (an empty node could be parked instead).
    """
    added = _power(table, demand) - _power(table, None)
    added = added + np.where(table.used[:, 0] <= _EPS, table.idle_w, 0.0)
    worst = float(added.max()) if len(table) else 0.0
    score: FloatArray = 1.0 - added / max(worst, _EPS)
    return score


def class_fit(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """1 on the task's natural server class, 0 elsewhere: keeps accelerators and NVMe free."""
    score: FloatArray = (table.server_class == CLASS_CODES[natural_class(task)]).astype(np.float64)
    return score


SCORES: Mapping[str, ScorePlugin] = {
    p.name: p
    for p in (
        ScorePlugin("least_allocated", least_allocated),
        ScorePlugin("most_allocated", most_allocated),
        ScorePlugin("balanced_allocation", balanced_allocation),
        ScorePlugin("energy_efficiency", energy_efficiency),
        ScorePlugin("class_fit", class_fit),
        ScorePlugin("marginal_power", marginal_power),
    )
}


def fits_when_empty(table: NodeTable, demand: FloatArray) -> BoolArray:
    """Nodes whose whole capacity holds ``demand``: :func:`resources_fit` once every running
    task is evicted, so where preemption may help and where nothing can."""
    mask: BoolArray = np.all(demand <= table.capacity + _EPS, axis=1)
    return mask


# --- the filter chain ------------------------------------------------------------------------


class FilterChain:
    """An ordered sequence of filter stages, and the ways the core runs it.

    A node is feasible when it passes every stage. Order matters for explanations only: a
    node that fails is counted (and, in the extender, reported) under the *first* stage it
    fails, so each stage's phrase describes the nodes the stages before it let through.
    """

    __slots__ = ("_dynamic", "_hard", "_static", "stages", "static_key")

    def __init__(
        self, stages: tuple[FilterPlugin, ...], static_key: Callable[[Task], Hashable]
    ) -> None:
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"filter stage names must be unique: {names}")
        for stage in stages:
            if stage.static and stage.resolvable:
                raise ValueError(f"{stage.name}: a static stage cannot read allocated resources")
        self.stages = stages
        #: The task's shape as the static stages see it: equal keys, equal static masks.
        self.static_key = static_key
        # Plain function tuples: these run once or twice per task in a cycle.
        self._static = tuple(s.fn for s in stages if s.static)
        self._dynamic = tuple(s.fn for s in stages if not s.static)
        self._hard = tuple(s.fn for s in stages if not s.static and not s.resolvable)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def static_mask(self, table: NodeTable, task: Task, demand: FloatArray) -> BoolArray:
        """Nodes passing every static stage (cacheable per ``static_key`` for one table)."""
        mask: BoolArray = np.ones(len(table), dtype=np.bool_)
        for fn in self._static:
            mask &= fn(table, task, demand)
        return mask

    def feasible(
        self,
        table: NodeTable,
        task: Task,
        demand: FloatArray,
        static: BoolArray | None = None,
    ) -> BoolArray:
        """Nodes passing every stage. ``static``: :meth:`static_mask` already computed for
        this table and task shape (it is not modified)."""
        if static is None:
            static = self.static_mask(table, task, demand)
        mask = static
        for fn in self._dynamic:  # inlined: this runs for every task of every cycle
            mask = mask & fn(table, task, demand)  # new arrays: the cached static is kept
        return static.copy() if mask is static else mask

    def eligible(
        self,
        table: NodeTable,
        task: Task,
        demand: FloatArray,
        static: BoolArray | None = None,
    ) -> BoolArray:
        """Nodes passing every stage that evictions cannot change (the non-resolvable ones):
        where preemption and consolidation may look.

        For a task asking accelerators, also the nodes where its slices or whole devices fit
        per device now (:func:`_slices_fit`): preemption and consolidation weigh the
        resource vector alone, which counts whole devices, not how slices sit on them, so a
        sliced node is a candidate only where no eviction is needed for the devices (a
        preemptor does not evict slices to make room)."""
        mask = self._run(table, task, demand, static, self._hard)
        if _slices_matter(table, task, demand):
            mask &= _slices_fit(table, task, mask)
        return mask

    def evaluate(
        self, table: NodeTable, task: Task, demand: FloatArray
    ) -> list[tuple[FilterPlugin, BoolArray]]:
        """Every stage's own mask, in chain order (for per-node reasons)."""
        return [(stage, stage.fn(table, task, demand)) for stage in self.stages]

    def explain(self, table: NodeTable, task: Task, demand: FloatArray) -> str:
        """'0/N nodes available: k <why>, ...' counting each node under the first stage it fails."""
        remaining = np.ones(len(table), dtype=np.bool_)
        parts: list[str] = []
        for stage, passed in self.evaluate(table, task, demand):
            failed = int(np.count_nonzero(remaining & ~passed))
            if failed:
                parts.append(f"{failed} {stage.why}")
            remaining &= passed
        return f"{int(remaining.sum())}/{len(table)} nodes available: " + ", ".join(parts)

    def _run(
        self,
        table: NodeTable,
        task: Task,
        demand: FloatArray,
        static: BoolArray | None,
        fns: tuple[FilterFn, ...],
    ) -> BoolArray:
        if static is None:
            static = self.static_mask(table, task, demand)
        mask = static
        for fn in fns:
            mask = mask & fn(table, task, demand)  # new arrays: the cached static is kept
        return static.copy() if mask is static else mask


def _static_key(task: Task) -> Hashable:
    """What the static stages read of a task: ``arch_compatible`` its architectures and the
    architectures it has images for, ``server_class_allowed`` its server classes. A static
    stage that reads more must add it here."""
    images = tuple(sorted(task.images)) if task.images else ()  # per task, twice: keep it cheap
    return (task.archs, images, task.server_classes)


#: The placement filter chain, declared once. Every stage is a hard constraint (a node that
#: fails one cannot take the task); soft preferences are score plugins, applied only to the
#: nodes that pass the whole chain. Stages are vector masks over every node with no
#: short-circuit, so the order does not change which nodes are feasible: it decides which
#: stage a failing node is reported under (the first it fails), and it runs from what no
#: eviction can fix to the capacity checks that depend on what the cycle has bound so far.
#: Cost is handled by the static stages being computed once per task shape.
FILTER_CHAIN = FilterChain(
    (
        # 1. Node state first: one comparison on one column, and the most basic refusal: a
        #    parked or waking node takes nothing (energy mode may park much of the fleet), and
        #    no preemption changes that, so later phrases count only nodes that are up. Not
        #    static: nodes are parked and woken between cycles, and a cycle wakes nodes.
        FilterPlugin("node_ready", node_ready, "not ready (parked or waking)"),
        # 2. Architecture and image: a fixed node attribute against the task's shape, so the
        #    scheduler computes it once per shape and cycle. The most selective hard
        #    constraint on a mixed fleet (an arm64-only task loses every x86 node); before
        #    capacity, so a node of the wrong architecture is reported as that, not as full.
        FilterPlugin(
            "arch_compatible",
            arch_compatible,
            "wrong architecture or no image",
            static=True,
        ),
        # 3. Server class: static like the architecture and cached the same way; after it,
        #    since most tasks name no class and it then passes every node.
        FilterPlugin(
            "server_class_allowed",
            server_class_allowed,
            "server class not allowed",
            static=True,
        ),
        # 4. Free resources: reads what is allocated, which changes with every bind, so it
        #    runs per task after the static stages. Evicting running work can fix it: the
        #    first stage preemption relaxes.
        FilterPlugin("resources_fit", resources_fit, "insufficient resources", resolvable=True),
        # 5. Accelerator reserve: a stricter form of the fit (the room a policy keeps for the
        #    accelerators' own CPU and memory). It comes after the raw fit so a node that is
        #    simply full says "insufficient resources", and only nodes that fit but would eat
        #    the reserve say "capacity kept for accelerators". Resolvable like the fit.
        FilterPlugin(
            "accelerator_reserve",
            accelerator_reserve,
            "capacity kept for accelerators",
            resolvable=True,
        ),
    ),
    # What stages 2 and 3 read of a task: the key the scheduler caches their mask under.
    static_key=_static_key,
)
