"""The field test's pure parts (the checker's set semantics, seeded schedules) and a real
run: the quick matrix in network namespaces as root (CI), one scenario through the fault
proxy otherwise and always (the non-root path)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import edgesched_binary
from hypothesis import given
from hypothesis import strategies as st

from edgesched.fieldtest.checker import FinalState, Submission, check
from edgesched.fieldtest.netns import available
from edgesched.fieldtest.scenarios import QUICK, SCENARIOS, schedule_for

NODES = ["gw-1", "gw-2", "gw-3"]


def final(**over: object) -> FinalState:
    base: dict[str, object] = {
        "node_hashes": {"gw-1": "h1"},
        "replica_hashes": {"gw-1": "h1"},
        "node_tasks": {"gw-1": {}},
        "replica_tasks": {"gw-1": {}},
        "central_tasks": {},
    }
    return FinalState(**{**base, **over})  # type: ignore[arg-type]


def test_a_clean_run_passes() -> None:
    history = [
        Submission(1.0, "a", "gw-1", True, while_cut=True),
        Submission(2.0, "c", "central", True),
        Submission(3.0, "x", "gw-1", False),  # timed out and never made it: fine
    ]
    record = {"state": "running", "decided_by": "edge-autonomous"}
    verdict = check(
        history,
        final(
            node_tasks={"gw-1": {"a": record, "c": {"state": "running", "decided_by": "central"}}},
            replica_tasks={"gw-1": {"a": record}},
            central_tasks={"c": {}},
        ),
    )
    assert verdict.ok, verdict.to_json()
    assert verdict.acknowledged == 2 and verdict.offline_decisions == 1


def test_each_violation_is_named() -> None:
    history = [
        Submission(1.0, "lost", "gw-1", True),
        Submission(2.0, "late", "gw-1", False),
        Submission(3.0, "svc", "central", True),
        Submission(4.0, "off", "gw-1", True, while_cut=True),
    ]
    running = {"state": "running", "decided_by": "central"}
    verdict = check(
        history,
        final(
            node_hashes={"gw-1": "h1", "gw-2": "h2"},
            replica_hashes={"gw-1": "h1", "gw-2": "stale"},
            node_tasks={
                "gw-1": {
                    "late": {"state": "running"},
                    "ghost": {"state": "running"},
                    "svc": running,
                    "off": {"state": "running", "decided_by": "edge-autonomous"},
                },
                "gw-2": {"svc": running},
            },
            replica_tasks={"gw-1": {}},
            central_tasks={"svc": {}},
        ),
    )
    assert not verdict.ok
    assert verdict.lost == ["lost"] and verdict.recovered == ["late"]
    assert verdict.unexpected == ["gw-1/ghost"]
    assert verdict.duplicates == {"svc": ["gw-1", "gw-2"]}
    assert verdict.diverged == ["gw-2"] and verdict.offline_missing == ["gw-1/off"]


@given(st.sampled_from(sorted(SCENARIOS)), st.integers(0, 10_000))
def test_schedules_are_seeded_and_end_healed(name: str, seed: int) -> None:
    first = schedule_for(name, seed, NODES)
    assert first == schedule_for(name, seed, NODES)  # replayable
    assert [f.at for f in first] == sorted(f.at for f in first)
    if not SCENARIOS[name].soak:
        assert all(f.at < SCENARIOS[name].duration_s for f in first)
    broken: set[str] = set()
    for fault in first:
        if fault.action in ("isolate", "drop-in", "drop-out", "stop", "kill"):
            broken.add(fault.target)
        elif fault.action in ("heal", "cont", "restart"):
            broken.discard(fault.target)
    # a kill is healed by its restart; a cut by its heal: nothing is left broken
    assert not broken, (name, seed, first)


def _matrix(args: list[str], workdir: Path) -> list[dict[str, object]]:
    out = subprocess.run(
        [edgesched_binary(), "fieldtest", *args, "--workdir", str(workdir)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    return list(json.loads(out.stdout)) if args[0] == "matrix" else []


@pytest.mark.skipif(available() is not None, reason=f"needs root: {available()}")
def test_the_quick_matrix_in_network_namespaces(tmp_path: Path) -> None:
    summary = _matrix(["matrix", "--backend", "netns"], tmp_path)
    assert [r["scenario"] for r in summary] == list(QUICK)
    for row in summary:
        assert row["ok"] and row["backend"] == "netns" and row["lost"] == 0, row
        assert row["duplicates"] == 0
        heal = row["max_heal_convergence_s"]
        if row["scenario"] != "broker-restart-persistent":  # the one without a link heal
            assert isinstance(heal, float)  # measured; its size is in the report only
    report = json.loads((tmp_path / "isolate-node-1" / "report.json").read_text())
    assert report["verdict"]["offline_decisions"] > 0
    assert (tmp_path / "isolate-node-1" / "report.md").read_text().startswith("# Field test")


def test_one_scenario_through_the_fault_proxy(tmp_path: Path) -> None:
    _matrix(["run", "--scenario", "isolate-node", "--seed", "2", "--backend", "proxy"], tmp_path)
    report = json.loads((tmp_path / "isolate-node-2" / "report.json").read_text())
    assert report["ok"] and report["backend"] == "proxy"
    assert report["verdict"]["offline_decisions"] > 0 and not report["verdict"]["lost"]
