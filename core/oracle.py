"""A clairvoyant power manager: how much energy the energy mode could save if it knew the future.

The energy mode keeps awake a *forecast* of the CPU and accelerators asked plus spare for what
the forecast misses (:func:`edgesched.core.scheduler.schedule`'s power stage). The oracle runs
the same core, the same placement and the same power stage in the same simulator under the
same power model, with two things changed:

* the forecast is replaced by the truth: the peak CPU and accelerators the scenario's tasks ask
  over the next ``lead_s`` (the slowest wake-up plus a power tick: what must be woken now to
  be awake when it is needed), each task counted from its release for its duration, as if it
  ran without waiting (:class:`OfferedDemand`); the cycle's own running and waiting work still
  counts, as it does for the energy mode;
* the spare is swept (:data:`ORACLE_SPARES`: the policy's ``spare_cpu_fraction``, with no
  fixed ``min_spare_cpu``: capacity kept awake beyond that peak for the fragments whole tasks
  leave on whole servers and for work of one architecture or class the total hides), and
  :func:`best_oracle` takes the run of least energy whose SLO misses are no more than a
  bound (the best baseline's).

What it is: the saving a power manager that knows every arrival and duration in advance
reaches with this placement. What it is not: a proof that no scheduler can do better (another
placement, or work held back within its SLO, might), nor a way to run anything live.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgesched.core.model import Node, Task
from edgesched.core.nodetable import FloatArray
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, ScheduleResult
from edgesched.core.strategies import CoreStrategy, Strategy

#: The spare fractions of the oracle's runs (``spare_cpu_fraction``; ``min_spare_cpu`` 0).
ORACLE_SPARES: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.5)
#: The power tick the lead covers beyond the slowest wake-up (the simulator's ``tick_s``).
TICK_S = 60.0
ORACLE_PREFIX = "oracle@"


@dataclass(frozen=True, slots=True)
class OfferedDemand:
    """The CPU and accelerators asked over time by tasks that each run from their release for
    their duration (a service, with no duration, to the end of time): a step function,
    ``cpu[i]`` and ``accel[i]`` from ``times[i]`` until ``times[i + 1]`` (0 before
    ``times[0]``)."""

    times: FloatArray
    cpu: FloatArray
    accel: FloatArray

    @classmethod
    def of(cls, tasks: Iterable[Task]) -> OfferedDemand:
        starts: list[float] = []
        ends: list[float] = []
        cpu: list[float] = []
        accel: list[float] = []
        for t in tasks:
            starts.append(t.submitted_at)
            ends.append(t.submitted_at + (t.duration_s if t.duration_s is not None else np.inf))
            cpu.append(t.demand.cpu)
            accel.append(float(t.demand.accel))
        s = np.asarray(starts, dtype=np.float64)
        e = np.asarray(ends, dtype=np.float64)
        c = np.asarray(cpu, dtype=np.float64)
        a = np.asarray(accel, dtype=np.float64)
        at = np.concatenate((s, e))
        dc = np.concatenate((c, -c))
        da = np.concatenate((a, -a))
        # a task ending at t frees its share before one starting at t takes it
        order = np.lexsort((dc, at))
        at, dc, da = at[order], dc[order], da[order]
        keep = np.isfinite(at)
        at, dc, da = at[keep], dc[keep], da[keep]
        # one level per distinct time: the level after every change at that time
        last = np.ones(len(at), dtype=bool)
        last[:-1] = at[1:] != at[:-1]
        levels_c = np.maximum(np.cumsum(dc), 0.0)[last]
        levels_a = np.maximum(np.cumsum(da), 0.0)[last]
        return cls(at[last], levels_c, levels_a)

    def level(self, t: float) -> tuple[float, float]:
        """CPU and accelerators asked at ``t``."""
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        if i < 0:
            return 0.0, 0.0
        return float(self.cpu[i]), float(self.accel[i])

    def peak(self, start: float, end: float) -> tuple[float, float]:
        """The highest CPU and the highest accelerators asked over ``[start, end]`` (each its
        own maximum: they need not fall at the same moment)."""
        if end < start:
            raise ValueError(f"end {end} before start {start}")
        first = int(np.searchsorted(self.times, start, side="right")) - 1
        last = int(np.searchsorted(self.times, end, side="right"))
        lo = max(first, 0)
        if last <= lo:
            return self.level(start)
        # (a window opening before the first change also holds 0 there: levels are >= 0)
        return float(self.cpu[lo:last].max()), float(self.accel[lo:last].max())


def lead_for(nodes: Sequence[Node], tick_s: float = TICK_S) -> float:
    """How far ahead capacity must be known: the slowest wake-up plus a tick (decisions come
    at least every tick, so a need at ``t`` is seen by ``t - wake``)."""
    return max((n.power.wake_latency_s for n in nodes), default=0.0) + tick_s


@dataclass(frozen=True, slots=True)
class Clairvoyant:
    """``inner`` (a core strategy whose policy parks) shown the true future instead of a
    forecast: ``forecast_cpu`` and ``forecast_accel`` are the peaks of ``demand`` over
    ``[now, now + lead_s]``, and the forecast is ready from the first cycle."""

    inner: Strategy
    demand: OfferedDemand
    lead_s: float
    name: str = "oracle"

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        cpu, accel = self.demand.peak(view.now, view.now + self.lead_s)
        seen = replace(view, forecast_cpu=cpu, forecast_accel=accel, forecast_ready=True)
        return self.inner.decide(seen, pending)


def oracle_name(spare: float) -> str:
    return f"{ORACLE_PREFIX}{spare:g}"


def spare_of(name: str) -> float:
    """The spare an oracle strategy's name carries (ValueError for any other name)."""
    if not name.startswith(ORACLE_PREFIX):
        raise ValueError(f"{name!r} is not an oracle strategy")
    return float(name.removeprefix(ORACLE_PREFIX))


def oracle_strategy(
    nodes: Sequence[Node],
    tasks: Iterable[Task],
    spare: float,
    base: PolicyConfig | None = None,
    tick_s: float = TICK_S,
) -> Clairvoyant:
    """The energy mode (``base``'s other settings, no tidal profile unless ``base`` has one)
    with the true future for a forecast, ``spare`` for its spare fraction and no min spare."""
    policy = replace(
        base or PolicyConfig(), mode=PolicyMode.ENERGY, spare_cpu_fraction=spare, min_spare_cpu=0.0
    )
    inner = CoreStrategy(oracle_name(spare), policy)
    return Clairvoyant(inner, OfferedDemand.of(tasks), lead_for(nodes, tick_s), oracle_name(spare))


@dataclass(frozen=True, slots=True)
class OracleResult:
    """The oracle's pick: its spare, energy and misses, or none when no run kept the bound."""

    spare: float | None
    energy_kwh: float | None
    misses: int | None
    tried: int


def best_oracle(runs: Iterable[tuple[str, float, int]], max_misses: int) -> OracleResult:
    """Among oracle runs ``(name, energy_kwh, slo_misses)``, the one of least energy whose
    misses are at most ``max_misses`` (ties: the smaller spare fraction)."""
    tried = 0
    best: tuple[float, float, int] | None = None
    for name, kwh, misses in runs:
        tried += 1
        if misses > max_misses:
            continue
        spare = spare_of(name)
        if best is None or (kwh, spare) < (best[0], best[1]):
            best = (kwh, spare, misses)
    if best is None:
        return OracleResult(None, None, None, tried)
    return OracleResult(best[1], best[0], best[2], tried)
