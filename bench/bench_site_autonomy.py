"""Site autonomy against node-only autonomy on the campus with WAN cuts of an hour.

    .venv/bin/python bench/bench_site_autonomy.py [--seed N] [--days D] [--scales 1,4]
        [--json] [--quick]

The campus fleet of each scale is split into three sites (:mod:`edgesched.core.sitesim`);
each site is cut from central twice a day for an hour, and during half the cuts one or two
of its members crash for 15-90 minutes. Both modes run the same seeded scenario:
``node-only`` (a cut node schedules only for itself) and ``site`` (the cut site's live nodes
elect a coordinator that runs the core over them). For each size the table gives, while cut
and outside cuts, each mode's figures and the ratio site / node-only: replica-seconds below
the services' desired counts, local submissions, SLO misses (waited over 60 s or never
started), those never started, task runs killed by a crash and the CPU-seconds they had done
(thrown away), and the seconds the killed tasks waited to run again. Then the simulator's own
runtime per size (both modes) and how it grows from the first size to the last.

``--quick`` runs a small campus (scales 0.2 and 0.4, a quarter of a day, every cut with a
crash) for the tests; ``--json`` prints the figures as one JSON document instead of the tables.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from edgesched.core.sitesim import MODES, Figures, SiteReport, SiteScenario, campus_site_scenario
from edgesched.core.sitesim import simulate_sites as simulate

#: The figures' rows: field of :class:`Figures`, label, format.
ROWS: tuple[tuple[str, str, str], ...] = (
    ("replica_down_s", "replica downtime, replica-s", "{:,.0f}"),
    ("submissions", "local submissions", "{:,}"),
    ("slo_misses", "SLO misses", "{:,}"),
    ("never_ran", "never started", "{:,}"),
    ("killed", "task runs killed", "{:,}"),
    ("killed_cpu_s", "CPU-s lost in killed runs", "{:,.0f}"),
    ("rerun_wait_s", "killed tasks' wait to rerun, s", "{:,.0f}"),
)
HEADER = (
    "figure",
    "node-only, cut",
    "site, cut",
    "site / node-only",
    "node-only, outside",
    "site, outside",
)


@dataclass(frozen=True, slots=True)
class Size:
    """One size: its scenario's shape, each mode's report and the simulator's runtime."""

    scale: float
    days: float
    nodes: int
    submissions: int
    cuts: int
    crashes: int
    reports: dict[str, SiteReport]
    seconds: float


def measure(
    seed: int, days: float, scale: float, crash_p: float = 0.5, cuts_per_day: int = 2
) -> Size:
    """Both modes over the campus of ``scale``; ``seconds`` times the two runs only."""
    scenario: SiteScenario = campus_site_scenario(
        seed=seed, days=days, scale=scale, crash_p=crash_p, cuts_per_day=cuts_per_day
    )
    t0 = time.perf_counter()
    reports = {mode: simulate(scenario, mode) for mode in MODES}
    seconds = time.perf_counter() - t0
    return Size(
        scale,
        days,
        len(scenario.nodes),
        len(scenario.submissions),
        len(scenario.cuts),
        len(scenario.crashes),
        reports,
        seconds,
    )


def ratio(site: float, node_only: float) -> str:
    """``site / node_only`` to two decimals; ``-`` when both are 0, ``inf`` when only
    node-only is."""
    if node_only == 0:
        return "-" if site == 0 else "inf"
    return f"{site / node_only:.2f}"


def table(size: Size) -> list[str]:
    """The markdown table of one size."""
    node_only, site = size.reports["node-only"], size.reports["site"]
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for name, label, fmt in ROWS:
        a, b = getattr(node_only.cut, name), getattr(site.cut, name)
        row = [label, fmt.format(a), fmt.format(b), ratio(b, a)]
        row += [fmt.format(getattr(r.outside, name)) for r in (node_only, site)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def runtime_lines(sizes: Sequence[Size]) -> list[str]:
    """The simulator's runtime per size and the growth from the first size to the last."""
    lines = [
        f"scale {s.scale:g}: {s.nodes} nodes, {s.submissions:,} submissions, "
        f"{sum(r.cycles for r in s.reports.values()):,} schedule cycles, {s.seconds:.1f} s "
        "(both modes)"
        for s in sizes
    ]
    first, last = sizes[0], sizes[-1]
    if len(sizes) > 1:
        lines.append(
            f"runtime ratio scale {last.scale:g} / scale {first.scale:g}: "
            f"{last.seconds / first.seconds:.2f} for {last.nodes / first.nodes:.2f}x the "
            f"nodes and {last.submissions / first.submissions:.2f}x the submissions"
        )
    return lines


def as_json(seed: int, sizes: Sequence[Size]) -> dict[str, object]:
    out: list[dict[str, object]] = []
    for s in sizes:
        modes = {
            mode: {"cut": asdict(r.cut), "outside": asdict(r.outside), "cycles": r.cycles}
            for mode, r in s.reports.items()
        }
        out.append(
            {
                "scale": s.scale,
                "days": s.days,
                "nodes": s.nodes,
                "submissions": s.submissions,
                "cuts": s.cuts,
                "crashes": s.crashes,
                "seconds": s.seconds,
                "modes": modes,
            }
        )
    growth = sizes[-1].seconds / sizes[0].seconds if sizes[0].seconds > 0 else None
    names = [f.name for f in fields(Figures)]
    return {"seed": seed, "figures": names, "sizes": out, "runtime_ratio": growth}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--scales", default="1,4", help="campus scales, comma-separated")
    parser.add_argument("--json", action="store_true", help="print JSON, not tables")
    parser.add_argument("--quick", action="store_true", help="a small, fast run (tests)")
    args = parser.parse_args(argv)
    scales = [float(x) for x in args.scales.split(",") if x.strip()]
    days, crash_p = args.days, 0.5
    if args.quick:
        scales, days, crash_p = [0.2, 0.4], 0.25, 1.0
    sizes = [measure(args.seed, days, scale, crash_p) for scale in scales]
    if args.json:
        print(json.dumps(as_json(args.seed, sizes), indent=2))
        return
    for s in sizes:
        print(
            f"campus seed {args.seed}, {days:g} day(s), scale {s.scale:g}: {s.nodes} nodes in "
            f"3 sites, {s.submissions:,} local submissions, {s.cuts} cuts of an hour, "
            f"{s.crashes} crashes"
        )
        print()
        print("\n".join(table(s)))
        print()
    print("\n".join(runtime_lines(sizes)))


if __name__ == "__main__":
    main()
