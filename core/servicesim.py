"""Services in the campus simulation: classes served by replicas whose count follows the day.

Face recognition and video conferencing are modelled as *services* here rather than as one
task per request. A service runs replicas; each replica is a long-running task of
``replica_cores`` cores on the fleet. The service's requests (the campus tasks of its class,
same arrivals, cores and durations) run inside the replicas. Three ways to size a service:

* ``fixed``: a deployment sized for the day's peak, ``ceil(peak / target_per_replica)``
  replicas all day. The peak is the highest 5-minute mean load of the day (hindsight).
* ``load``: :func:`edgesched.core.service.recommend` with ``metric = "load"``, every
  ``decide_s`` seconds.
* ``forecast``: the same rule with ``metric = "forecast"``. It reads the higher of the load
  and the 15-minute forecast's peak of the service's 5-minute load history.

The model, explicitly:

* **Load.** The *offered* load: the cores the service's requests would use if each ran on
  arrival, which does not depend on how they are served. The autoscaler reads its mean over
  the last ``decide_s`` seconds. The forecaster reads 5-minute means, the bins closed so far.
  The first decision, at ``t = 0``, reads the first ``decide_s`` (the warm start).
* **Replicas.** Scaling out to ``n`` starts slots ``current .. n - 1``; a new replica serves
  ``ready_s`` after the decision. Scaling in drains slots ``n ..``, highest first as
  :func:`edgesched.core.service.plan` does: a draining replica takes no new request and stops
  when its last request ends. A replica counts for replica-hours (and holds its cores on the
  fleet) from the decision that started it to its stop.
* **Serving.** A request runs on one replica whose free cores fit it, the lowest slot first.
  Requests that fit nowhere wait in one first-in, first-out queue per service (the head blocks
  the rest). A request whose wait exceeds its class's ``slo_wait_s`` misses its SLO, and so
  does one still waiting at the end. A request runs for its own duration once started: the
  model charges overload as waiting, not as slower requests.
* **Fleet and energy.** Each replica becomes one task of the fleet, submitted at its decision
  and lasting until its stop, with the class's priority and constraints. :func:`fleet_scenario`
  puts these tasks in place of the service's requests, and the simulator runs it for energy
  (:func:`edgesched.core.simulator.simulate`). The simulator charges dynamic power on the cores
  a task is allocated; a replica draws it only for the share of its cores that its requests
  filled (``draw``). The serving model assumes every replica is on a node ``ready_s`` after its
  decision, and the fleet's report says how long the replicas actually waited.

Pure: plain values in, plain values out.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from edgesched.core.forecast import DemandHistory
from edgesched.core.model import SECONDS_PER_DAY, Node, Resources, Task
from edgesched.core.service import Autoscale, ScaleState, ServiceSpec, recommend
from edgesched.core.simulator import TariffLike, WorkloadClassLike, heuristic_peak
from edgesched.core.task import RestartPolicy, TaskSpec

__all__ = [
    "BIN_S",
    "STRATEGIES",
    "CampusLike",
    "Decision",
    "FleetScenario",
    "Lead",
    "PeakForecast",
    "ReplicaRun",
    "Request",
    "Served",
    "ServiceModel",
    "ServiceRun",
    "campus_services",
    "fleet_scenario",
    "morning_lead",
    "offered_load",
    "replica_counts",
    "requests_of",
    "run_service",
    "serve",
    "size_services",
]

FloatArray = npt.NDArray[np.float64]

#: Width of the forecaster's bins (5-minute means), seconds.
BIN_S = 300.0
STRATEGIES = ("fixed", "load", "forecast")

#: The 15-minute peak forecast of one workload's 5-minute load history (None: no forecast).
PeakForecast = Callable[[str, DemandHistory], float | None]


def _heuristic(workload: str, history: DemandHistory) -> float | None:
    return heuristic_peak(history)


class ServiceClassLike(WorkloadClassLike, Protocol):
    """What the service model reads of a campus class beyond the simulator's view."""

    @property
    def mem_gib_per_cpu(self) -> float: ...


class CampusLike(Protocol):
    """What :func:`fleet_scenario` reads of a scenario (the campus's fields)."""

    @property
    def nodes(self) -> tuple[Node, ...]: ...
    @property
    def tasks(self) -> tuple[Task, ...]: ...
    @property
    def classes(self) -> Mapping[str, ServiceClassLike]: ...
    @property
    def tariff(self) -> TariffLike: ...
    @property
    def days(self) -> float: ...


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """One service: the class it serves, its replica's size and its autoscaling target
    (cores of load a replica is meant to carry, below ``replica_cores`` to leave headroom
    for the minute's bursts), the replica start time, the count's bounds and the scaling
    rule's limits (as :class:`edgesched.core.service.Autoscale`)."""

    name: str
    workload: str
    replica_cores: float = 16.0
    target_per_replica: float = 12.0
    ready_s: float = 10.0
    min_replicas: int = 1
    max_replicas: int = 200
    decide_s: float = 60.0
    scale_in_delay_s: float = 300.0
    max_step_out: int = 4
    max_step_in: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.target_per_replica <= self.replica_cores:
            raise ValueError("target_per_replica must be in (0, replica_cores]")
        if self.ready_s < 0 or self.decide_s <= 0:
            raise ValueError("ready_s must be >= 0 and decide_s > 0")

    def spec(self, metric: str, replicas: int) -> ServiceSpec:
        """The service object the autoscaler reads (its template is the replica's task)."""
        template = TaskSpec(
            id=self.name,
            command=("serve",),
            workload=self.workload,
            cpu=self.replica_cores,
            restart=RestartPolicy.ALWAYS,
        )
        rule = Autoscale(
            metric=metric,
            target_per_replica=self.target_per_replica,
            scale_in_delay_s=self.scale_in_delay_s,
            max_step_out=self.max_step_out,
            max_step_in=self.max_step_in,
        )
        count = min(max(replicas, self.min_replicas), self.max_replicas)
        return ServiceSpec(
            self.name, template, count, self.min_replicas, self.max_replicas, autoscale=rule
        )

    def replicas_for(self, load: float) -> int:
        """``ceil(load / target)`` within the bounds (the fixed deployment's rule)."""
        want = math.ceil(load / self.target_per_replica - 1e-9)
        return min(max(want, self.min_replicas), self.max_replicas)


def campus_services() -> tuple[ServiceModel, ServiceModel]:
    """The campus's two services: face recognition (4-core requests, 4 a replica) and video
    conferencing (2-4-core sessions), each on 16-core replicas filled to 12 cores."""
    return (
        ServiceModel("face-recognition", "face-recognition"),
        ServiceModel("video-conferencing", "video-conferencing"),
    )


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a service: when it arrives, how many cores it needs, for how long."""

    at: float
    cores: float
    duration_s: float


def requests_of(tasks: Iterable[Task], workload: str) -> tuple[Request, ...]:
    """The campus tasks of ``workload`` as requests, in arrival order."""
    out = [
        Request(t.submitted_at, t.demand.cpu, t.duration_s or 0.0)
        for t in tasks
        if t.workload == workload
    ]
    out.sort(key=lambda r: r.at)
    return tuple(out)


def offered_load(requests: Sequence[Request], edges: FloatArray) -> FloatArray:
    """Mean cores in use between consecutive ``edges`` had every request run on arrival."""
    start = np.array([r.at for r in requests], dtype=np.float64)
    cores = np.array([r.cores for r in requests], dtype=np.float64)
    end = start + np.array([r.duration_s for r in requests], dtype=np.float64)

    def integral(at: FloatArray) -> FloatArray:
        """Core-seconds by each edge of requests starting at ``at`` and never ending."""
        order = np.argsort(at, kind="stable")
        xs, cs = at[order], cores[order]
        a = np.concatenate([[0.0], np.cumsum(cs)])
        b = np.concatenate([[0.0], np.cumsum(cs * xs)])
        k = np.searchsorted(xs, edges, side="left")
        r: FloatArray = edges * a[k] - b[k]
        return r

    if not requests:
        return np.zeros(max(edges.size - 1, 0))
    out: FloatArray = np.diff(integral(start) - integral(end)) / np.diff(edges)
    return np.maximum(out, 0.0)


def _bins(requests: Sequence[Request], horizon_s: float) -> FloatArray:
    """The 5-minute mean offered loads over ``[0, horizon_s)``."""
    n_bins = math.ceil(horizon_s / BIN_S - 1e-9)
    return offered_load(requests, np.arange(n_bins + 1, dtype=np.float64) * BIN_S)


@dataclass(frozen=True, slots=True)
class Decision:
    """The replica count from ``t`` on, and why (``fixed``, ``manual``, ``load``, ``forecast``)."""

    t: float
    replicas: int
    reason: str


def replica_counts(
    model: ServiceModel,
    requests: Sequence[Request],
    horizon_s: float,
    strategy: str,
    forecast: PeakForecast = _heuristic,
) -> tuple[Decision, ...]:
    """The replica count over ``[0, horizon_s)``: one decision every ``model.decide_s``
    (``fixed``: one decision at 0, sized for the day's highest 5-minute load)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    bins = _bins(requests, horizon_s)
    if strategy == "fixed":
        day_peak = float(bins.max()) if bins.size else 0.0
        return (Decision(0.0, model.replicas_for(day_peak), "fixed"),)
    step = model.decide_s
    n = math.ceil(horizon_s / step - 1e-9)
    times = np.arange(n, dtype=np.float64) * step
    minute = offered_load(requests, np.arange(n + 1, dtype=np.float64) * step)
    # the load at decision k: the mean over the previous decide_s (at 0: the first one)
    loads = np.concatenate([minute[:1], minute[:-1]])
    spec = model.spec(strategy, model.replicas_for(float(loads[0])))
    state = ScaleState()
    out = [Decision(0.0, spec.replicas, "initial")]
    cached: tuple[int, float | None] = (-1, None)
    for k in range(1, n):
        t = float(times[k])
        peak: float | None = None
        if strategy == "forecast":
            closed = int(t // BIN_S)
            if closed != cached[0]:
                fc = None
                if closed > 0:
                    hist = DemandHistory(BIN_S, tuple(bins[:closed].tolist()), closed * BIN_S)
                    fc = forecast(model.workload, hist)
                cached = (closed, fc)
            peak = cached[1]
        rec = recommend(spec, float(loads[k]), peak, state, t)
        state = rec.state
        if rec.replicas != spec.replicas:
            spec = spec.with_replicas(rec.replicas)
            out.append(Decision(t, spec.replicas, rec.reason.value))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ReplicaRun:
    """One replica's life: started at ``start`` (the decision), serving from ``ready``,
    draining from ``drain`` (None: never scaled in), stopped at ``stop`` (at most the
    horizon), and the core-seconds its requests used."""

    slot: int
    incarnation: int
    start: float
    ready: float
    drain: float | None
    stop: float
    served_core_s: float

    @property
    def hours(self) -> float:
        return (self.stop - self.start) / 3600.0


@dataclass(frozen=True, slots=True)
class Served:
    """What :func:`serve` measured: each request's wait (None: never started), the misses and
    the replicas."""

    waits: tuple[float | None, ...]
    misses: int
    replicas: tuple[ReplicaRun, ...]


_FINISH, _READY, _DRAIN, _ARRIVE = range(4)  # the order of events at the same instant


@dataclass(slots=True)
class _Replica:
    slot: int
    incarnation: int
    start: float
    ready_at: float
    free: float
    ready: bool = False
    drain: float | None = None
    busy: int = 0
    served: float = 0.0
    stop: float | None = None


def serve(
    requests: Sequence[Request],
    decisions: Sequence[Decision],
    replica_cores: float,
    ready_s: float,
    slo_wait_s: float,
    horizon_s: float,
) -> Served:
    """Run the service's requests on the replicas ``decisions`` asks for (the model in this
    module's docstring). Requests arriving at or after ``horizon_s`` are ignored."""
    events: list[tuple[float, int, int, int]] = []  # (time, kind, sequence, payload)
    seq = 0

    def push(t: float, kind: int, payload: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, kind, seq, payload))
        seq += 1

    reqs = [r for r in requests if r.at < horizon_s]
    for i, r in enumerate(reqs):
        push(r.at, _ARRIVE, i)
    replicas: list[_Replica] = []
    current: dict[int, int] = {}  # slot -> index in replicas of its live (not draining) one
    incarnations: dict[int, int] = {}
    count = 0
    for d in decisions:
        if d.t >= horizon_s:
            break
        for slot in range(count, d.replicas):
            inc = incarnations.get(slot, 0)
            incarnations[slot] = inc + 1
            current[slot] = len(replicas)
            replicas.append(_Replica(slot, inc, d.t, d.t + ready_s, replica_cores))
            push(d.t + ready_s, _READY, current[slot])
        for slot in range(d.replicas, count):
            push(d.t, _DRAIN, current.pop(slot))
        count = d.replicas
    waits: list[float | None] = [None] * len(reqs)
    placed: list[int] = [-1] * len(reqs)
    queue: deque[int] = deque()
    serving: list[int] = []  # indices of ready, not draining replicas, by slot

    def place(i: int, now: float) -> bool:
        r = reqs[i]
        for j in serving:
            rep = replicas[j]
            if rep.free >= r.cores - 1e-9:
                rep.free -= r.cores
                rep.busy += 1
                end = now + r.duration_s
                rep.served += r.cores * (min(end, horizon_s) - now)
                placed[i] = j
                waits[i] = now - r.at
                push(end, _FINISH, i)
                return True
        return False

    def drain_queue(now: float) -> None:
        while queue and place(queue[0], now):
            queue.popleft()

    while events:
        t, kind, _, payload = heapq.heappop(events)
        if t >= horizon_s:
            break
        if kind == _ARRIVE:
            if queue or not place(payload, t):
                queue.append(payload)
        elif kind == _FINISH:
            rep = replicas[placed[payload]]
            rep.free += reqs[payload].cores
            rep.busy -= 1
            if rep.drain is not None and rep.busy == 0:
                rep.stop = t
            drain_queue(t)
        elif kind == _READY:
            rep = replicas[payload]
            if rep.drain is None:
                rep.ready = True
                serving.append(payload)
                serving.sort(key=lambda j: replicas[j].slot)
                drain_queue(t)
        elif kind == _DRAIN:
            rep = replicas[payload]
            rep.drain = t
            if payload in serving:
                serving.remove(payload)
            if rep.busy == 0:
                rep.stop = t
    misses = sum(1 for r, w in zip(reqs, waits, strict=True) if w is None or w > slo_wait_s)
    runs = tuple(
        ReplicaRun(
            rep.slot,
            rep.incarnation,
            rep.start,
            rep.ready_at,
            rep.drain,
            horizon_s if rep.stop is None else rep.stop,
            rep.served,
        )
        for rep in replicas
    )
    return Served(tuple(waits), misses, runs)


@dataclass(frozen=True, slots=True)
class ServiceRun:
    """One service over the scenario under one strategy."""

    model: ServiceModel
    strategy: str
    horizon_s: float
    decisions: tuple[Decision, ...]
    replicas: tuple[ReplicaRun, ...]
    requests: int
    misses: int
    wait_p99_s: float
    load_bins: tuple[float, ...] = field(repr=False, default=())

    @property
    def replica_hours(self) -> float:
        return sum(r.hours for r in self.replicas)

    @property
    def miss_fraction(self) -> float:
        return self.misses / self.requests if self.requests else 0.0

    @property
    def peak_replicas(self) -> int:
        return max(d.replicas for d in self.decisions)

    def count_at(self, t: float) -> int:
        """The replica count asked for at ``t``."""
        n = 0
        for d in self.decisions:
            if d.t > t:
                break
            n = d.replicas
        return n


def run_service(
    model: ServiceModel,
    requests: Sequence[Request],
    slo_wait_s: float,
    horizon_s: float,
    strategy: str,
    forecast: PeakForecast = _heuristic,
) -> ServiceRun:
    """Size the service by ``strategy`` and serve its requests."""
    decisions = replica_counts(model, requests, horizon_s, strategy, forecast)
    served = serve(requests, decisions, model.replica_cores, model.ready_s, slo_wait_s, horizon_s)
    started = [w for w in served.waits if w is not None]
    p99 = float(np.percentile(started, 99)) if started else 0.0
    bins = _bins(requests, horizon_s)
    return ServiceRun(
        model,
        strategy,
        horizon_s,
        decisions,
        served.replicas,
        len(served.waits),
        served.misses,
        p99,
        tuple(bins.tolist()),
    )


@dataclass(frozen=True, slots=True)
class Lead:
    """How far ahead of its load a run scaled out for a morning peak. The peak: the highest
    5-minute load of the window, at ``peak_t``, needing ``needed`` replicas. For each count
    ``k`` above the one running at 03:00 up to ``needed``: when the load (its mean over each
    ``decide_s``) first needed ``k`` replicas, and when the run first asked for ``k``.
    ``lead_s[k]`` is the first minus the second: positive, the replicas came first."""

    peak_t: float
    needed: int
    lead_s: Mapping[int, float]

    @property
    def minutes(self) -> float | None:
        """The mean lead over the levels, minutes (None: no level to climb)."""
        if not self.lead_s:
            return None
        return sum(self.lead_s.values()) / len(self.lead_s) / 60.0


def morning_lead(
    run: ServiceRun,
    requests: Sequence[Request],
    day: int = 0,
    window_h: tuple[float, float] = (5.0, 11.0),
) -> Lead:
    """The :class:`Lead` of ``run`` for the highest 5-minute load in ``window_h`` (hours of
    day ``day``), climbing from 03:00. A level the run never asked for before the peak's bin
    ended counts as reached then (the lead it gets is an upper bound)."""
    day0 = day * SECONDS_PER_DAY
    lo, hi = (int((day0 + h * 3600) // BIN_S) for h in window_h)
    k_peak = lo + int(np.argmax(run.load_bins[lo:hi]))
    peak_t = k_peak * BIN_S
    needed = run.model.replicas_for(run.load_bins[k_peak])
    since, until = day0 + 3 * 3600.0, peak_t + BIN_S
    step = run.model.decide_s
    edges = np.arange(since, until + step, step)
    loads = offered_load(requests, edges)
    lead: dict[int, float] = {}
    for k in range(run.count_at(since) + 1, needed + 1):
        over = np.nonzero(loads > (k - 1) * run.model.target_per_replica + 1e-9)[0]
        if not over.size:
            continue
        # the load of [t, t + step) is read by the decision at t + step
        need_t = float(edges[over[0]]) + step
        reach_t = next(
            (d.t for d in run.decisions if since < d.t <= until and d.replicas >= k), until
        )
        lead[k] = need_t - reach_t
    return Lead(peak_t, needed, lead)


# --- the fleet ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FleetScenario:
    """The campus scenario with the services' requests replaced by their replicas' tasks
    (what :func:`edgesched.core.simulator.simulate` runs)."""

    nodes: tuple[Node, ...]
    tasks: tuple[Task, ...]
    classes: Mapping[str, ServiceClassLike]
    tariff: TariffLike
    days: float


def fleet_scenario(
    scenario: CampusLike, runs: Sequence[ServiceRun]
) -> tuple[FleetScenario, dict[str, float]]:
    """``scenario``'s tasks with each run's requests replaced by one task per replica, and
    the share of each replica's cores that drew dynamic power (``simulate``'s ``draw``)."""
    tasks, classes = scenario.tasks, scenario.classes
    served = {run.model.workload for run in runs}
    sample = {t.workload: t for t in tasks if t.workload in served}
    kept = [t for t in tasks if t.workload not in served]
    draw: dict[str, float] = {}
    for run in runs:
        model, proto = run.model, sample.get(run.model.workload)
        wc = classes[model.workload]
        for rep in run.replicas:
            duration = rep.stop - rep.start
            if duration <= 0:
                continue
            task_id = f"{model.name}.{rep.slot}.{rep.incarnation}"
            cores = model.replica_cores
            demand = Resources(cpu=cores, mem_gib=cores * wc.mem_gib_per_cpu)
            if proto is None:
                task = Task(task_id, model.workload, wc.priority, demand, rep.start, duration)
            else:
                task = replace(
                    proto,
                    id=task_id,
                    demand=replace(demand, iops_k=proto.demand.iops_k),
                    submitted_at=rep.start,
                    duration_s=duration,
                    threads=round(cores),
                )
            kept.append(task)
            draw[task_id] = min(max(rep.served_core_s / (cores * duration), 0.0), 1.0)
    kept.sort(key=lambda t: (t.submitted_at, t.id))
    fleet = FleetScenario(scenario.nodes, tuple(kept), classes, scenario.tariff, scenario.days)
    return fleet, draw


def size_services(
    scenario: CampusLike,
    models: Sequence[ServiceModel],
    strategy: str,
    forecast: PeakForecast = _heuristic,
) -> tuple[ServiceRun, ...]:
    """Every service of ``models`` over ``scenario``'s requests of its class, by ``strategy``."""
    horizon = scenario.days * SECONDS_PER_DAY
    return tuple(
        run_service(
            model,
            requests_of(scenario.tasks, model.workload),
            scenario.classes[model.workload].slo_wait_s,
            horizon,
            strategy,
            forecast,
        )
        for model in models
    )
