"""Energy mode against the baselines on a generated batch hour in the Alibaba 2018 format
(issue 17): SLO misses at a 60 s wait objective, energy, utilization of awake capacity and of
the fleet, per strategy.

The generator (:func:`batch_hour`) is ours, seeded, and only *like* the trace: jobs arrive as a
Poisson process whose rate rises and falls over the hour; a job has 1-4 tasks, a task 1 to a
few hundred instances (lognormal count) arriving together, each instance 0.5-4 cores for a
lognormal duration (median 10 s, p99 about 740 s, the trace's figures; capped at an hour). A few
tasks per hour are long (20-60 minutes), as the trace's long batch tasks are. Every instance
has one priority and is preemptible, as the trace's batch instances (it carries no priority).
The fleet is ``nodes`` x86 general servers with the campus's x86 power model, their cores sized
so the peak 5-minute demand (every instance started on arrival) is ``peak_fraction`` of the
fleet.

    .venv/bin/python bench/bench_energy_slo.py                 # 36 nodes, ~30,000 instances
    .venv/bin/python bench/bench_energy_slo.py --scale 0.2     # a fifth of it, seconds
    .venv/bin/python bench/bench_energy_slo.py --json

Nothing here is the real trace: a real trace's figures may differ (docs/power.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from edgesched.core.campus import Tariff
from edgesched.core.model import Arch, Node, PowerModel, Resources, ServerClass, Task
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.simulator import SimReport, simulate
from edgesched.core.strategies import CoreStrategy, FirstFit, Strategy, kubernetes_like

HOUR_S = 3600.0
SLO_WAIT_S = 60.0
#: The campus's x86 general server (core/campus.py).
X86_POWER = PowerModel(idle_w=180.0, peak_w=420.0, parked_w=12.0, wake_latency_s=90.0)


@dataclass(frozen=True, slots=True)
class BatchClass:
    name: str
    priority: int
    slo_wait_s: float


@dataclass(frozen=True, slots=True)
class BatchHour:
    """A :class:`~edgesched.core.simulator.ScenarioLike` of one hour."""

    nodes: tuple[Node, ...]
    tasks: tuple[Task, ...]
    classes: Mapping[str, BatchClass]
    tariff: Tariff
    days: float = HOUR_S / 86_400.0


def _rate_shape(t: float) -> float:
    """Relative job arrival rate over the hour: up from 0.35 to 1 by minute 25, down to 0.3
    by the end."""
    x = t / HOUR_S
    if x < 25 / 60:
        return 0.35 + 0.65 * x / (25 / 60)
    return 1.0 - 0.7 * (x - 25 / 60) / (35 / 60)


def batch_hour(
    seed: int = 0,
    *,
    instances: int = 30_000,
    nodes: int = 36,
    peak_fraction: float = 0.7,
    preemptible: bool = True,
) -> BatchHour:
    """A seeded batch hour of about ``instances`` instances on ``nodes`` servers sized so the
    peak 5-minute demand is ``peak_fraction`` of the fleet (see the module docstring)."""
    rng = np.random.default_rng(seed)
    mean_per_job = 2.5 * 12.0  # tasks a job x mean instances a task (lognormal below)
    jobs = max(1, round(instances / mean_per_job))
    # arrival times by thinning a Poisson process against the rate shape
    times: list[float] = []
    while len(times) < jobs:
        t = float(rng.uniform(0, HOUR_S))
        if rng.uniform() < _rate_shape(t):
            times.append(t)
    times.sort()
    tasks: list[Task] = []
    cpu_choices = np.array([0.5, 1.0, 2.0, 4.0])
    cpu_weights = np.array([0.45, 0.35, 0.15, 0.05])
    for j, at in enumerate(times):
        for k in range(int(rng.integers(1, 5))):
            count = max(1, min(400, round(float(rng.lognormal(math.log(6.0), 1.2)))))
            long_task = rng.uniform() < 0.004
            cpu = float(rng.choice(cpu_choices, p=cpu_weights))
            start = at + k * float(rng.uniform(0, 20))
            for i in range(count):
                if long_task:
                    duration = float(rng.uniform(1200, 3600))
                else:
                    duration = min(HOUR_S, float(rng.lognormal(math.log(10.0), 1.85)))
                tasks.append(
                    Task(
                        id=f"j{j}-t{k}-i{i}",
                        workload="batch",
                        priority=100,
                        demand=Resources(cpu=cpu, mem_gib=2.0 * cpu),
                        submitted_at=min(start + float(rng.uniform(0, 2)), HOUR_S - 1),
                        duration_s=max(1.0, duration),
                        preemptible=preemptible,
                    )
                )
    peak = _peak_demand(tasks)
    cores = max(8, math.ceil(peak / peak_fraction / nodes))
    fleet = tuple(
        Node(
            id=f"x86-{i:02d}",
            arch=Arch.X86_64,
            server_class=ServerClass.GENERAL,
            capacity=Resources(cpu=float(cores), mem_gib=8.0 * cores, iops_k=400.0),
            power=X86_POWER,
        )
        for i in range(1, nodes + 1)
    )
    classes = {"batch": BatchClass("batch", 100, SLO_WAIT_S)}
    return BatchHour(fleet, tuple(tasks), classes, Tariff((0.14,) * 24))


def _peak_demand(tasks: list[Task], bin_s: float = 300.0) -> float:
    """The highest 5-minute mean of cores in use if every task started on arrival."""
    bins = np.zeros(int(HOUR_S // bin_s) + 1)
    for t in tasks:
        start, end = t.submitted_at, min(t.submitted_at + (t.duration_s or 0.0), HOUR_S)
        b = int(start // bin_s)
        while start < end:
            stop = min(end, (b + 1) * bin_s)
            bins[b] += t.demand.cpu * (stop - start)
            start, b = stop, b + 1
    return float(bins.max() / bin_s)


def strategies() -> list[Strategy]:
    """The baselines and our modes, as the campus runs them."""
    return [
        kubernetes_like(),
        FirstFit(),
        CoreStrategy("priority", PolicyConfig(mode=PolicyMode.PRIORITY)),
        CoreStrategy("balance", PolicyConfig(mode=PolicyMode.BALANCE)),
        CoreStrategy("energy", PolicyConfig(mode=PolicyMode.ENERGY)),
    ]


def row(report: SimReport, base: SimReport) -> dict[str, object]:
    return {
        "strategy": report.strategy,
        "slo_misses": report.slo_misses,
        "energy_kwh": round(report.energy_kwh, 2),
        "saving_vs_k8s": round(1 - report.energy_kwh / base.energy_kwh, 4),
        "util_awake": round(report.utilization_awake, 4),
        "util_fleet": round(report.utilization_fleet, 4),
        "wait_p99_s": round(report.classes["batch"].wait_p99_s, 1),
        "preemptions": report.preemptions,
        "parks": report.parks,
        "wakes": report.wakes,
    }


def run(seed: int, scale: float, preemptible: bool = True) -> list[dict[str, object]]:
    scenario = batch_hour(
        seed,
        instances=round(30_000 * scale),
        nodes=max(2, round(36 * scale)),
        preemptible=preemptible,
    )
    reports = [simulate(scenario, s) for s in strategies()]
    return [row(r, reports[0]) for r in reports]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--non-preemptible", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    rows = run(args.seed, args.scale, not args.non_preemptible)
    took = time.perf_counter() - began
    if args.json:
        print(json.dumps({"seed": args.seed, "scale": args.scale, "rows": rows, "s": took}))
        return 0
    scenario = batch_hour(args.seed, instances=round(30_000 * args.scale))
    cores = scenario.nodes[0].capacity.cpu
    print(f"seed {args.seed}, {len(scenario.tasks)} instances, nodes of {cores:.0f} cores")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print(f"({took:.0f} s)")
    return 0


# a replace() the tests use to flip preemptibility without regenerating
__all__ = ["BatchHour", "batch_hour", "main", "replace", "run", "strategies"]

if __name__ == "__main__":
    sys.exit(main())
