"""A field-test report for people: a Markdown page and a timeline picture of the run.

The JSON report (:func:`edgesched.fieldtest.runner.run_scenario`) is the record; this renders
it: the verdict, the faults and how long each heal took to converge, and a timeline of every
node's mode (connected, autonomous, unreachable) with the faults drawn over it. The picture
needs matplotlib (the ``plot`` extra); without it the page says so. :func:`matrix_markdown`
is the table of a whole matrix (the README's).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLOURS = {"connected": "#2e7d32", "autonomous": "#ef6c00", "unreachable": "#9e9e9e"}


def to_markdown(report: Mapping[str, Any], picture: str | None = None) -> str:
    verdict = report["verdict"]
    lines = [
        f"# Field test: {report['scenario']} (seed {report['seed']})",
        "",
        f"**{'PASS' if report['ok'] else 'FAIL'}** on the `{report['backend']}` backend "
        f"({report.get('links', '')}), nodes {', '.join(report['nodes'])}"
        f"{_sites(report)}.",
        "",
        "| check | result |",
        "|---|---|",
        f"| submissions acknowledged | {verdict['acknowledged']} of {report['submissions']} |",
        f"| decisions made offline | {verdict['offline_decisions']} |",
        f"| lost | {len(verdict['lost'])} {_list(verdict['lost'])} |",
        f"| unexpected | {len(verdict['unexpected'])} {_list(verdict['unexpected'])} |",
        f"| recovered (unacknowledged, present) | {len(verdict['recovered'])} |",
        f"| running on two nodes | {len(verdict['duplicates'])} {_list(list(verdict['duplicates']))} |",  # noqa: E501
        f"| replicas differing from their node | {_list(verdict['diverged']) or 'none'} |",
        f"| offline decisions missing at central | {_list(verdict['offline_missing']) or 'none'} |",
        f"| central's assignments not at their node | "
        f"{_list(verdict.get('undelivered', [])) or 'none'} |",
        f"| converged after the final heal | {_seconds(report['converged_after_heal_s'])} |",
        f"| slowest heal to converge | {_seconds(report.get('max_heal_convergence_s'))} |",
        f"| tasks running at a power loss / not brought back | "
        f"{verdict.get('rebooted_tasks', 0)} / {_list(verdict.get('not_brought_back', [])) or 0} |",
        f"| site: replicas restored inside a cut site / not in time | "
        f"{verdict.get('restored_in_site', 0)} / "
        f"{_list(verdict.get('not_restored_in_site', [])) or 0} |",
        f"| site: local submissions placed on a site peer | {verdict.get('moved_in_site', 0)} |",
        f"| site: coordinators (site: epoch → member) / two at one epoch | "
        f"{_coordinators(report.get('coordinators'))} / "
        f"{_list(verdict.get('coordinators_at_once', [])) or 'none'} |",
        f"| tidal window opened at | {report.get('tidal_window_opens_at_s', '-')} s |",
        f"| preemptions per node (while autonomous, for a tidal share) | "
        f"{_preempted(report.get('preemptions'))} |",
        "",
        "## Faults",
        "",
        "| at (s) | fault | target |",
        "|---|---|---|",
    ]
    lines += [f"| {f['done_at']:.2f} | {f['action']} | {f['target']} |" for f in report["faults"]]
    lines += ["", "## Heals", "", "| healed at (s) | target | converged after |", "|---|---|---|"]
    lines += [
        f"| {h['healed_at']:.2f} | {h['target']} | {_heal(h)} |" for h in report.get("heals", [])
    ]
    lines += _extras(report)
    lines += ["", "## Timeline", ""]
    lines.append(f"![timeline]({picture})" if picture else "(matplotlib not installed: no picture)")
    return "\n".join(lines) + "\n"


def _sites(report: Mapping[str, Any]) -> str:
    topo = report.get("topology") or {}
    if report.get("broker") == "nats":
        return ", on a 3-member NATS cluster (central on nats1, gw-i on nats(i mod 3 + 1))"
    if not topo.get("sites"):
        return ", all on central's broker"
    members: dict[str, list[str]] = {}
    for node, site in topo["site_of"].items():
        members.setdefault(site, []).append(node)
    return "; site brokers bridged to central's: " + "; ".join(
        f"{site} ({', '.join(nodes)})" for site, nodes in sorted(members.items())
    )


def _preempted(counts: Mapping[str, Mapping[str, int]] | None) -> str:
    return (
        ", ".join(
            f"{node} {c['total']} ({c['autonomous']}, {c['tidal']})"
            for node, c in sorted((counts or {}).items())
        )
        or "-"
    )


def _extras(report: Mapping[str, Any]) -> list[str]:
    """Reboots, clock skews and central's view of cut-off nodes, when the run had them."""
    lines: list[str] = []
    if report.get("reboots"):
        lines += [
            "", "## Power losses", "",
            "| node | booted at (s) | tasks running before | all back after | still cut off |",
            "|---|---|---|---|---|",
        ]  # fmt: skip
        for r in report["reboots"]:
            cut = "-" if r["still_cut"] is None else ("yes" if r["still_cut"] else "no")
            lines.append(
                f"| {r['node']} | {r['booted_at']:.2f} | {r['tasks']} "
                f"| {_seconds(r['seconds'])} | {cut} |"
            )
    if report.get("skew"):
        lines += [
            "", "## Clock skew", "",
            "| node | skew (s) | its records' offset, measured (s) "
            "| window opened for the fleet / the node at (s) |",
            "|---|---|---|---|",
        ]  # fmt: skip
        for node, v in sorted(report["skew"].items()):
            lines.append(
                f"| {node} | {v['skew_s']:+g} | {v['records_offset_s']} "
                f"| {v['window_opened_for_fleet_at_s']} / {v['window_opened_for_node_at_s']} |"
            )
    views = report.get("central_view") or []
    if views:
        lines += [
            "", "## What central called the cut-off nodes", "",
            "| cut | from–to (s) | central's states | noticed | long enough to notice |",
            "|---|---|---|---|---|",
        ]  # fmt: skip
        for v in views:
            states = "; ".join(f"{n}: {', '.join(s) or '-'}" for n, s in v["states"].items())
            noticed = "yes" if v["noticed"] else ("**no**" if v["expected"] else "no")
            expected = "yes" if v["expected"] else "no"
            lines.append(
                f"| {v['target']} | {v['from']:.1f}–{v['to']:.1f} | {states} "
                f"| {noticed} | {expected} |"
            )
    return lines


def matrix_markdown(reports: Sequence[Mapping[str, Any]]) -> str:
    """One row per run: what the README's field-test table shows."""
    lines = [
        "| scenario | seed | backend | sites | acknowledged | offline decisions | lost "
        "| duplicates | heal → byte-equal (s) | notes | pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        v = r["verdict"]
        heals = ", ".join(_heal(h, short=True) for h in r.get("heals", [])) or "(no heal)"
        backend = r["backend"] + (" + proxy" if "proxy on every node" in r.get("links", "") else "")
        backend += " (NATS x3)" if r.get("broker") == "nats" else ""
        lines.append(
            f"| {r['scenario']} | {r['seed']} | {backend} | {len(r['topology']['sites'])} "
            f"| {v['acknowledged']} | {v['offline_decisions']} | {len(v['lost'])} "
            f"| {len(v['duplicates'])} | {heals} | {_notes(r)} | "
            f"{'PASS' if r['ok'] else '**FAIL**'} |"
        )
    return "\n".join(lines) + "\n"


def _notes(r: Mapping[str, Any]) -> str:
    notes = []
    for b in r.get("reboots", []):
        back = "never" if b["seconds"] is None else f"{b['seconds']:.1f} s"
        notes.append(
            f"{b['tasks']} tasks back in {back}" + (" while cut" if b["still_cut"] else "")
        )
    for node, s in (r.get("skew") or {}).items():
        notes.append(f"{node} clock {s['skew_s']:+g} s")
    for restore in r.get("site_restores", []):
        took = restore.get("seconds")
        notes.append(
            f"{len(restore.get('restored') or {})} replicas of {restore.get('node')} back in "
            f"its site in {'-' if took is None else f'{took:.1f} s'}"
        )
    moved = r["verdict"].get("moved_in_site", 0)
    if moved:
        notes.append(f"{moved} submissions placed on a site peer")
    terms = sum(len(epochs) for epochs in (r.get("coordinators") or {}).values())
    if terms:
        notes.append(f"{terms} coordinator terms, one member each")
    views = r.get("central_view", [])
    missed = [v["target"] for v in views if v["expected"] and not v["noticed"]]
    if missed:
        notes.append(f"central never saw {', '.join(sorted(set(missed)))} cut off")
    counts = (r.get("preemptions") or {}).values()
    total = sum(c["total"] for c in counts)
    if total:
        autonomous = sum(c["autonomous"] for c in counts)
        tidal = sum(c["tidal"] for c in counts)
        notes.append(f"{total} preemptions ({autonomous} cut off, {tidal} tidal)")
    return "; ".join(notes)


def _heal(heal: Mapping[str, Any], *, short: bool = False) -> str:
    """A heal's time to converge, or that the link broke again first (flapping)."""
    if heal.get("interrupted") is not None:
        return f"cut again after {heal['interrupted']:.2f} s"
    if heal["seconds"] is None:
        return "never" if short else _seconds(None)
    return f"{heal['seconds']:.2f}" if short else _seconds(heal["seconds"])


def _list(items: Sequence[str]) -> str:
    return ", ".join(items[:10]) + (" …" if len(items) > 10 else "")


def _seconds(value: float | None) -> str:
    return "never (within the quiet period)" if value is None else f"{value:.2f} s"


def plot_timeline(report: Mapping[str, Any], path: Path) -> bool:
    """Draw every node's mode over time with the faults; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    samples = report["timeline"]
    nodes = list(report["nodes"])
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(nodes) + 1.6))
    for row, node in enumerate(nodes):
        for a, b in itertools.pairwise(samples):
            mode = a.get(node, "unreachable")
            ax.broken_barh(
                [(a["t"], b["t"] - a["t"])], (row - 0.35, 0.7),
                color=COLOURS.get(mode, "#9e9e9e"),
            )  # fmt: skip
    for fault in report["faults"]:
        ax.axvline(fault["done_at"], color="#c62828", lw=0.8, ls="--")
        ax.text(fault["done_at"], len(nodes) - 0.4, f"{fault['action']} {fault['target']}",
                rotation=90, fontsize=7, va="top", ha="right", color="#c62828")  # fmt: skip
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlabel("seconds since the workload started")
    ax.set_title(f"{report['scenario']} (seed {report['seed']}, {report['backend']})")
    handles = [Patch(color=c, label=mode) for mode, c in COLOURS.items()]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(report: Mapping[str, Any], workdir: Path) -> Path:
    """``report.md`` (and ``timeline.png``) in ``workdir``; returns the Markdown's path."""
    picture = "timeline.png" if plot_timeline(report, workdir / "timeline.png") else None
    page = workdir / "report.md"
    page.write_text(to_markdown(report, picture))
    return page


def _coordinators(seen: object) -> str:
    """``site-1: 1 gw-1, 2 gw-2`` from the report's ``coordinators`` (none: ``-``)."""
    if not isinstance(seen, dict) or not seen:
        return "-"
    return "; ".join(
        f"{site}: " + ", ".join(f"{e} {'+'.join(m)}" for e, m in epochs.items())
        for site, epochs in sorted(seen.items())
        if isinstance(epochs, dict)
    )
