"""A field-test report for people: a Markdown page and a timeline picture of the run.

The JSON report (:func:`edgesched.fieldtest.runner.run_scenario`) is the record; this renders
it: the verdict, the faults and how long each heal took to converge, and a timeline of every
node's mode (connected, autonomous, unreachable) with the faults drawn over it. The picture
needs matplotlib (the ``plot`` extra); without it the page says so.
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
        f"({'network namespaces, kernel link faults' if report['backend'] == 'netns' else 'TCP fault proxy'}), "  # noqa: E501
        f"nodes {', '.join(report['nodes'])}.",
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
        f"| converged after the final heal | {_seconds(report['converged_after_heal_s'])} |",
        f"| slowest heal to converge | {_seconds(report.get('max_heal_convergence_s'))} |",
        "",
        "## Faults",
        "",
        "| at (s) | fault | target |",
        "|---|---|---|",
    ]
    lines += [f"| {f['done_at']:.2f} | {f['action']} | {f['target']} |" for f in report["faults"]]
    lines += ["", "## Heals", "", "| healed at (s) | target | converged after |", "|---|---|---|"]
    lines += [
        f"| {h['healed_at']:.2f} | {h['target']} | {_seconds(h['seconds'])} |"
        for h in report.get("heals", [])
    ]
    lines += ["", "## Timeline", ""]
    lines.append(f"![timeline]({picture})" if picture else "(matplotlib not installed: no picture)")
    return "\n".join(lines) + "\n"


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
