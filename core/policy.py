"""Policy modes and the policy configuration the scheduler runs under.

Three modes from the source article, switchable at run time by handing the scheduler another
:class:`PolicyConfig`:

* ``priority``: strict priority queue (then age), preemption of lower priorities,
  least-allocated spreading so high-priority work finds headroom.
* ``balance``: first-come first-served queue, spreading (least-allocated plus balanced
  resource use), preemption only to restore tidal guarantees.
* ``energy``: priority queue, consolidation on the nodes that do the most work per watt,
  parking of the nodes it frees and waking them ahead of forecast demand.
* ``learned``: as ``energy``, but the score stage is an injected learned model
  (:mod:`edgesched.core.learned`); without a usable model it falls back, decision by decision
  and saying so, to the energy weights.

Each mode is a table of score-plugin weights plus a few switches; a config may override any
weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from edgesched.core.learned import LearnedScore
from edgesched.core.tidal import TidalProfile


class PolicyMode(StrEnum):
    PRIORITY = "priority"
    BALANCE = "balance"
    ENERGY = "energy"
    LEARNED = "learned"


#: Score plugin weights per mode (plugin names are those in ``edgesched.core.plugins``).
MODE_WEIGHTS: Mapping[PolicyMode, Mapping[str, float]] = {
    PolicyMode.PRIORITY: {"least_allocated": 1.0, "class_fit": 1.0},
    PolicyMode.BALANCE: {"least_allocated": 1.0, "balanced_allocation": 1.0, "class_fit": 1.0},
    PolicyMode.ENERGY: {
        "most_allocated": 1.0,
        "marginal_power": 2.0,
        "energy_efficiency": 1.0,
        "class_fit": 0.5,
    },
    # The learned mode's fallback weights (a model that is missing or broken): the energy mode's.
    PolicyMode.LEARNED: {
        "most_allocated": 1.0,
        "marginal_power": 2.0,
        "energy_efficiency": 1.0,
        "class_fit": 0.5,
    },
}


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Everything that shapes decisions besides the cluster state.

    ``weights`` overrides the mode's default score weights key by key. ``preemption`` lets
    higher priorities evict lower ones (tidal guarantees may still reclaim when it is off).
    ``park_idle_after_s``: an empty node is parked after being idle this long (energy mode).
    ``spare_cpu_fraction``: fraction of the forecast CPU demand kept as awake headroom.
    ``max_migrations_per_cycle``: consolidation moves of migratable tasks per cycle (energy).
    ``accel_reserve_cpu`` / ``accel_reserve_mem_gib``: CPU and memory that work without
    accelerators must leave free per free accelerator of a node, so an accelerator server's
    spare CPU can be used without stranding its accelerators.
    ``score_nodes``: in a table of more than twice this many nodes, a task is scored over a
    sample holding at least this many feasible nodes (a window of consecutive rows starting
    where the task's id hashes), not over every node, as Kubernetes'
    ``percentageOfNodesToScore`` and Nomad's limit iterator do: placement then costs the
    sample, not the fleet. 0: every node, always. A task is placed if any node fits, either
    way; only the choice among them is the sample's best rather than the fleet's.
    """

    mode: PolicyMode = PolicyMode.PRIORITY
    tidal: TidalProfile = field(default_factory=TidalProfile)
    weights: Mapping[str, float] = field(default_factory=dict)
    preemption: bool = True
    park_idle_after_s: float = 300.0
    spare_cpu_fraction: float = 0.15
    min_spare_cpu: float = 16.0
    max_migrations_per_cycle: int = 2
    consolidate_below: float = 0.3
    max_preemptions_per_task: int = 8
    accel_reserve_cpu: float = 0.0
    accel_reserve_mem_gib: float = 0.0
    score_nodes: int = 500
    #: The score model of ``learned`` mode, injected by the caller (never compared or hashed).
    learned_score: LearnedScore | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, w in self.weights.items():
            if w < 0:
                raise ValueError(f"policy weight {name!r} must be >= 0")
        if self.park_idle_after_s < 0:
            raise ValueError("park_idle_after_s must be >= 0")
        if not 0 <= self.spare_cpu_fraction <= 10:
            raise ValueError("spare_cpu_fraction must be in [0, 10]")
        if self.min_spare_cpu < 0:
            raise ValueError("min_spare_cpu must be >= 0")
        if self.max_migrations_per_cycle < 0 or self.max_preemptions_per_task < 0:
            raise ValueError("per-cycle limits must be >= 0")
        if not 0 <= self.consolidate_below <= 1:
            raise ValueError("consolidate_below must be in [0, 1]")
        if self.accel_reserve_cpu < 0 or self.accel_reserve_mem_gib < 0:
            raise ValueError("accelerator reserves must be >= 0")
        if self.score_nodes < 0:
            raise ValueError("score_nodes must be >= 0")

    @property
    def effective_weights(self) -> dict[str, float]:
        merged = dict(MODE_WEIGHTS[self.mode])
        merged.update(self.weights)
        return {k: v for k, v in merged.items() if v > 0}

    @property
    def parks_nodes(self) -> bool:
        return self.mode in (PolicyMode.ENERGY, PolicyMode.LEARNED)

    @property
    def fifo(self) -> bool:
        return self.mode is PolicyMode.BALANCE

    @property
    def priority_preemption(self) -> bool:
        return self.preemption and self.mode is not PolicyMode.BALANCE
