"""Filter and score plugins at named extension points, as in the Kubernetes scheduling framework.

A *filter* plugin returns a boolean mask over the node table: which nodes may take the task.
A *score* plugin returns a float array in [0, 1] over the node table: how much it likes each
node (higher is better). The scheduler runs every filter, then the weighted sum of the score
plugins its policy mode names, then selects the best feasible node. Each plugin is one pure
vectorized function of (table, task, demand vector).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from edgesched.core.model import Arch, Task
from edgesched.core.nodetable import (
    ARCH_CODES,
    CLASS_CODES,
    BoolArray,
    FloatArray,
    NodeTable,
    natural_class,
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
    return mask


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


def _power_utilization(table: NodeTable, extra: FloatArray | None) -> FloatArray:
    """The power model's utilization: the larger of CPU and accelerator allocation."""
    used = table.used if extra is None else table.used + extra
    cpu = used[:, 0] / table.capacity[:, 0]
    acc = used[:, 2] / np.maximum(table.capacity[:, 2], 1.0)
    util: FloatArray = np.clip(np.maximum(cpu, acc), 0.0, 1.0)
    return util


def marginal_power(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """Prefer the node where the task adds the fewest watts.

    The added draw is ``(peak - idle) * (u_after - u_before)`` under the linear power model,
    plus the node's idle power if it runs nothing yet (an empty node could be parked instead).
    CPU work on a node whose accelerators already drive its utilization costs nothing extra.
    """
    added = (table.peak_w - table.idle_w) * (
        _power_utilization(table, demand) - _power_utilization(table, None)
    )
    added = added + np.where(table.used[:, 0] <= _EPS, table.idle_w, 0.0)
    worst = float(added.max()) if len(table) else 0.0
    score: FloatArray = 1.0 - added / max(worst, _EPS)
    return score


def class_fit(table: NodeTable, task: Task, demand: FloatArray) -> FloatArray:
    """1 on the task's natural server class, 0 elsewhere: keeps accelerators and NVMe free."""
    score: FloatArray = (table.server_class == CLASS_CODES[natural_class(task)]).astype(np.float64)
    return score


FILTERS: tuple[FilterPlugin, ...] = (
    FilterPlugin("node_ready", node_ready, "not ready (parked or waking)"),
    FilterPlugin("arch_compatible", arch_compatible, "wrong architecture or no image"),
    FilterPlugin("server_class_allowed", server_class_allowed, "server class not allowed"),
    FilterPlugin("resources_fit", resources_fit, "insufficient resources"),
    FilterPlugin("accelerator_reserve", accelerator_reserve, "capacity kept for accelerators"),
)

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


def static_mask(table: NodeTable, task: Task, demand: FloatArray) -> BoolArray:
    """Filters that do not depend on free resources or node state (arch, image, class)."""
    return arch_compatible(table, task, demand) & server_class_allowed(table, task, demand)


def explain(table: NodeTable, task: Task, demand: FloatArray) -> str:
    """'0/N nodes available: k <why>, ...' counting each node under the first filter it fails."""
    remaining = np.ones(len(table), dtype=np.bool_)
    parts: list[str] = []
    for plugin in FILTERS:
        passed = plugin.fn(table, task, demand)
        failed = int(np.count_nonzero(remaining & ~passed))
        if failed:
            parts.append(f"{failed} {plugin.why}")
        remaining &= passed
    return f"{int(remaining.sum())}/{len(table)} nodes available: " + ", ".join(parts)
