"""The campus experiment: every strategy over the same scenario, and the targets they are held to.

Builds the strategy set (three baselines, our three modes, tidal allocation on top of the
energy and priority modes, and the learned score) and checks a run's figures, with the per-core
affinity experiment on a 48-core ARM node, against the source article's targets. Running them
(in parallel processes) is :mod:`edgesched.simrun`'s job.

``learned`` is the energy mode with its score stage replaced by an injected
:class:`~edgesched.core.learned.LearnedScore` (the core does no I/O: the caller loads the model,
e.g. ``edgesched.policies.placement.learned_policy``, and passes it as ``learned`` or in
``base.learned_score``). Without one, every placement falls back to the energy score and each
decision says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from edgesched.core.learned import LearnedScore
from edgesched.core.model import Task
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.simulator import ScenarioLike, SimReport
from edgesched.core.strategies import (
    CoreStrategy,
    FirstFit,
    Strategy,
    kubernetes_like,
    partition_fleet,
    realized_peaks,
)
from edgesched.core.tidal import TidalProfile

BASELINES = ("static-partition", "k8s-spread", "first-fit")
TARGET_STRATEGY = "tidal+energy"
LEARNED_STRATEGY = "learned"


def build_strategies(
    scenario: ScenarioLike,
    tidal: TidalProfile,
    base: PolicyConfig | None = None,
    only: Sequence[str] | None = None,
    learned: LearnedScore | None = None,
) -> list[Strategy]:
    """Baselines first, then ours. ``base`` carries config overrides (weights, park timing);
    ``learned`` (else ``base.learned_score``) is the score model of the ``learned`` strategy."""
    base = base or PolicyConfig()
    score = learned if learned is not None else base.learned_score
    samples: dict[str, Task] = {}
    for task in scenario.tasks:
        samples.setdefault(task.workload, task)
    peaks = realized_peaks(scenario.tasks)

    def ours(name: str, mode: PolicyMode, profile: TidalProfile) -> CoreStrategy:
        return CoreStrategy(name, replace(base, mode=mode, tidal=profile))

    none = TidalProfile()
    makers: dict[str, Callable[[], Strategy]] = {
        "static-partition": lambda: partition_fleet(scenario.nodes, peaks, samples),
        "k8s-spread": kubernetes_like,
        "first-fit": FirstFit,
        "priority": lambda: ours("priority", PolicyMode.PRIORITY, none),
        "balance": lambda: ours("balance", PolicyMode.BALANCE, none),
        "energy": lambda: ours("energy", PolicyMode.ENERGY, none),
        "tidal+priority": lambda: ours("tidal+priority", PolicyMode.PRIORITY, tidal),
        TARGET_STRATEGY: lambda: ours(TARGET_STRATEGY, PolicyMode.ENERGY, tidal),
        LEARNED_STRATEGY: lambda: CoreStrategy(
            LEARNED_STRATEGY,
            replace(base, mode=PolicyMode.LEARNED, tidal=none, learned_score=score),
        ),
    }
    names = list(only) if only else list(makers)
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(makers)}")
    return [makers[n]() for n in names]


def strategy_names() -> tuple[str, ...]:
    return (
        "static-partition",
        "k8s-spread",
        "first-fit",
        "priority",
        "balance",
        "energy",
        "tidal+priority",
        TARGET_STRATEGY,
        LEARNED_STRATEGY,
    )


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float
    goal: str
    met: bool


@dataclass(frozen=True, slots=True)
class ExperimentResult:
    reports: tuple[SimReport, ...]
    affinity: Mapping[str, float]
    targets: tuple[Target, ...] = field(default_factory=tuple)

    def report(self, name: str) -> SimReport | None:
        return next((r for r in self.reports if r.strategy == name), None)


def top_class(scenario: ScenarioLike) -> str:
    return max(scenario.classes.values(), key=lambda c: c.priority).name


def check_targets(
    scenario: ScenarioLike, reports: Sequence[SimReport], affinity: Mapping[str, float]
) -> tuple[Target, ...]:
    """The source article's figures as targets (only those whose strategies ran)."""
    by = {r.strategy: r for r in reports}
    targets: list[Target] = []
    ours, static = by.get(TARGET_STRATEGY), by.get("static-partition")
    if ours is not None:
        targets.append(
            Target(
                "utilization (awake capacity), tidal+energy",
                ours.utilization_awake,
                ">= 0.78",
                ours.utilization_awake >= 0.78,
            )
        )
        top = top_class(scenario)
        misses = ours.classes[top].slo_misses if top in ours.classes else 0
        targets.append(Target(f"SLO misses of {top}, tidal+energy", misses, "== 0", misses == 0))
        if static is not None and static.energy_cost > 0:
            saving = 1 - ours.energy_cost / static.energy_cost
            targets.append(
                Target("energy cost saving vs static partition", saving, ">= 0.23", saving >= 0.23)
            )
    if static is not None:
        targets.append(
            Target(
                "static partition utilization (article: about 0.42)",
                static.utilization_awake,
                "about 0.42 (reference)",
                True,
            )
        )
    k8s = by.get("k8s-spread")
    if ours is not None and k8s is not None and k8s.energy_cost > 0:
        saving = 1 - ours.energy_cost / k8s.energy_cost
        targets.append(
            Target("energy cost saving vs k8s-spread", saving, ">= 0.23", saving >= 0.23)
        )
    if affinity:
        targets.append(
            Target(
                "per-core std, affinity planner, 48-core ARM",
                affinity["planned_std"],
                "<= 0.09",
                affinity["planned_std"] <= 0.09,
            )
        )
        targets.append(
            Target(
                "per-core std, naive: random core per thread",
                affinity["naive_random_std"],
                ">= 0.25 (reference)",
                affinity["naive_random_std"] >= 0.25,
            )
        )
        targets.append(
            Target(
                "per-core std, naive: round-robin core blocks",
                affinity["naive_std"],
                "reference",
                True,
            )
        )
    return tuple(targets)
