"""Simulator speed: simulated time per wall-clock second for our cycle and for the simplest
baseline (first-fit, a plain Python loop) over the same campus arrivals, in the same run.

    .venv/bin/python bench/bench_simulator.py [--days D] [--scale S]

The ratio shows what the core's full cycle (tidal shares, preemption search, parking, numpy
scoring) costs over a bare placement loop inside the same event loop.
"""

from __future__ import annotations

import argparse
import os
import time

from edgesched.core.campus import campus_scenario
from edgesched.core.experiment import build_strategies
from edgesched.core.simulator import simulate
from edgesched.core.tidal import campus_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=float, default=0.25)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    t0 = time.perf_counter()
    scenario = campus_scenario(seed=0, days=args.days, scale=args.scale)
    gen = time.perf_counter() - t0
    horizon = args.days * 86_400
    print(
        f"campus: {len(scenario.nodes)} nodes, {len(scenario.tasks):,} tasks, "
        f"{args.days:g} day(s); generated in {gen:.2f} s"
    )
    timings: dict[str, float] = {}
    for name in ("first-fit", "tidal+energy"):
        (strategy,) = build_strategies(scenario, campus_profile(), only=[name])
        t0 = time.perf_counter()
        report = simulate(scenario, strategy)
        timings[name] = time.perf_counter() - t0
        print(
            f"{name:>14}: {timings[name]:6.2f} s wall, {horizon / timings[name]:8,.0f} "
            f"simulated s per s, {report.cycles:,} cycles, "
            f"{1e3 * timings[name] / max(report.cycles, 1):.2f} ms per cycle"
        )
    print(
        f"full core cycle / first-fit loop: x{timings['tidal+energy'] / timings['first-fit']:.2f}"
    )


if __name__ == "__main__":
    main()
