"""Services in the campus day: autoscaled replicas against a fixed peak-sized deployment.

    .venv/bin/python bench/bench_services_sim.py [--seed N] [--days D] [--scale S]
        [--fleet tidal+energy] [--services-only]

Face recognition and video conferencing run as services (:mod:`edgesched.core.servicesim`).
Each is sized four ways over the same requests:

* ``fixed``: ``ceil(peak / target)`` replicas all day, the baseline measured in the same run;
* ``load``: :func:`edgesched.core.service.recommend` on the load;
* ``forecast (holt)``: the same with the simulator's heuristic forecast (Holt's damped trend,
  plus the value a day ago after a day);
* ``forecast (onnx)``: the same with the shipped per-class ONNX forecaster
  (``policies/demand15.onnx``, trained on other seeds).

The other three classes stay tasks. For each way, the simulator runs the whole fleet under
``--fleet`` with the replicas as tasks, for energy. The columns are: replica-hours (ratio to
fixed), SLO misses per service (requests that waited past their class's bound, or never
started), the whole fleet's energy (ratio to fixed), the morning scale-out lead of each
service (:func:`edgesched.core.servicesim.morning_lead`: minutes, mean over the replica counts
the morning peak climbs through, by which the replicas came before the load needed them), the
replicas that waited for a node longer than their class's SLO wait (the serving model assumes
none waits over ``ready_s``), and the SLO misses of the other classes in the fleet.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgesched.core.campus import CampusScenario, campus_scenario
from edgesched.core.experiment import build_strategies
from edgesched.core.forecast import DemandHistory, peak_next
from edgesched.core.servicesim import (
    PeakForecast,
    ServiceRun,
    campus_services,
    fleet_scenario,
    morning_lead,
    requests_of,
    size_services,
)
from edgesched.core.simulator import SimReport, heuristic_peak, simulate
from edgesched.core.tidal import campus_profile
from edgesched.policies.models import ActiveModels


def _holt(workload: str, history: DemandHistory) -> float | None:
    return heuristic_peak(history)


def _onnx(fleet_cpu: float) -> PeakForecast:
    models = ActiveModels(Path(tempfile.mkdtemp(prefix="bench-services-")))
    if models.forecaster is None:
        raise SystemExit("the shipped ONNX forecaster did not load")
    pick = models.forecaster_for(fleet_cpu)

    def peak(workload: str, history: DemandHistory) -> float | None:
        return peak_next(pick(workload), history)

    return peak


@dataclass(frozen=True, slots=True)
class Way:
    """One way to size the services, its runs and (unless skipped) the fleet's report."""

    label: str
    runs: tuple[ServiceRun, ...]
    report: SimReport | None
    seconds: float


def measure(
    scenario: CampusScenario, fleet_strategy: str = "tidal+energy", with_fleet: bool = True
) -> list[Way]:
    """The four ways over ``scenario``, the fixed deployment first."""
    models = campus_services()
    ways: list[tuple[str, str, PeakForecast]] = [
        ("fixed", "fixed", _holt),
        ("load", "load", _holt),
        ("forecast (holt)", "forecast", _holt),
        ("forecast (onnx)", "forecast", _onnx(scenario.fleet_cpu)),
    ]
    out: list[Way] = []
    for label, strategy, forecast in ways:
        t0 = time.perf_counter()
        runs = size_services(scenario, models, strategy, forecast)
        report = None
        if with_fleet:
            fleet, draw = fleet_scenario(scenario, runs)
            (policy,) = build_strategies(fleet, campus_profile(), only=[fleet_strategy])
            report = simulate(fleet, policy, draw=draw)
        out.append(Way(label, runs, report, time.perf_counter() - t0))
    return out


def table(scenario: CampusScenario, ways: list[Way]) -> list[str]:
    """The markdown table, each way against the first (the fixed deployment). The leads are
    those of the last whole day's morning."""
    day = max(math.floor(scenario.days + 1e-9) - 1, 0)
    base = ways[0]
    base_rh = sum(r.replica_hours for r in base.runs)
    names = [r.model.name for r in base.runs]
    short = {"face-recognition": "FR", "video-conferencing": "VC"}
    header = ["strategy", "replica-hours", "vs fixed"]
    header += [f"misses {short.get(n, n)}" for n in names]
    header += ["energy kWh", "vs fixed"]
    header += [f"lead {short.get(n, n)}, min" for n in names]
    header += ["replicas late", "other classes' misses"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for way in ways:
        rh = sum(r.replica_hours for r in way.runs)
        row = [way.label, f"{rh:,.0f}", f"{rh / base_rh:.2f}"]
        row += [f"{r.miss_fraction:.2%} ({r.misses:,})" for r in way.runs]
        if way.report is None or base.report is None:
            row += ["-", "-"]
        else:
            kwh, base_kwh = way.report.energy_kwh, base.report.energy_kwh
            row += [f"{kwh:.0f}", f"{kwh / base_kwh:.3f}"]
        for r in way.runs:
            lead = morning_lead(r, requests_of(scenario.tasks, r.model.workload), day)
            row.append("all day" if r.strategy == "fixed" else _minutes(lead.minutes))
        if way.report is None:
            row += ["-", "-"]
        else:
            classes = way.report.classes
            late = sum(classes[n].slo_misses for n in names if n in classes)
            others = sum(c.slo_misses for n, c in classes.items() if n not in names)
            row += [f"{late:,}", f"{others:,}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fleet", default="tidal+energy", help="the fleet's strategy")
    parser.add_argument(
        "--services-only", action="store_true", help="skip the fleet runs (no energy column)"
    )
    args = parser.parse_args()
    scenario = campus_scenario(seed=args.seed, days=args.days, scale=args.scale)
    print(
        f"campus seed {args.seed}, {args.days:g} day(s), scale {args.scale:g}: "
        f"{len(scenario.nodes)} nodes; services "
        + ", ".join(
            f"{m.name} ({m.replica_cores:g}-core replicas, target {m.target_per_replica:g})"
            for m in campus_services()
        )
        + ("" if args.services_only else f"; fleet strategy {args.fleet}")
    )
    ways = measure(scenario, args.fleet, not args.services_only)
    for way in ways:
        print(f"  {way.label}: {way.seconds:.1f} s")
    print()
    print("\n".join(table(scenario, ways)))
    print()
    for way in ways:
        print(
            f"{way.label}: "
            + "; ".join(
                f"{r.model.name} peak {r.peak_replicas} replicas, "
                f"{r.replica_hours:,.0f} replica-h, {len(r.decisions) - 1} changes, "
                f"wait p99 {r.wait_p99_s:.1f} s"
                for r in way.runs
            )
        )


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


if __name__ == "__main__":
    main()
