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
import tempfile
import time
from pathlib import Path

from edgesched.core.campus import campus_scenario
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
    models = campus_services()
    ways: list[tuple[str, str, PeakForecast]] = [
        ("fixed", "fixed", _holt),
        ("load", "load", _holt),
        ("forecast (holt)", "forecast", _holt),
        ("forecast (onnx)", "forecast", _onnx(scenario.fleet_cpu)),
    ]
    day = max(int(args.days + 0.5) - 1, 0)  # the lead is measured on the last whole day
    print(
        f"campus seed {args.seed}, {args.days:g} day(s), scale {args.scale:g}: "
        f"{len(scenario.nodes)} nodes; services "
        + ", ".join(
            f"{m.name} ({m.replica_cores:g}-core replicas, target {m.target_per_replica:g})"
            for m in models
        )
        + f"; fleet strategy {args.fleet}"
    )
    results: dict[str, tuple[tuple[ServiceRun, ...], SimReport | None]] = {}
    for label, strategy, forecast in ways:
        t0 = time.perf_counter()
        runs = size_services(scenario, models, strategy, forecast)
        report = None
        if not args.services_only:
            fleet, draw = fleet_scenario(scenario, runs)
            (fleet_strategy,) = build_strategies(fleet, campus_profile(), only=[args.fleet])
            report = simulate(fleet, fleet_strategy, draw=draw)
        results[label] = (runs, report)
        print(f"  {label}: {time.perf_counter() - t0:.1f} s")
    base_runs, base_report = results["fixed"]
    base_rh = sum(r.replica_hours for r in base_runs)
    names = [m.name for m in models]
    short = {"face-recognition": "FR", "video-conferencing": "VC"}
    header = ["strategy", "replica-hours", "vs fixed"]
    header += [f"misses {short.get(n, n)}" for n in names]
    header += ["energy kWh", "vs fixed"]
    header += [f"lead {short.get(n, n)}, min" for n in names]
    header += ["replicas late", "other classes' misses"]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, (runs, report) in results.items():
        rh = sum(r.replica_hours for r in runs)
        row = [label, f"{rh:,.0f}", f"{rh / base_rh:.2f}"]
        row += [f"{r.miss_fraction:.2%} ({r.misses:,})" for r in runs]
        if report is None or base_report is None:
            row += ["-", "-"]
        else:
            row += [f"{report.energy_kwh:.0f}", f"{report.energy_kwh / base_report.energy_kwh:.3f}"]
        for r in runs:
            lead = morning_lead(r, requests_of(scenario.tasks, r.model.workload), day)
            row.append("all day" if r.strategy == "fixed" else _minutes(lead.minutes))
        if report is None:
            row += ["-", "-"]
        else:
            late = sum(report.classes[n].slo_misses for n in names if n in report.classes)
            others = sum(c.slo_misses for n, c in report.classes.items() if n not in names)
            row += [f"{late:,}", f"{others:,}"]
        print("| " + " | ".join(row) + " |")
    print()
    for label, (runs, _) in results.items():
        print(
            f"{label}: "
            + "; ".join(
                f"{r.model.name} peak {r.peak_replicas} replicas, "
                f"{r.replica_hours:,.0f} replica-h, {len(r.decisions) - 1} changes, "
                f"wait p99 {r.wait_p99_s:.1f} s"
                for r in runs
            )
        )


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


if __name__ == "__main__":
    main()
