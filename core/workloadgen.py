"""Generated workload families: seeded scenarios beyond the one campus, for training and held-out
evaluation of placement policies.

A *family* (:data:`FAMILIES`) is a distribution over :class:`WorkloadParams`: the class mix
(CPU batch, interactive, accelerator, storage), priorities and preemptibility, the arrival
process (Poisson, bursts, diurnal), how heavy the duration tail is, and the fleet's shape
(general x86/arm, AI and storage servers). :func:`member` draws member ``i`` of a family for a
*split*: ``"train"`` members and ``"heldout"`` members come from different random streams, and
held-out members draw their load from a band above the training one, so evaluating on them
tests both new seeds and a load the training never saw.

Everything is a pure function of ``(family, split, index)``. A member is a few hours on ten to
thirty servers (a few thousand tasks), so one :func:`~edgesched.core.simulator.simulate` of it
takes about a second. :class:`GeneratedScenario` is a
:class:`~edgesched.core.simulator.ScenarioLike`.

How a member is built: each class gets a target *load* (a fraction of the fleet capacity it can
use: CPU cores for CPU classes, accelerators for accelerator classes), split from the member's
load by the class mix. Arrivals are Poisson per class with rate ``load * capacity / (mean size *
mean duration)`` (Little's law), modulated per 5-minute bin by the arrival shape (constant,
on/off bursts renormalised to mean one, or a sine over the day). Durations are lognormal (the
tail's log-scale ``sigma`` is a parameter), capped at 8 hours. The scenario starts warm: tasks
that arrived in the two hours before ``t = 0`` and are still running are submitted at ``t = 0``
with their remaining duration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from edgesched.core.campus import Tariff, campus_tariff, server_types
from edgesched.core.forecast import DemandHistory, asked_history
from edgesched.core.model import (
    SECONDS_PER_DAY,
    Arch,
    CoreTopology,
    Node,
    Resources,
    ServerClass,
    Task,
)

FloatArray = npt.NDArray[np.float64]

#: Arrival-rate bins, seconds.
BIN_S = 300.0
#: Warm-start span before ``t = 0``.
WARM_S = 2 * 3600.0
#: The part of the warm-start span a scenario's demand prior covers: its last 90 minutes (the
#: first 30 lack the work that arrived before the span and would read as a ramp).
PRIOR_S = WARM_S - 1800.0
#: Longest task duration drawn, seconds.
MAX_DURATION_S = 8 * 3600.0
#: Class kinds.
KINDS = ("batch", "interactive", "accel", "storage")
#: Splits of a family's members.
SPLITS = ("train", "heldout")
_BOTH = frozenset({Arch.ARM64, Arch.X86_64})


# --- fleet ----------------------------------------------------------------------------------


#: Server types of generated fleets by prefix: the campus's hardware and power models (AI
#: servers are a CPU side plus A30-class accelerators, docs/power.md).
_KIND_BY_PREFIX = server_types()


def make_fleet(counts: Mapping[str, int]) -> tuple[Node, ...]:
    """Nodes for ``counts`` (node-kind prefix -> count), sorted by id."""
    nodes: list[Node] = []
    for prefix, n in counts.items():
        kind = _KIND_BY_PREFIX[prefix]
        for i in range(1, n + 1):
            nodes.append(
                Node(
                    id=f"{prefix}-{i:02d}",
                    arch=kind.arch,
                    server_class=kind.server_class,
                    capacity=Resources(
                        cpu=float(kind.cores),
                        mem_gib=kind.mem_gib,
                        accel=kind.accel,
                        iops_k=kind.iops_k,
                    ),
                    power=kind.power,
                    topology=CoreTopology.uniform(kind.cores, kind.clusters),
                    perf=kind.perf,
                    site="generated",
                    labels={"pool": prefix},
                )
            )
    return tuple(sorted(nodes, key=lambda node: node.id))


# --- classes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GenClass:
    """A generated workload class (a :class:`~edgesched.core.simulator.WorkloadClassLike`).

    ``share`` is its part of the member's load of its resource (CPU, or accelerators for an
    ``accel`` class).
    """

    name: str
    kind: str
    priority: int
    slo_wait_s: float
    share: float
    cpu_choices: tuple[float, ...]
    mem_gib_per_cpu: float
    duration_median_s: float
    duration_sigma: float
    accel_choices: tuple[int, ...] = ()
    iops_k: float = 0.0
    archs: frozenset[Arch] = _BOTH
    server_classes: frozenset[ServerClass] = frozenset()
    preemptible: bool = True
    migratable: bool = False

    @property
    def mean_cpu(self) -> float:
        return float(np.mean(self.cpu_choices))

    @property
    def mean_accel(self) -> float:
        return float(np.mean(self.accel_choices)) if self.accel_choices else 0.0

    @property
    def mean_duration_s(self) -> float:
        """Mean of the (uncapped) lognormal duration."""
        return self.duration_median_s * math.exp(self.duration_sigma**2 / 2.0)


# --- parameters and families ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    """One member's parameters (drawn from its family's ranges)."""

    family: str
    split: str
    index: int
    hours: float
    start_hour: int
    load: float
    accel_load: float
    mix: tuple[tuple[str, float], ...]
    uniform_priority: bool
    preemptible_interactive: bool
    arrival: str
    burst_factor: float
    burst_fraction: float
    diurnal_amplitude: float
    duration_sigma: float
    fleet: tuple[tuple[str, int], ...]


Range = tuple[float, float]


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """A family: ranges each member's parameters are drawn from (uniformly)."""

    name: str
    description: str
    hours: Range
    load: Range
    heldout_load: Range
    accel_load: Range
    mix: Mapping[str, Range]
    arrivals: tuple[str, ...]
    burst_factor: Range
    duration_sigma: Range
    fleet: Mapping[str, tuple[int, int]]
    uniform_priority: bool = False
    interactive_preemptible_p: float = 0.0
    diurnal_amplitude: Range = (0.3, 0.6)
    burst_fraction: Range = (0.1, 0.25)


FAMILIES: Mapping[str, FamilySpec] = {
    "batch": FamilySpec(
        name="batch",
        description="Alibaba-like batch: every task one priority and preemptible, mostly short "
        "CPU jobs with a heavy tail, Poisson or diurnal arrivals, general and storage servers",
        hours=(3.0, 5.0),
        load=(0.35, 0.55),
        heldout_load=(0.55, 0.65),
        accel_load=(0.0, 0.0),
        mix={"batch": (0.75, 0.95), "storage": (0.05, 0.25)},
        arrivals=("poisson", "diurnal"),
        burst_factor=(1.0, 1.0),
        duration_sigma=(1.2, 1.8),
        fleet={"x86-gen": (4, 10), "arm-gen": (3, 10), "sto-x86": (1, 3)},
        uniform_priority=True,
    ),
    "mixed-bursty": FamilySpec(
        name="mixed-bursty",
        description="mixed priorities: interactive sessions (high priority, short SLO, mostly "
        "not preemptible), preemptible batch, storage and some accelerator work, arriving in "
        "bursts; every server type",
        hours=(3.0, 5.0),
        load=(0.30, 0.50),
        heldout_load=(0.50, 0.60),
        accel_load=(0.15, 0.35),
        mix={"interactive": (0.25, 0.45), "batch": (0.3, 0.5), "storage": (0.1, 0.2)},
        arrivals=("bursty",),
        burst_factor=(2.0, 4.0),
        duration_sigma=(0.8, 1.3),
        fleet={
            "x86-gen": (3, 8),
            "arm-gen": (3, 8),
            "ai-x86": (0, 2),
            "ai-arm": (1, 2),
            "sto-x86": (1, 2),
        },
        interactive_preemptible_p=0.2,
    ),
    "accel-heavy": FamilySpec(
        name="accel-heavy",
        description="accelerator-heavy: training (preemptible, 1-4 accelerators) and "
        "inference (high priority, 1 accelerator, short SLO) on many AI servers, plus CPU "
        "batch and interactive work",
        hours=(3.0, 5.0),
        load=(0.25, 0.40),
        heldout_load=(0.40, 0.50),
        accel_load=(0.40, 0.60),
        mix={"batch": (0.4, 0.7), "interactive": (0.2, 0.4)},
        arrivals=("poisson", "bursty", "diurnal"),
        burst_factor=(1.5, 3.0),
        duration_sigma=(0.7, 1.2),
        fleet={
            "x86-gen": (2, 5),
            "arm-gen": (1, 4),
            "ai-x86": (2, 4),
            "ai-arm": (1, 4),
            "sto-x86": (0, 1),
        },
    ),
}
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)


def _u(rng: np.random.Generator, r: Range) -> float:
    return float(rng.uniform(r[0], r[1])) if r[1] > r[0] else float(r[0])


def draw_params(family: str, split: str, index: int) -> WorkloadParams:
    """Member ``index`` of ``family`` in ``split`` (``"train"`` or ``"heldout"``)."""
    spec = FAMILIES[family]
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be an integer >= 0, got {index!r}")
    rng = np.random.default_rng([FAMILY_NAMES.index(family), SPLITS.index(split), index, 17])
    load = _u(rng, spec.heldout_load if split == "heldout" else spec.load)
    mix = tuple((k, _u(rng, r)) for k, r in spec.mix.items())
    arrival = spec.arrivals[int(rng.integers(len(spec.arrivals)))]
    fleet = tuple((p, int(rng.integers(lo, hi + 1))) for p, (lo, hi) in spec.fleet.items())
    return WorkloadParams(
        family=family,
        split=split,
        index=index,
        hours=round(_u(rng, spec.hours) * 4) / 4,
        start_hour=int(rng.integers(24)),
        load=load,
        accel_load=_u(rng, spec.accel_load),
        mix=mix,
        uniform_priority=spec.uniform_priority,
        preemptible_interactive=bool(rng.random() < spec.interactive_preemptible_p),
        arrival=arrival,
        burst_factor=_u(rng, spec.burst_factor),
        burst_fraction=_u(rng, spec.burst_fraction),
        diurnal_amplitude=_u(rng, spec.diurnal_amplitude),
        duration_sigma=_u(rng, spec.duration_sigma),
        fleet=fleet,
    )


def classes_for(p: WorkloadParams) -> dict[str, GenClass]:
    """The member's classes, shares normalised per resource (CPU classes, accelerator class)."""
    mix = dict(p.mix)
    total = sum(mix.values())
    sigma = p.duration_sigma
    prio = (lambda _p: 50) if p.uniform_priority else (lambda p_: p_)
    out: dict[str, GenClass] = {}
    if "interactive" in mix:
        out["interactive"] = GenClass(
            name="interactive",
            kind="interactive",
            priority=prio(90),
            slo_wait_s=10.0 if not p.uniform_priority else 600.0,
            share=mix["interactive"] / total,
            cpu_choices=(1.0, 2.0, 4.0),
            mem_gib_per_cpu=2.0,
            duration_median_s=240.0,
            duration_sigma=max(0.5, sigma - 0.3),
            preemptible=p.preemptible_interactive,
            migratable=True,
        )
    if "batch" in mix:
        out["batch"] = GenClass(
            name="batch",
            kind="batch",
            priority=prio(30),
            slo_wait_s=600.0,
            share=mix["batch"] / total,
            cpu_choices=(1.0, 2.0, 4.0, 8.0, 16.0),
            mem_gib_per_cpu=2.0,
            duration_median_s=60.0,
            duration_sigma=sigma,
        )
    if "storage" in mix:
        out["storage"] = GenClass(
            name="storage",
            kind="storage",
            priority=prio(40),
            slo_wait_s=900.0,
            share=mix["storage"] / total,
            cpu_choices=(2.0, 4.0),
            mem_gib_per_cpu=4.0,
            duration_median_s=600.0,
            duration_sigma=max(0.5, sigma - 0.4),
            iops_k=60.0,
            archs=frozenset({Arch.X86_64}),
        )
    if p.accel_load > 0 and any(pre.startswith("ai-") and n > 0 for pre, n in p.fleet):
        accel_max = 4  # every AI server holds at least 4
        out["training"] = GenClass(
            name="training",
            kind="accel",
            priority=prio(40),
            slo_wait_s=900.0,
            share=0.7,
            cpu_choices=(8.0,),
            mem_gib_per_cpu=8.0,
            duration_median_s=1200.0,
            duration_sigma=max(0.5, sigma - 0.3),
            accel_choices=(1, 2, accel_max),
            server_classes=frozenset({ServerClass.AI_ACCELERATOR}),
        )
        out["inference"] = GenClass(
            name="inference",
            kind="accel",
            priority=prio(95),
            slo_wait_s=30.0,
            share=0.3,
            cpu_choices=(2.0, 4.0),
            mem_gib_per_cpu=4.0,
            duration_median_s=120.0,
            duration_sigma=max(0.5, sigma - 0.3),
            accel_choices=(1,),
            server_classes=frozenset({ServerClass.AI_ACCELERATOR}),
            preemptible=False,
        )
    return out


# --- the scenario ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeneratedScenario:
    """A generated member: fleet, tasks (sorted by ``(submitted_at, id)``), classes, tariff."""

    nodes: tuple[Node, ...]
    tasks: tuple[Task, ...]
    classes: Mapping[str, GenClass]
    tariff: Tariff
    days: float
    params: WorkloadParams
    carried_over: frozenset[str] = field(default_factory=frozenset)
    #: The CPU asked in 5-minute means before ``t = 0`` (:data:`PRIOR_S` of the warm start's
    #: past): the history a live central's store would hold, which the simulator's forecast
    #: starts from.
    demand_prior: DemandHistory | None = None

    @property
    def name(self) -> str:
        return f"{self.params.family}/{self.params.split}/{self.params.index}"

    @property
    def seed(self) -> int:
        return self.params.index

    @property
    def horizon_s(self) -> float:
        return self.days * SECONDS_PER_DAY

    @property
    def fleet_cpu(self) -> float:
        return sum(n.capacity.cpu for n in self.nodes)


def _shape(p: WorkloadParams, rng: np.random.Generator, n_bins: int, t0: float) -> FloatArray:
    """Mean-one rate multiplier per bin starting at ``t0`` (seconds, may be negative)."""
    if p.arrival == "bursty":
        on = rng.random(n_bins) < p.burst_fraction
        f = np.where(on, p.burst_factor, 1.0)
        mean = p.burst_fraction * p.burst_factor + (1.0 - p.burst_fraction)
        out: FloatArray = f / mean
        return out
    if p.arrival == "diurnal":
        t = t0 + (np.arange(n_bins) + 0.5) * BIN_S + p.start_hour * 3600.0
        # peak at 14:00 local time
        wave: FloatArray = 1.0 + p.diurnal_amplitude * np.cos(
            2 * np.pi * (t - 14 * 3600.0) / SECONDS_PER_DAY
        )
        return wave
    return np.ones(n_bins, dtype=np.float64)


def _capacity_for(wc: GenClass, nodes: tuple[Node, ...]) -> float:
    """The fleet capacity a class's load is a fraction of (CPU cores or accelerators)."""
    if wc.kind == "accel":
        return float(sum(n.capacity.accel for n in nodes))
    return sum(
        n.capacity.cpu
        for n in nodes
        if n.arch in wc.archs and n.server_class != ServerClass.AI_ACCELERATOR
    )


def _class_tasks(
    p: WorkloadParams, wc: GenClass, stream: int, nodes: tuple[Node, ...]
) -> tuple[list[Task], list[str], tuple[FloatArray, FloatArray, FloatArray]]:
    """The class's tasks, the ids of those carried over to ``t = 0``, and the arrival times,
    durations and cores of every task that arrived before ``t = 0`` (the warm start's past)."""
    horizon = p.hours * 3600.0
    load = p.accel_load if wc.kind == "accel" else p.load
    size = wc.mean_accel if wc.kind == "accel" else wc.mean_cpu
    rate = load * wc.share * _capacity_for(wc, nodes) / (size * wc.mean_duration_s)
    rng = np.random.default_rng(
        [FAMILY_NAMES.index(p.family), SPLITS.index(p.split), p.index, stream, 1]
    )
    n_bins = math.ceil((horizon + WARM_S) / BIN_S)
    rates = rate * _shape(p, rng, n_bins, -WARM_S)
    lo = -WARM_S + np.arange(n_bins) * BIN_S
    width = np.clip(horizon - lo, 0.0, BIN_S)
    counts = rng.poisson(rates * width)
    bins = np.repeat(np.arange(n_bins), counts)
    times = np.sort(lo[bins] + rng.random(bins.size) * width[bins])
    n = times.size
    cpu = rng.choice(np.asarray(wc.cpu_choices), size=n)
    accel = rng.choice(np.asarray(wc.accel_choices), size=n) if wc.accel_choices else np.zeros(n)
    dur = np.minimum(
        rng.lognormal(math.log(wc.duration_median_s), wc.duration_sigma, size=n), MAX_DURATION_S
    )
    tasks: list[Task] = []
    carried: list[str] = []
    for i, (t, c, a, d) in enumerate(zip(times, cpu, accel, dur, strict=True)):
        if t < 0:
            if t + d <= 0:
                continue
            task_id, submitted, duration = f"{wc.name}-carry-{i:05d}", 0.0, t + d
            carried.append(task_id)
        else:
            task_id, submitted, duration = f"{wc.name}-{i:05d}", math.floor(t * 1e3) / 1e3, d
        cores = float(c)
        tasks.append(
            Task(
                id=task_id,
                workload=wc.name,
                priority=wc.priority,
                demand=Resources(
                    cpu=cores, mem_gib=cores * wc.mem_gib_per_cpu, accel=int(a), iops_k=wc.iops_k
                ),
                submitted_at=float(submitted),
                duration_s=max(round(float(duration), 3), 0.001),
                archs=wc.archs,
                server_classes=wc.server_classes,
                preemptible=wc.preemptible,
                migratable=wc.migratable,
                threads=round(cores),
            )
        )
    past = times < 0
    return tasks, carried, (times[past], dur[past], cpu[past].astype(np.float64))


def _tariff(start_hour: int) -> Tariff:
    """The campus time-of-use tariff seen from a scenario starting at ``start_hour``."""
    prices = campus_tariff().prices
    return Tariff(tuple(prices[(start_hour + h) % 24] for h in range(24)))


def scenario_from(p: WorkloadParams) -> GeneratedScenario:
    """The scenario of parameters ``p`` (a pure function of them)."""
    nodes = make_fleet(dict(p.fleet))
    classes = classes_for(p)
    tasks: list[Task] = []
    carried: list[str] = []
    pasts: list[tuple[FloatArray, FloatArray, FloatArray]] = []
    for stream, wc in enumerate(classes.values()):
        t, c, past = _class_tasks(p, wc, stream, nodes)
        tasks.extend(t)
        carried.extend(c)
        pasts.append(past)
    tasks.sort(key=lambda task: (task.submitted_at, task.id))
    starts, durations, cores = (np.concatenate(column) for column in zip(*pasts, strict=True))
    return GeneratedScenario(
        nodes=nodes,
        tasks=tuple(tasks),
        classes=classes,
        tariff=_tariff(p.start_hour),
        days=p.hours / 24.0,
        params=p,
        carried_over=frozenset(carried),
        demand_prior=asked_history(starts, durations, cores, -PRIOR_S, 0.0, BIN_S),
    )


def member(family: str, index: int, split: str = "train") -> GeneratedScenario:
    """Member ``index`` of ``family`` in ``split``: its parameters, then its scenario."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILY_NAMES)}")
    return scenario_from(draw_params(family, split, index))
