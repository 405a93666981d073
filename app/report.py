"""Rendering simulation results for people: a rich table, JSON, and a PNG of the day.

Effects live here (terminal, files); the numbers come from :mod:`edgesched.core.experiment`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from edgesched.core.experiment import ExperimentResult
from edgesched.core.simulator import SimReport


def to_json(result: ExperimentResult, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta,
        "strategies": [r.to_dict() for r in result.reports],
        "affinity_arm48": {k: round(v, 4) for k, v in result.affinity.items()},
        "targets": [
            {"name": t.name, "value": round(t.value, 6), "goal": t.goal, "met": t.met}
            for t in result.targets
        ],
    }


def _kwh(value: float) -> str:
    """Energy in kWh: whole kWh from 100 up (a campus day), one decimal below (a short trace)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def worst_wait_p99(report: SimReport) -> float:
    """The highest per-class p99 wait of a run, seconds (the overall p99 with one class)."""
    return max((c.wait_p99_s for c in report.classes.values()), default=0.0)


def print_tables(
    result: ExperimentResult,
    console: Console,
    top_class: str,
    *,
    title: str = "Campus day: strategies compared (same seed, same arrivals)",
    wait_p99: bool = False,
) -> None:
    """The strategies' table; the targets' table when the run has targets (a campus run).
    ``wait_p99`` adds the worst class's p99 wait."""
    table = Table(title=title)
    cols = [
        "strategy",
        "util awake",
        "util fleet",
        "energy kWh",
        "cost",
        "done",
        "work core-h",
        "SLO miss",
        f"miss {top_class}",
        "preempt",
        "migr",
        "park",
    ]
    if wait_p99:
        cols.insert(cols.index("preempt"), "wait p99 s")
    for col in cols:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in result.reports:
        top = r.classes.get(top_class)
        cells = [
            r.strategy,
            f"{r.utilization_awake:.1%}",
            f"{r.utilization_fleet:.1%}",
            _kwh(r.energy_kwh),
            f"{r.energy_cost:,.2f}",
            f"{r.completed:,}",
            f"{r.work_core_h:,.0f}",
            f"{r.slo_misses:,}",
            f"{top.slo_misses if top else 0:,}",
            f"{r.preemptions:,}",
            f"{r.migrations:,}",
            f"{r.parks:,}",
        ]
        if wait_p99:
            cells.insert(cols.index("wait p99 s"), f"{worst_wait_p99(r):,.0f}")
        table.add_row(*cells)
    console.print(table)
    if result.affinity:
        a = result.affinity
        console.print(
            f"Per-core CPU affinity on a 48-core ARM node at {a['load']:.0%} load: "
            f"std {a['naive_std']:.1%} naive -> {a['planned_std']:.1%} planned; "
            f"throughput x{a['planned_throughput'] / a['naive_throughput']:.2f}"
        )
    if not result.targets:
        return
    targets = Table(title="Targets from the source article")
    for col in ("target", "value", "goal", "met"):
        targets.add_column(col)
    for t in result.targets:
        value = f"{t.value:.1%}" if abs(t.value) < 2 and t.value != int(t.value) else f"{t.value:g}"
        targets.add_row(t.name, value, t.goal, "yes" if t.met else "NO")
    console.print(targets)


def plot_day(
    result: ExperimentResult,
    path: Path,
    strategies: tuple[str, ...],
    *,
    title: str = "edgesched campus simulation",
    xlabel: str = "hour of day",
) -> Path:
    """Utilization of awake capacity and fleet power over the day, one line per strategy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("plotting needs matplotlib: pip install 'edgesched[plot]'") from exc
    fig, (ax_u, ax_p) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for r in result.reports:
        if r.strategy not in strategies or not r.series.get("t"):
            continue
        hours = r.series["t"]
        ax_u.plot(hours, [100 * u for u in r.series["util_awake"]], label=r.strategy)
        ax_p.plot(hours, r.series["power_kw"], label=r.strategy)
    ax_u.set_ylabel("utilization of awake CPU (%)")
    ax_u.set_ylim(0, 100)
    ax_u.legend(loc="lower right", fontsize=8)
    ax_u.grid(alpha=0.3)
    ax_p.set_ylabel("fleet power (kW)")
    ax_p.set_xlabel(xlabel)
    ax_p.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def to_markdown(doc: dict[str, Any]) -> str:
    """The JSON report as Markdown tables (the README's results section is made with this)."""
    top = doc.get("top_class", "face-recognition")
    waits = doc.get("scenario") == "trace"
    rows = [
        "| strategy | util (awake) | util (fleet) | energy kWh | cost | completed | "
        f"SLO misses | misses, {top} | {'wait p99 s | ' if waits else ''}preempted | migrated | "
        "parked |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if waits else ""),
    ]
    for s in doc["strategies"]:
        top_misses = s["classes"].get(top, {}).get("slo_misses", 0)
        p99 = max((c["wait_p99_s"] for c in s["classes"].values()), default=0.0)
        rows.append(
            f"| {s['strategy']} | {s['utilization_awake']:.1%} | {s['utilization_fleet']:.1%} | "
            f"{_kwh(s['energy_kwh'])} | {s['energy_cost']:,.2f} | {s['completed']:,} | "
            f"{s['slo_misses']:,} | {top_misses:,} | {f'{p99:,.0f} | ' if waits else ''}"
            f"{s['preemptions']:,} | {s['migrations']:,} | {s['parks']:,} |"
        )
    if not doc["targets"]:
        return "\n".join(rows) + "\n"
    targets = ["| target | value | goal | met |", "|---|---|---|---|"]
    for t in doc["targets"]:
        v = t["value"]
        shown = f"{v:.1%}" if isinstance(v, float) and abs(v) < 2 and v != int(v) else f"{v:g}"
        targets.append(f"| {t['name']} | {shown} | {t['goal']} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(rows) + "\n\n" + "\n".join(targets) + "\n"
