"""The scheduling core's data model: nodes, tasks, placements and decisions.

Plain frozen dataclasses, no I/O and no clock. Every tier (central, edge, simulator) builds
these from its own state and hands them to :class:`edgesched.core.scheduler.Scheduler`.
Times are seconds on the caller's clock (the simulator's or the wall clock); the core never
reads a clock itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from edgesched.core.shared import SharedValues, exact_zero_free

SECONDS_PER_DAY = 86_400.0
#: Task priorities are integers in [0, MAX_PRIORITY]; higher wins.
MAX_PRIORITY = 999


class Arch(StrEnum):
    """CPU architecture of a node, and what a task's image can run on."""

    ARM64 = "arm64"
    X86_64 = "x86_64"


class ServerClass(StrEnum):
    """The three server classes of the hardware abstraction layer."""

    GENERAL = "general"
    AI_ACCELERATOR = "ai-accelerator"
    STORAGE_DENSE = "storage-dense"


class NodeState(StrEnum):
    """Power state of a node as the scheduler sees it."""

    ACTIVE = "active"
    PARKED = "parked"
    WAKING = "waking"


class DecisionKind(StrEnum):
    """What a decision asks the executing tier to do."""

    PLACE = "place"
    PREEMPT = "preempt"
    MIGRATE = "migrate"
    PARK = "park"
    WAKE = "wake"
    PIN = "pin"


@dataclass(frozen=True, slots=True)
class Resources:
    """A vector of schedulable resources: CPU cores, memory (GiB), accelerators, storage IOPS.

    ``accel`` counts whole accelerators; ``accel_slices`` counts slices of one (MIG
    instances, SR-IOV virtual functions, time-slicing shares; see
    :mod:`edgesched.core.slices`): a node's capacity sums its devices' slices (0: it offers
    none), a task's demand is the slices it asks of one device (0 for a whole-device task)."""

    cpu: float = 0.0
    mem_gib: float = 0.0
    accel: int = 0
    iops_k: float = 0.0
    accel_slices: int = 0

    def __post_init__(self) -> None:
        for name in ("cpu", "mem_gib", "accel", "iops_k", "accel_slices"):
            if getattr(self, name) < 0:
                raise ValueError(f"resource {name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def shared(cls, cpu: float, mem_gib: float, accel: int) -> Resources:
        """``Resources(cpu, mem_gib, accel)``, one shared copy per value (central builds one
        for every task of the fleet, and most tasks ask for one of a few sizes)."""
        demand = cls(cpu=cpu, mem_gib=mem_gib, accel=accel)
        exact = type(cpu) is float and type(mem_gib) is float and type(accel) is int
        if exact and exact_zero_free(cpu, mem_gib):
            return _RESOURCES(demand)
        return demand

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu + other.cpu,
            self.mem_gib + other.mem_gib,
            self.accel + other.accel,
            self.iops_k + other.iops_k,
            self.accel_slices + other.accel_slices,
        )

    def fits_in(self, capacity: Resources) -> bool:
        """True when every component of ``self`` is within ``capacity`` (with float slack)."""
        eps = 1e-9
        return (
            self.cpu <= capacity.cpu + eps
            and self.mem_gib <= capacity.mem_gib + eps
            and self.accel <= capacity.accel
            and self.iops_k <= capacity.iops_k + eps
            and self.accel_slices <= capacity.accel_slices
        )


_RESOURCES: SharedValues[Resources] = SharedValues()


@dataclass(frozen=True, slots=True)
class PowerModel:
    """Linear power model per resource, with idle floors, plus parked (sleep) power and
    wake-up latency.

    ``idle_w`` and ``peak_w`` are the whole node's draw, idle and with everything busy (what
    configs and node documents have always carried). ``accel_idle_w`` and ``accel_peak_w``
    are the part of those two figures that the node's accelerators draw, all devices
    together (0 and 0: the model does not split them out). The CPU side (cores, memory,
    fans, the rest of the board) is what is left: :attr:`cpu_idle_w` and :attr:`cpu_peak_w`.

    While the node is active, at CPU utilization ``u`` and accelerator utilization ``a``
    (each clamped to [0, 1]; see :meth:`draw`)::

        idle_w + (cpu_peak_w - cpu_idle_w) * u + (accel_peak_w - accel_idle_w) * a

    so CPU-only work on an accelerator server draws CPU power only. A model that does not
    split (``accel_peak_w == 0``) keeps the older single-utilization rule,
    ``idle_w + (peak_w - idle_w) * max(u, a)``. ``parked_w`` while parked. Work per watt at
    full load is ``cores / peak_w`` scaled by ``perf`` (relative per-core throughput).
    """

    idle_w: float
    peak_w: float
    parked_w: float = 10.0
    wake_latency_s: float = 60.0
    accel_idle_w: float = 0.0
    accel_peak_w: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.parked_w <= self.idle_w <= self.peak_w:
            raise ValueError(
                "power model needs 0 <= parked_w <= idle_w <= peak_w, got "
                f"parked_w={self.parked_w} idle_w={self.idle_w} peak_w={self.peak_w}"
            )
        if self.wake_latency_s < 0:
            raise ValueError("wake_latency_s must be >= 0")
        if not 0 <= self.accel_idle_w <= self.accel_peak_w:
            raise ValueError(
                "power model needs 0 <= accel_idle_w <= accel_peak_w, got "
                f"accel_idle_w={self.accel_idle_w} accel_peak_w={self.accel_peak_w}"
            )
        slack = 1e-9 * max(self.peak_w, 1.0)
        if (
            self.accel_idle_w > self.idle_w + slack
            or self.accel_dynamic_w > self.peak_w - self.idle_w + slack
        ):
            raise ValueError(
                "the accelerators' share cannot exceed the node's: accel_idle_w <= idle_w "
                "and accel_peak_w - accel_idle_w <= peak_w - idle_w"
            )

    @classmethod
    def per_resource(
        cls,
        cpu_idle_w: float,
        cpu_peak_w: float,
        *,
        accel_devices: int = 0,
        accel_idle_w_per_device: float = 0.0,
        accel_peak_w_per_device: float = 0.0,
        parked_w: float = 10.0,
        wake_latency_s: float = 60.0,
    ) -> PowerModel:
        """A model from the CPU side's figures and each accelerator's (idle and busy)."""
        accel_idle = accel_devices * accel_idle_w_per_device
        accel_peak = accel_devices * accel_peak_w_per_device
        return cls(
            idle_w=cpu_idle_w + accel_idle,
            peak_w=cpu_peak_w + accel_peak,
            parked_w=parked_w,
            wake_latency_s=wake_latency_s,
            accel_idle_w=accel_idle,
            accel_peak_w=accel_peak,
        )

    @property
    def split(self) -> bool:
        """Whether the accelerators' draw is modelled apart from the CPU side's."""
        return self.accel_peak_w > 0

    @property
    def accel_dynamic_w(self) -> float:
        """Watts the accelerators add between idle and all busy."""
        return self.accel_peak_w - self.accel_idle_w

    @property
    def cpu_idle_w(self) -> float:
        return self.idle_w - self.accel_idle_w

    @property
    def cpu_peak_w(self) -> float:
        return self.peak_w - self.accel_peak_w

    def power(self, utilization: float) -> float:
        """Active power draw (W) with every resource at ``utilization`` (clamped to [0, 1]):
        ``idle_w + (peak_w - idle_w) * utilization``. For CPU and accelerators apart, use
        :meth:`draw`."""
        u = min(max(utilization, 0.0), 1.0)
        return self.idle_w + (self.peak_w - self.idle_w) * u

    def draw(self, cpu: float, accel: float = 0.0) -> float:
        """Active power draw (W) at CPU utilization ``cpu`` and accelerator utilization
        ``accel`` (each clamped to [0, 1]), per the rule in the class docstring."""
        u = min(max(cpu, 0.0), 1.0)
        a = min(max(accel, 0.0), 1.0)
        if not self.split:
            return self.power(max(u, a))
        return self.idle_w + (self.cpu_peak_w - self.cpu_idle_w) * u + self.accel_dynamic_w * a


@dataclass(frozen=True, slots=True)
class CoreTopology:
    """A node's cores grouped into clusters (ARM core clusters, or NUMA nodes on x86).

    ``clusters`` holds the core ids of each cluster; ids are unique across clusters.
    """

    clusters: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for cluster in self.clusters:
            if not cluster:
                raise ValueError("a core cluster must hold at least one core")
            for core in cluster:
                if core in seen:
                    raise ValueError(f"core {core} appears in more than one cluster")
                seen.add(core)

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(c for cluster in self.clusters for c in cluster)

    @classmethod
    def uniform(cls, cores: int, clusters: int = 1) -> CoreTopology:
        """``cores`` cores split evenly over ``clusters`` clusters (the last takes the rest)."""
        if cores < 1 or clusters < 1 or clusters > cores:
            raise ValueError(f"need 1 <= clusters <= cores, got cores={cores} clusters={clusters}")
        size = cores // clusters
        groups = [tuple(range(i * size, (i + 1) * size)) for i in range(clusters - 1)]
        groups.append(tuple(range((clusters - 1) * size, cores)))
        return cls(tuple(groups))


@dataclass(frozen=True, slots=True)
class Node:
    """A server as the scheduler sees it.

    ``perf`` is the relative per-core throughput (1.0 = reference core); the energy policy
    scores work per watt as ``perf * cpu / peak_w``. ``ready_at`` is when a WAKING node becomes
    ACTIVE; ``idle_since`` is when an ACTIVE node last became empty (None while it runs work).
    """

    id: str
    arch: Arch
    server_class: ServerClass
    capacity: Resources
    power: PowerModel
    topology: CoreTopology | None = None
    perf: float = 1.0
    site: str = "default"
    state: NodeState = NodeState.ACTIVE
    ready_at: float = 0.0
    idle_since: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("node id must not be empty")
        if self.capacity.cpu <= 0:
            raise ValueError(f"node {self.id}: capacity.cpu must be > 0")
        if self.perf <= 0:
            raise ValueError(f"node {self.id}: perf must be > 0")

    @property
    def efficiency(self) -> float:
        """Work per watt at full load: ``perf * cores / peak_w``."""
        return self.perf * self.capacity.cpu / self.power.peak_w


#: The images of a task without any: one empty mapping shared by every such task, never
#: written to (as a spec's, :mod:`edgesched.core.task`).
NO_IMAGES: Mapping[Arch, str] = {}


@dataclass(frozen=True, slots=True)
class Task:
    """A unit of work to place.

    ``archs`` lists the architectures the task can run on (empty = any); ``images`` maps an
    architecture to the image to run there (a task with images can run only where one exists).
    ``server_classes`` restricts the classes it may run on (empty = any). ``duration_s`` is None
    for a service (runs until cancelled). Higher ``priority`` wins.
    """

    id: str
    workload: str
    priority: int
    demand: Resources
    submitted_at: float = 0.0
    duration_s: float | None = None
    archs: frozenset[Arch] = frozenset()
    #: (no images: one shared empty mapping, not a dict per task: central builds a Task for
    #: every task of the fleet)
    images: Mapping[Arch, str] = field(default_factory=lambda: NO_IMAGES)
    server_classes: frozenset[ServerClass] = frozenset()
    preemptible: bool = True
    migratable: bool = False
    threads: int = 0

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("task id must not be empty")
        if not 0 <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"task {self.id}: priority must be in [0, {MAX_PRIORITY}]")
        if self.duration_s is not None and self.duration_s < 0:
            raise ValueError(f"task {self.id}: duration_s must be >= 0")

    def runs_on(self, arch: Arch) -> bool:
        """Whether an image/architecture constraint admits ``arch``."""
        if self.archs and arch not in self.archs:
            return False
        return not self.images or arch in self.images

    def image_for(self, arch: Arch) -> str | None:
        return self.images.get(arch)


@dataclass(frozen=True, slots=True)
class Placement:
    """A task running (or starting) on a node since ``started_at``."""

    task: Task
    node_id: str
    started_at: float


@dataclass(frozen=True, slots=True)
class Decision:
    """One scheduling decision with the scores and reason that made it.

    ``node_id`` is the target node (for MIGRATE, ``from_node`` is the source); ``cores`` is set
    for PIN decisions.
    """

    kind: DecisionKind
    node_id: str
    reason: str
    at: float
    task_id: str | None = None
    from_node: str | None = None
    image: str | None = None
    cores: tuple[int, ...] = ()
    scores: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view (used by logs, the store and the REST API)."""
        out: dict[str, object] = {
            "kind": self.kind.value,
            "node": self.node_id,
            "reason": self.reason,
            "at": self.at,
        }
        if self.task_id is not None:
            out["task"] = self.task_id
        if self.from_node is not None:
            out["from"] = self.from_node
        if self.image is not None:
            out["image"] = self.image
        if self.cores:
            out["cores"] = list(self.cores)
        if self.scores:
            out["scores"] = {k: round(v, 6) for k, v in sorted(self.scores.items())}
        return out
