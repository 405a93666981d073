"""The smart-campus scenario of the source article: a seeded fleet, workload and tariff.

The simulator runs :func:`campus_scenario`; everything here is a pure function of
``(seed, days, scale)``. The scenario is the article's deployment: a mixed cluster of three
architectures (x86_64 and arm64 general servers, AI-accelerator servers of both architectures)
plus storage-dense servers, running five workload classes with their own time-of-day demand:
face recognition at the gates (07:00-09:00, again 17:00-19:00), video conferencing (09:00-12:00
and 14:00-17:00), cloud desktops (working hours), AI training (12:30-14:00 and nights) and
security-video analytics (nights).

How the workload is built:

* Each class has an expected *demand curve*: CPU cores in use, one point per 5 minutes of the
  day, made of smooth plateaus over a base. All curves are scaled by one factor so that the mean
  total demand is :data:`TARGET_UTILIZATION` (the article's 42% before its scheduler) of the
  fleet's CPU capacity.
* Arrivals are a non-homogeneous Poisson process per class, piecewise constant per 5-minute
  bin, with rate ``demand(t + lead) / (mean cpu per task * mean duration)`` so that the expected
  cores in use follow the curve (``lead`` is the mean residual life of a task, which undoes the
  lag a queue of long tasks puts between arrivals and load). A smooth, seeded, log-normal noise
  modulates the rate so that days differ; it is renormalised per day so that each day's
  expected work is exactly the calibrated figure.
* Durations are lognormal per class: face recognition is short (median 24 s), the other classes
  last tens of minutes, which gives the heavy-tailed overall mix of cluster traces (median tens
  of seconds, p99 tens of minutes).
* With ``warm_start`` (the default) the scenario begins in steady state: tasks that would still
  be running at midnight, had the previous evening been simulated, are submitted at ``t = 0``
  with their remaining duration (their ids are listed in ``CampusScenario.carried_over``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from edgesched.core.forecast import DemandHistory, asked_history
from edgesched.core.model import (
    SECONDS_PER_DAY,
    Arch,
    CoreTopology,
    Node,
    PowerModel,
    Resources,
    ServerClass,
    Task,
)

FloatArray = npt.NDArray[np.float64]

#: Points per day of a demand curve (one per 5 minutes).
BINS_PER_DAY = 288
#: Width of one demand-curve bin, seconds.
BIN_S = SECONDS_PER_DAY / BINS_PER_DAY
#: Mean total CPU demand as a fraction of fleet CPU capacity (the article's "before" figure).
TARGET_UTILIZATION = 0.42
#: How far before t = 0 the warm start simulates arrivals (longer than all but ~1e-9 of tasks).
WARM_START_S = 12 * 3600.0
#: The span of the previous evening a scenario's demand prior covers.
PRIOR_S = 2 * 3600.0
#: Log-scale standard deviation of the day-to-day rate noise, and its correlation time.
NOISE_SIGMA = 0.10
NOISE_CORRELATION_S = 1800.0

_NORMAL = NormalDist()
_IMAGE_REGISTRY = "registry.campus.local/edgesched"


# --------------------------------------------------------------------------------------------
# Tariff


@dataclass(frozen=True, slots=True)
class Tariff:
    """Time-of-use electricity price: ``prices[h]`` per kWh during hour ``h`` (0..23) of a day."""

    prices: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.prices) != 24:
            raise ValueError(f"a tariff needs 24 hourly prices, got {len(self.prices)}")
        if any(not math.isfinite(p) or p < 0 for p in self.prices):
            raise ValueError("tariff prices must be finite and >= 0")

    def price_at(self, t: float) -> float:
        """Price per kWh at ``t`` seconds since day 0 midnight (wraps every day)."""
        hour = int((t % SECONDS_PER_DAY) // 3600.0)
        return self.prices[min(hour, 23)]

    @property
    def mean_price(self) -> float:
        return sum(self.prices) / 24.0


def campus_tariff() -> Tariff:
    """0.08/kWh off-peak 23:00-07:00, 0.24 peak 08:00-11:00 and 17:00-21:00, 0.14 otherwise."""
    prices: list[float] = []
    for hour in range(24):
        if hour >= 23 or hour < 7:
            prices.append(0.08)
        elif 8 <= hour < 11 or 17 <= hour < 21:
            prices.append(0.24)
        else:
            prices.append(0.14)
    return Tariff(tuple(prices))


# --------------------------------------------------------------------------------------------
# Workload classes


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """A campus workload class: its priority, SLO, expected demand curve and task shape.

    ``demand_curve[i]`` is the expected number of CPU cores in use at ``i * BIN_S`` seconds after
    midnight (linear in between, periodic over the day). A task's CPU demand is drawn from
    ``cpu_choices`` with ``cpu_weights``, its memory is ``mem_gib_per_cpu`` times that, its
    accelerators come from ``accel_choices``/``accel_weights`` (empty = none); its duration is
    lognormal with median ``duration_median_s`` and log-scale ``duration_sigma``.
    """

    name: str
    priority: int
    slo_wait_s: float
    demand_curve: tuple[float, ...]
    code: str
    cpu_choices: tuple[float, ...]
    cpu_weights: tuple[float, ...]
    mem_gib_per_cpu: float
    duration_median_s: float
    duration_sigma: float
    accel_choices: tuple[int, ...] = ()
    accel_weights: tuple[float, ...] = ()
    iops_k: float = 0.0
    archs: frozenset[Arch] = frozenset()
    server_classes: frozenset[ServerClass] = frozenset()
    migratable: bool = False
    preemptible: bool = True

    def __post_init__(self) -> None:
        if len(self.demand_curve) != BINS_PER_DAY:
            raise ValueError(
                f"class {self.name!r}: demand_curve needs {BINS_PER_DAY} points, "
                f"got {len(self.demand_curve)}"
            )
        if any(d < 0 for d in self.demand_curve):
            raise ValueError(f"class {self.name!r}: demand_curve must be >= 0")
        if not self.cpu_choices or len(self.cpu_choices) != len(self.cpu_weights):
            raise ValueError(f"class {self.name!r}: cpu_choices and cpu_weights must match")
        if len(self.accel_choices) != len(self.accel_weights):
            raise ValueError(f"class {self.name!r}: accel_choices and accel_weights must match")
        if self.duration_median_s <= 0 or self.duration_sigma <= 0:
            raise ValueError(f"class {self.name!r}: duration median and sigma must be > 0")

    @property
    def images(self) -> dict[Arch, str]:
        """The image of this class for each architecture it runs on."""
        return _images(self.name, self.archs)

    @property
    def mean_cpu(self) -> float:
        """Expected CPU cores of one task."""
        return _weighted_mean(self.cpu_choices, self.cpu_weights)

    @property
    def mean_accel(self) -> float:
        if not self.accel_choices:
            return 0.0
        return _weighted_mean(tuple(float(a) for a in self.accel_choices), self.accel_weights)

    @property
    def mean_duration_s(self) -> float:
        """Expected duration of one task: ``median * exp(sigma^2 / 2)``."""
        return self.duration_median_s * math.exp(self.duration_sigma**2 / 2.0)

    @property
    def mean_residual_s(self) -> float:
        """Mean remaining duration of a task seen running at a random time: E[D^2] / (2 E[D])."""
        return self.duration_median_s * math.exp(1.5 * self.duration_sigma**2) / 2.0

    def duration_quantile(self, q: float) -> float:
        """The ``q`` quantile (0 < q < 1) of the task duration distribution, seconds."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        return self.duration_median_s * math.exp(self.duration_sigma * _NORMAL.inv_cdf(q))

    def demand_at(self, t: float) -> float:
        """Expected CPU cores in use at ``t`` seconds (periodic per day, linear between points)."""
        x = (t % SECONDS_PER_DAY) / BIN_S
        i = int(x) % BINS_PER_DAY
        frac = x - int(x)
        a = self.demand_curve[i]
        b = self.demand_curve[(i + 1) % BINS_PER_DAY]
        return a + (b - a) * frac

    @property
    def mean_demand(self) -> float:
        """Mean expected CPU cores in use over the day."""
        return sum(self.demand_curve) / BINS_PER_DAY

    @property
    def peak_demand(self) -> float:
        return max(self.demand_curve)

    @property
    def peak_time_s(self) -> float:
        """Time of day (seconds) of the curve's maximum."""
        return self.demand_curve.index(self.peak_demand) * BIN_S


def _weighted_mean(values: tuple[float, ...], weights: tuple[float, ...]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total


@dataclass(frozen=True, slots=True)
class _Plateau:
    """A smooth plateau of ``height`` (fraction of fleet CPU) from ``start_h`` to ``end_h``.

    Logistic edges of width ``ramp_h`` hours; ``end_h < start_h`` wraps midnight.
    """

    start_h: float
    end_h: float
    height: float
    ramp_h: float = 0.3


@dataclass(frozen=True, slots=True)
class _ClassSpec:
    """Static description of a class before calibration (demand shape in fleet fractions)."""

    name: str
    code: str
    priority: int
    slo_wait_s: float
    base: float
    plateaus: tuple[_Plateau, ...]
    cpu_choices: tuple[float, ...]
    cpu_weights: tuple[float, ...]
    mem_gib_per_cpu: float
    duration_median_s: float
    duration_sigma: float
    accel_choices: tuple[int, ...] = ()
    accel_weights: tuple[float, ...] = ()
    iops_k: float = 0.0
    archs: frozenset[Arch] = frozenset()
    server_classes: frozenset[ServerClass] = frozenset()
    migratable: bool = False
    preemptible: bool = True


_BOTH_ARCHS = frozenset({Arch.ARM64, Arch.X86_64})

_SPECS: tuple[_ClassSpec, ...] = (
    _ClassSpec(
        name="face-recognition",
        code="fr",
        priority=100,
        slo_wait_s=5.0,
        base=0.004,
        plateaus=(
            _Plateau(7.0, 9.0, 0.20, 0.25),  # the morning rush at the gates
            _Plateau(17.0, 19.0, 0.06, 0.3),  # leaving in the evening
            _Plateau(11.5, 13.5, 0.015, 0.3),  # canteen gates at lunch
        ),
        cpu_choices=(4.0,),
        cpu_weights=(1.0,),
        mem_gib_per_cpu=2.0,
        duration_median_s=24.0,
        duration_sigma=1.1,
        archs=_BOTH_ARCHS,
        preemptible=False,
    ),
    _ClassSpec(
        name="video-conferencing",
        code="vc",
        priority=80,
        slo_wait_s=10.0,
        base=0.03,
        plateaus=(
            _Plateau(9.0, 12.0, 0.15),
            _Plateau(14.0, 17.0, 0.10),
            _Plateau(8.0, 18.0, 0.04, 0.5),
        ),
        cpu_choices=(2.0, 3.0, 4.0),
        cpu_weights=(0.4, 0.35, 0.25),
        mem_gib_per_cpu=2.0,
        duration_median_s=1200.0,
        duration_sigma=0.45,
        archs=_BOTH_ARCHS,
        migratable=True,
        preemptible=False,
    ),
    _ClassSpec(
        name="cloud-desktop",
        code="cd",
        priority=60,
        slo_wait_s=30.0,
        base=0.05,
        plateaus=(
            _Plateau(9.0, 18.0, 0.13, 0.4),
            _Plateau(12.0, 13.0, -0.03, 0.25),  # lunch break
            _Plateau(19.0, 22.0, 0.02, 0.5),  # evening study
        ),
        cpu_choices=(2.0,),
        cpu_weights=(1.0,),
        mem_gib_per_cpu=4.0,
        duration_median_s=1200.0,
        duration_sigma=0.45,
        archs=frozenset({Arch.X86_64}),
        migratable=True,
        preemptible=False,
    ),
    _ClassSpec(
        name="ai-training",
        code="ai",
        priority=40,
        slo_wait_s=900.0,
        base=0.08,
        plateaus=(
            _Plateau(12.5, 14.0, 0.05, 0.25),
            _Plateau(22.0, 6.0, 0.04, 0.5),
        ),
        cpu_choices=(8.0,),
        cpu_weights=(1.0,),
        mem_gib_per_cpu=8.0,
        accel_choices=(1, 2),
        accel_weights=(0.7, 0.3),
        duration_median_s=1500.0,
        duration_sigma=0.45,
        archs=_BOTH_ARCHS,
        server_classes=frozenset({ServerClass.AI_ACCELERATOR}),
    ),
    _ClassSpec(
        name="video-analytics",
        code="va",
        priority=20,
        slo_wait_s=1800.0,
        base=0.085,
        plateaus=(_Plateau(22.0, 6.0, 0.11, 0.5),),
        cpu_choices=(4.0,),
        cpu_weights=(1.0,),
        mem_gib_per_cpu=2.0,
        iops_k=25.0,
        duration_median_s=900.0,
        duration_sigma=0.6,
        archs=_BOTH_ARCHS,
    ),
)

#: Workload class names, highest priority first.
CLASS_NAMES: tuple[str, ...] = tuple(spec.name for spec in _SPECS)


def _shape(spec: _ClassSpec) -> FloatArray:
    """The class's demand shape at the bin starts, in fractions of fleet CPU (before scaling)."""
    hours = np.arange(BINS_PER_DAY, dtype=np.float64) * (BIN_S / 3600.0)
    out = np.full(BINS_PER_DAY, spec.base, dtype=np.float64)
    for p in spec.plateaus:
        end = p.end_h + 24.0 if p.end_h < p.start_h else p.end_h
        for shift in (-24.0, 0.0, 24.0):
            rise = 1.0 / (1.0 + np.exp(-(hours - p.start_h - shift) / p.ramp_h))
            fall = 1.0 / (1.0 + np.exp(-(hours - end - shift) / p.ramp_h))
            out += p.height * (rise - fall)
    return np.maximum(out, 0.0)


def _images(name: str, archs: frozenset[Arch]) -> dict[Arch, str]:
    """One image per architecture the class runs on (the per-architecture build templates)."""
    return {arch: f"{_IMAGE_REGISTRY}/{name}:1.0-{arch.value}" for arch in sorted(archs)}


def workload_classes(fleet_cpu: float) -> dict[str, WorkloadClass]:
    """The five campus classes with demand curves calibrated to ``fleet_cpu`` cores.

    One factor scales every shape so that the mean total demand is ``TARGET_UTILIZATION`` of
    ``fleet_cpu``.
    """
    if not fleet_cpu > 0:
        raise ValueError(f"fleet_cpu must be > 0, got {fleet_cpu}")
    shapes = [_shape(spec) for spec in _SPECS]
    factor = TARGET_UTILIZATION * fleet_cpu / float(sum(s.mean() for s in shapes))
    classes: dict[str, WorkloadClass] = {}
    for spec, shape in zip(_SPECS, shapes, strict=True):
        classes[spec.name] = WorkloadClass(
            name=spec.name,
            priority=spec.priority,
            slo_wait_s=spec.slo_wait_s,
            demand_curve=tuple((shape * factor).tolist()),
            code=spec.code,
            cpu_choices=spec.cpu_choices,
            cpu_weights=spec.cpu_weights,
            mem_gib_per_cpu=spec.mem_gib_per_cpu,
            duration_median_s=spec.duration_median_s,
            duration_sigma=spec.duration_sigma,
            accel_choices=spec.accel_choices,
            accel_weights=spec.accel_weights,
            iops_k=spec.iops_k,
            archs=spec.archs,
            server_classes=spec.server_classes,
            migratable=spec.migratable,
            preemptible=spec.preemptible,
        )
    return classes


# --------------------------------------------------------------------------------------------
# Arrival rates and the expected load they produce


def _lognormal_partial_mean(median: float, sigma: float, a: FloatArray) -> FloatArray:
    """E[min(D, a)] for lognormal D: the integral of the survival function from 0 to ``a``."""
    mu = math.log(median)
    mean = median * math.exp(sigma**2 / 2.0)
    out = np.zeros_like(a)
    pos = a > 0
    la = np.log(a[pos])
    cdf = np.vectorize(_NORMAL.cdf, otypes=[np.float64])
    out[pos] = mean * cdf((la - mu - sigma**2) / sigma) + a[pos] * (1.0 - cdf((la - mu) / sigma))
    return out


def arrival_rate_curve(wc: WorkloadClass) -> tuple[float, ...]:
    """Noise-free arrivals per second of class ``wc`` in each 5-minute bin of the day.

    ``rate[k] = demand(mid_k + lead) / (mean_cpu * mean_duration)``, renormalised so that the
    expected daily work equals the curve's mean exactly.
    """
    mids = (np.arange(BINS_PER_DAY, dtype=np.float64) + 0.5) * BIN_S + wc.mean_residual_s
    curve = np.asarray(wc.demand_curve, dtype=np.float64)
    xs = np.arange(BINS_PER_DAY + 1, dtype=np.float64) * BIN_S
    shifted = np.interp(mids % SECONDS_PER_DAY, xs, np.append(curve, curve[0]))
    if shifted.mean() > 0:
        shifted *= curve.mean() / shifted.mean()
    rate = shifted / (wc.mean_cpu * wc.mean_duration_s)
    return tuple(rate.tolist())


def expected_cores_in_use(wc: WorkloadClass) -> tuple[float, ...]:
    """Expected CPU cores in use at each bin start in periodic steady state, from the arrival
    rates of :func:`arrival_rate_curve` and the class's duration distribution.

    This is what the scenario's tasks produce on an unconstrained fleet; it tracks
    ``demand_curve`` up to the smoothing long tasks put on sharp ramps.
    """
    rate = np.asarray(arrival_rate_curve(wc), dtype=np.float64)
    # Survival-function integral over each lag bin: w[j] = int_{j*BIN}^{(j+1)*BIN} S(u) du.
    horizon_bins = 4 * BINS_PER_DAY
    edges = np.arange(horizon_bins + 1, dtype=np.float64) * BIN_S
    partial = _lognormal_partial_mean(wc.duration_median_s, wc.duration_sigma, edges)
    w = np.diff(partial)
    folded = w.reshape(-1, BINS_PER_DAY).sum(axis=0)
    # in_use(i * BIN) = mean_cpu * sum_j rate[i - 1 - j] * w[j]  (circular over the day)
    in_use = np.zeros(BINS_PER_DAY, dtype=np.float64)
    for j in range(BINS_PER_DAY):
        in_use += folded[j] * np.roll(rate, 1 + j)
    return tuple((in_use * wc.mean_cpu).tolist())


# --------------------------------------------------------------------------------------------
# Fleet


@dataclass(frozen=True, slots=True)
class _NodeType:
    prefix: str
    count: int
    arch: Arch
    server_class: ServerClass
    cores: int
    clusters: int
    mem_gib: float
    accel: int
    iops_k: float
    perf: float
    power: PowerModel
    hal: str


_NODE_TYPES: tuple[_NodeType, ...] = (
    _NodeType(
        prefix="x86-gen",
        count=16,
        arch=Arch.X86_64,
        server_class=ServerClass.GENERAL,
        cores=64,
        clusters=2,  # two NUMA nodes
        mem_gib=256.0,
        accel=0,
        iops_k=400.0,
        perf=1.0,
        power=PowerModel(idle_w=180.0, peak_w=420.0, parked_w=12.0, wake_latency_s=90.0),
        hal="pcie-hotplug",
    ),
    _NodeType(
        prefix="arm-gen",
        count=16,
        arch=Arch.ARM64,
        server_class=ServerClass.GENERAL,
        cores=48,
        clusters=4,  # four clusters of 12 cores
        mem_gib=192.0,
        accel=0,
        iops_k=300.0,
        perf=0.8,
        power=PowerModel(idle_w=70.0, peak_w=200.0, parked_w=6.0, wake_latency_s=60.0),
        hal="pcie-hotplug",
    ),
    _NodeType(
        prefix="ai-x86",
        count=8,
        arch=Arch.X86_64,
        server_class=ServerClass.AI_ACCELERATOR,
        cores=64,
        clusters=2,
        mem_gib=512.0,
        accel=8,
        iops_k=800.0,
        perf=1.0,
        # the x86 general server's CPU side, plus 8 accelerators of the A30 class (165 W
        # board power each, about 25 W idle): docs/power.md
        power=PowerModel.per_resource(
            180.0,
            420.0,
            accel_devices=8,
            accel_idle_w_per_device=25.0,
            accel_peak_w_per_device=165.0,
            parked_w=20.0,
            wake_latency_s=180.0,
        ),
        hal="nvlink",
    ),
    _NodeType(
        prefix="ai-arm",
        count=4,
        arch=Arch.ARM64,
        server_class=ServerClass.AI_ACCELERATOR,
        cores=80,
        clusters=4,
        mem_gib=256.0,
        accel=4,
        iops_k=400.0,
        perf=0.8,
        # an 80-core arm64 server's CPU side, plus 4 accelerators as above: docs/power.md
        power=PowerModel.per_resource(
            90.0,
            300.0,
            accel_devices=4,
            accel_idle_w_per_device=25.0,
            accel_peak_w_per_device=165.0,
            parked_w=15.0,
            wake_latency_s=120.0,
        ),
        hal="cxl",
    ),
    _NodeType(
        prefix="sto-x86",
        count=6,
        arch=Arch.X86_64,
        server_class=ServerClass.STORAGE_DENSE,
        cores=32,
        clusters=1,
        mem_gib=128.0,
        accel=0,
        iops_k=2000.0,
        perf=1.0,
        power=PowerModel(idle_w=150.0, peak_w=350.0, parked_w=15.0, wake_latency_s=120.0),
        hal="nvme-passthrough",
    ),
)


def _make_node(kind: _NodeType, node_id: str) -> Node:
    capacity = Resources(
        cpu=float(kind.cores), mem_gib=kind.mem_gib, accel=kind.accel, iops_k=kind.iops_k
    )
    return Node(
        id=node_id,
        arch=kind.arch,
        server_class=kind.server_class,
        capacity=capacity,
        power=kind.power,
        topology=CoreTopology.uniform(kind.cores, kind.clusters),
        perf=kind.perf,
        site="campus",
        labels={"pool": kind.prefix, "hal": kind.hal},
    )


def server_types() -> dict[str, _NodeType]:
    """The campus's server types by prefix (hardware and power model), for generators that
    build fleets of their own (``core/workloadgen.py``)."""
    return {t.prefix: t for t in _NODE_TYPES}


def arm48_node(node_id: str = "arm48") -> Node:
    """A 48-core ARM general server (4 clusters of 12 cores, 192 GiB), as in the article."""
    return _make_node(_NODE_TYPES[1], node_id)


def _scaled_count(count: int, scale: float) -> int:
    """``count * scale`` rounded half up, at least 1."""
    return max(1, math.floor(count * scale + 0.5))


def campus_fleet(scale: float = 1.0) -> tuple[Node, ...]:
    """The campus's nodes, all ACTIVE, sorted by id; ``scale`` multiplies every node count."""
    _check_scale(scale)
    nodes: list[Node] = []
    for kind in _NODE_TYPES:
        n = _scaled_count(kind.count, scale)
        width = max(2, len(str(n)))
        nodes.extend(_make_node(kind, f"{kind.prefix}-{i:0{width}d}") for i in range(1, n + 1))
    return tuple(sorted(nodes, key=lambda node: node.id))


# --------------------------------------------------------------------------------------------
# The scenario


@dataclass(frozen=True, slots=True)
class CampusScenario:
    """A generated campus scenario: fleet, tasks, classes and tariff for ``days`` days.

    ``tasks`` are sorted by ``(submitted_at, id)``; tasks listed in ``carried_over`` were
    already running at ``t = 0`` (warm start) and carry their *remaining* duration.
    """

    nodes: tuple[Node, ...]
    tasks: tuple[Task, ...]
    classes: Mapping[str, WorkloadClass]
    tariff: Tariff
    days: float
    seed: int
    assumptions: tuple[str, ...]
    scale: float = 1.0
    carried_over: frozenset[str] = frozenset()
    #: The CPU asked in 5-minute means over the :data:`PRIOR_S` before midnight (the
    #: previous evening of the warm start; None without one): the history a live central's
    #: store would hold, which the simulator's forecast starts from.
    demand_prior: DemandHistory | None = None

    @property
    def fleet_cpu(self) -> float:
        return sum(node.capacity.cpu for node in self.nodes)

    @property
    def horizon_s(self) -> float:
        return self.days * SECONDS_PER_DAY


def _check_scale(scale: float) -> None:
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale}")


def _rate_noise(rng: np.random.Generator, n_bins: int) -> FloatArray:
    """Mean-one log-normal AR(1) noise over ``n_bins`` bins (correlation NOISE_CORRELATION_S)."""
    rho = math.exp(-BIN_S / NOISE_CORRELATION_S)
    eps = rng.standard_normal(n_bins)
    x = np.empty(n_bins, dtype=np.float64)
    x[0] = eps[0]
    scale = math.sqrt(1.0 - rho * rho)
    for i in range(1, n_bins):
        x[i] = rho * x[i - 1] + scale * eps[i]
    return np.exp(NOISE_SIGMA * x - NOISE_SIGMA**2 / 2.0)


def _arrivals(
    rng: np.random.Generator, rate: FloatArray, start_s: float, end_s: float
) -> FloatArray:
    """Sorted arrival times of a Poisson process with per-bin ``rate`` on [start_s, end_s).

    ``rate[k]`` applies to the bin ``[start_s + k * BIN_S, start_s + (k + 1) * BIN_S)``.
    """
    n_bins = rate.size
    lo = start_s + np.arange(n_bins, dtype=np.float64) * BIN_S
    width = np.clip(end_s - lo, 0.0, BIN_S)
    counts = rng.poisson(rate * width)
    bin_of = np.repeat(np.arange(n_bins), counts)
    times = lo[bin_of] + rng.random(bin_of.size) * width[bin_of]
    return np.sort(times)


def _day_noise(rng: np.random.Generator, base_rate: FloatArray, n_days: int) -> FloatArray:
    """Noisy per-bin rates for ``n_days`` consecutive days, each renormalised to its base work."""
    noise = _rate_noise(rng, n_days * BINS_PER_DAY).reshape(n_days, BINS_PER_DAY)
    noisy = noise * base_rate[None, :]
    total = float(base_rate.sum())
    if total > 0:
        noisy *= total / noisy.sum(axis=1, keepdims=True)
    return noisy.reshape(-1)


def _class_tasks(
    wc: WorkloadClass,
    stream: int,
    seed: int,
    days: float,
    warm_start: bool,
) -> tuple[list[Task], list[str], tuple[FloatArray, FloatArray, FloatArray]]:
    """Tasks of one class, the ids of its carried-over tasks, and the arrival times,
    durations and cores of the previous evening's tasks (none without a warm start).

    The class draws from its own random streams: one for the scenario's days and one for the
    warm-start evening, so that turning the warm start off only removes the carried tasks.
    """
    base_rate = np.asarray(arrival_rate_curve(wc), dtype=np.float64)
    n_days = math.ceil(days)
    rng = np.random.default_rng([seed, stream, 0])
    times, cpu, accel, durations = _draw(
        rng, wc, _day_noise(rng, base_rate, n_days), 0.0, days * SECONDS_PER_DAY
    )
    carried = np.zeros(times.size, dtype=bool)
    empty = np.zeros(0, dtype=np.float64)
    past: tuple[FloatArray, FloatArray, FloatArray] = (empty, empty, empty)
    if warm_start:
        # The previous evening: arrivals in [-WARM_START_S, 0) still running at midnight are
        # submitted at 0 with their remaining duration.
        warm_days = math.ceil(WARM_START_S / SECONDS_PER_DAY)
        warm_rng = np.random.default_rng([seed, stream, 1])
        w_times, w_cpu, w_accel, w_durations = _draw(
            warm_rng,
            wc,
            _day_noise(warm_rng, base_rate, warm_days),
            -warm_days * SECONDS_PER_DAY,
            0.0,
        )
        past = (w_times, w_durations, w_cpu.astype(np.float64))
        running = (w_times >= -WARM_START_S) & (w_times + w_durations > 0.0)
        times = np.concatenate([np.zeros(int(running.sum())), times])
        durations = np.concatenate([(w_times + w_durations)[running], durations])
        cpu = np.concatenate([w_cpu[running], cpu])
        accel = np.concatenate([w_accel[running], accel])
        carried = np.concatenate([np.ones(int(running.sum()), dtype=bool), carried])

    images = wc.images
    tasks: list[Task] = []
    carried_ids: list[str] = []
    n_arrived = 0
    n_carried = 0
    for t, d, c, a, is_carried in zip(
        (np.floor(times * 1000.0) / 1000.0).tolist(),  # ms, never rounded up to the horizon
        np.maximum(np.round(durations, 3), 0.001).tolist(),
        cpu.tolist(),
        accel.tolist(),
        carried.tolist(),
        strict=True,
    ):
        if is_carried:
            n_carried += 1
            task_id = f"{wc.code}-carry-{n_carried:05d}"
            carried_ids.append(task_id)
        else:
            n_arrived += 1
            task_id = f"{wc.code}-{n_arrived:06d}"
        cores = float(c)
        tasks.append(
            Task(
                id=task_id,
                workload=wc.name,
                priority=wc.priority,
                demand=Resources(
                    cpu=cores, mem_gib=cores * wc.mem_gib_per_cpu, accel=int(a), iops_k=wc.iops_k
                ),
                submitted_at=float(t),
                duration_s=float(d),
                archs=wc.archs,
                images=images,
                server_classes=wc.server_classes,
                preemptible=wc.preemptible,
                migratable=wc.migratable,
                threads=round(cores),
            )
        )
    return tasks, carried_ids, past


def _draw(
    rng: np.random.Generator, wc: WorkloadClass, rates: FloatArray, start_s: float, end_s: float
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.int64], FloatArray]:
    """Arrival times, cores, accelerators and durations of the class's tasks on [start, end)."""
    times = _arrivals(rng, rates, start_s, end_s)
    n = times.size
    cpu = rng.choice(np.asarray(wc.cpu_choices, dtype=np.float64), size=n, p=_probs(wc.cpu_weights))
    if wc.accel_choices:
        accel = rng.choice(
            np.asarray(wc.accel_choices, dtype=np.int64), size=n, p=_probs(wc.accel_weights)
        )
    else:
        accel = np.zeros(n, dtype=np.int64)
    durations = rng.lognormal(math.log(wc.duration_median_s), wc.duration_sigma, size=n)
    return times, cpu, accel, durations


def _probs(weights: tuple[float, ...]) -> FloatArray:
    w = np.asarray(weights, dtype=np.float64)
    probs: FloatArray = w / w.sum()
    return probs


def _assumptions(classes: Mapping[str, WorkloadClass], fleet_cpu: float) -> tuple[str, ...]:
    mean_total = sum(wc.mean_demand for wc in classes.values())
    peaks = sum(wc.peak_demand for wc in classes.values())
    lines = [
        "Fleet: the article's mixed cluster of three architectures read as x86_64 and arm64 "
        "general servers (the arm64 ones are the article's 48-core ARM, 4 clusters of 12 cores) "
        "and AI-accelerator servers of both architectures, plus storage-dense x86_64 servers; "
        "at scale 1: 16 x86 general, 16 ARM general, 8 x86 AI, 4 ARM AI, 6 storage-dense "
        f"({fleet_cpu:.0f} cores). Node power: linear model with an idle floor, parked power and "
        "a wake-up latency per server type.",
        f"Demand level: mean total CPU demand is {TARGET_UTILIZATION:.0%} of fleet CPU capacity, "
        "calibrated to the utilization the article reports before its scheduler (42%); the sum "
        f"of the five classes' peak demands is {peaks / fleet_cpu:.0%} of capacity, so a static "
        "partition giving each class servers sized to its own peak is feasible. Realized "
        "5-minute class peaks run 5-40% above the expected ones (Poisson arrivals of few, "
        "large tasks), so such a partition queues in bursts.",
        f"Mean total demand {mean_total:.0f} cores of {fleet_cpu:.0f}; demand is counted in "
        "cores regardless of architecture (ARM cores are slower, perf 0.8, but a task asks for "
        "the same number of cores everywhere).",
        "Time of day follows the article: face recognition peaks 07:00-09:00 at the gates "
        "(smaller peak 17:00-19:00), video conferencing 09:00-12:00 and 14:00-17:00, cloud "
        "desktops in working hours 09:00-18:00, AI training 12:30-14:00 and at night, "
        "security-video analytics at night 22:00-06:00. Peak heights are ours (the article "
        "gives the capacity shares of its policy, not the demand).",
        "Every day is a campus weekday; days differ only by a seeded log-normal noise on the "
        f"arrival rate (sigma {NOISE_SIGMA}, correlation {NOISE_CORRELATION_S / 60:.0f} min), "
        "renormalised so that each day's expected work is the same.",
        "Arrivals: non-homogeneous Poisson per class, piecewise constant per 5-minute bin, rate "
        "= demand(t + mean residual duration) / (mean cores per task * mean duration), so the "
        "expected cores in use follow the demand curve (Little's law).",
        "Durations: lognormal per class, every task finite. Face recognition is short (median "
        "24 s); meetings, desktop sessions, training and analytics jobs last tens of minutes. "
        "The overall mix has a median of tens of seconds and a p99 of tens of minutes, like the "
        "Alibaba 2018 trace (median 10 s, p90 148 s, p99 741 s), though its p90 is longer "
        "because a campus's interactive sessions carry most of the work.",
        "Task count is kept near 60k per day at scale 1 (the simulator must run a day in "
        "seconds); with the article's demand level, few-task short-median workloads force the "
        "long classes to tens of minutes rather than hours.",
        "Placement constraints: face recognition, conferencing, training and analytics ship "
        "arm64 and x86_64 images; cloud desktops are x86_64 only; AI training needs an "
        "AI-accelerator server and 1-2 accelerators; video analytics needs 25k IOPS per task "
        "(every server has local NVMe, storage-dense servers the most).",
        "Conferencing and desktop sessions are live: migratable, not preemptible. Face "
        "recognition is the top priority and not preemptible. Training (checkpointed) and "
        "analytics are preemptible.",
        "Warm start: the scenario begins in steady state; tasks still running at midnight from "
        "the simulated previous evening are submitted at t = 0 with their remaining duration.",
        "Electricity: time-of-use tariff, 0.08/kWh 23:00-07:00, 0.24 08:00-11:00 and "
        "17:00-21:00, 0.14 otherwise.",
    ]
    return tuple(lines)


def campus_scenario(
    seed: int = 0, days: float = 1.0, scale: float = 1.0, *, warm_start: bool = True
) -> CampusScenario:
    """Generate the campus scenario: a pure function of its arguments.

    ``seed`` (>= 0) seeds every random draw; ``days`` (> 0, may be fractional) is the span of
    arrivals; ``scale`` (> 0) multiplies node counts, and demand follows the fleet's capacity.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    seed = int(seed)
    if not (math.isfinite(days) and days > 0):
        raise ValueError(f"days must be a finite number > 0, got {days}")
    _check_scale(scale)

    nodes = campus_fleet(scale)
    fleet_cpu = sum(node.capacity.cpu for node in nodes)
    classes = workload_classes(fleet_cpu)
    tasks: list[Task] = []
    carried: list[str] = []
    pasts: list[tuple[FloatArray, FloatArray, FloatArray]] = []
    for stream, wc in enumerate(classes.values()):
        class_tasks, class_carried, past = _class_tasks(wc, stream, seed, days, warm_start)
        tasks.extend(class_tasks)
        carried.extend(class_carried)
        pasts.append(past)
    tasks.sort(key=lambda task: (task.submitted_at, task.id))
    starts, durations, cores = (np.concatenate(column) for column in zip(*pasts, strict=True))
    prior = asked_history(starts, durations, cores, -PRIOR_S, 0.0, BIN_S) if warm_start else None
    return CampusScenario(
        nodes=nodes,
        tasks=tuple(tasks),
        classes=classes,
        tariff=campus_tariff(),
        days=float(days),
        seed=seed,
        assumptions=_assumptions(classes, fleet_cpu),
        scale=float(scale),
        carried_over=frozenset(carried),
        demand_prior=prior,
    )
