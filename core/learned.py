"""The learned score stage: (task, node) features and the injected score model's contract.

In ``learned`` mode (:class:`~edgesched.core.policy.PolicyMode`) the scheduler scores the
feasible nodes with a model instead of a fixed weighted sum. The model is *injected*: the core
only knows the :class:`LearnedScore` protocol (a pure function from a feature matrix to one
score per row), so the core stays free of I/O. ``edgesched.policies.placement`` wraps an
onnxruntime session in it; training wraps plain numpy weights.

:func:`learned_features` builds one row per candidate node, columns in the order of
:data:`LEARNED_FEATURES` (the model card of every placement model states it). Every column is
in ``[0, 1]``.

When the model is missing, raises, or returns the wrong shape or non-finite scores, the
scheduler falls back to the energy mode's weighted sum for that placement and says so in the
decision (its reason and ``scores["learned_fallback"] = 1``): never silently.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgesched.core.model import ServerClass, Task
from edgesched.core.nodetable import CLASS_CODES, FloatArray, NodeTable
from edgesched.core.plugins import SCORES

#: Feature columns, in order. ``*_x_preemptible`` are the plugin score times 1 for a
#: preemptible task (0 otherwise), so a linear model can treat evictable work differently.
LEARNED_FEATURES: tuple[str, ...] = (
    "least_allocated",
    "most_allocated",
    "balanced_allocation",
    "energy_efficiency",
    "marginal_power",
    "class_fit",
    "cpu_free_fraction",
    "node_empty",
    "accelerator_server",
    "storage_server",
    "task_cpu_fraction_of_node",
    "most_allocated_x_preemptible",
    "marginal_power_x_preemptible",
)
N_LEARNED_FEATURES = len(LEARNED_FEATURES)
_EPS = 1e-9


class LearnedScore(Protocol):
    """Scores candidate nodes: ``features`` float64 ``[n, N_LEARNED_FEATURES]`` -> ``[n]``.

    Higher is better. It may raise (the scheduler then falls back to the heuristic); it must
    not keep state that changes its answers.
    """

    def __call__(self, features: FloatArray) -> FloatArray: ...


def learned_features(table: NodeTable, task: Task, demand: FloatArray, rows: object) -> FloatArray:
    """Feature rows for ``task`` on the table rows ``rows`` (an index array), each in [0, 1]."""
    idx = np.asarray(rows, dtype=np.int64)
    parts = [SCORES[name].fn(table, task, demand)[idx] for name in LEARNED_FEATURES[:6]]
    cap = table.capacity[idx]
    used = table.used[idx]
    free = np.clip(1.0 - used[:, 0] / np.maximum(cap[:, 0], _EPS), 0.0, 1.0)
    empty = (used[:, 0] <= _EPS).astype(np.float64)
    accel = (table.server_class[idx] == CLASS_CODES[ServerClass.AI_ACCELERATOR]).astype(np.float64)
    storage = (table.server_class[idx] == CLASS_CODES[ServerClass.STORAGE_DENSE]).astype(np.float64)
    share = np.clip(demand[0] / np.maximum(cap[:, 0], _EPS), 0.0, 1.0)
    pre = 1.0 if task.preemptible else 0.0
    out: FloatArray = np.column_stack(
        [*parts, free, empty, accel, storage, share, parts[1] * pre, parts[4] * pre]
    ).astype(np.float64)
    return out


def check_scores(scores: object, n: int) -> tuple[FloatArray | None, str]:
    """``(scores, "")`` when ``scores`` is ``n`` finite floats, else ``(None, why)``."""
    try:
        arr = np.asarray(scores, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        return None, f"unusable scores: {exc}"
    if arr.shape != (n,):
        return None, f"expected {n} scores, got shape {arr.shape}"
    if not np.all(np.isfinite(arr)):
        return None, "non-finite scores"
    return arr, ""
